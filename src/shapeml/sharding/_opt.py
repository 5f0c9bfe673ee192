"""Optimizer state placed by structure: the copies of the params inside an optax state are found
the way optax finds them (`optax.tree_map_params`), and placed like the params.

The rule, leaf by leaf (`docs/scaling.md`, "Optimizer state"):

1. A leaf of a copy of the params (Adam's `mu` and `nu`, momentum, Adafactor's `v_row`, `v_col`
   and `v`, `MultiSteps`' summed gradients, the moving average) is *paired* with the param at its
   place in that copy: by structure, never by name or shape.
2. A paired leaf shaped like its param takes the param's spec.
3. A paired leaf of another shape takes the spec the optimizer's own `init` gives it when the
   params carry their specs: `init` is traced abstractly (`jax.eval_shape`, nothing allocated)
   with the params typed by their specs on a copy of the mesh whose axes are Explicit, so JAX
   carries each spec through it. A statistic that reduces a param over an axis keeps the specs
   of the axes it keeps, by position: Adafactor's row statistics of a `[D F]` param on
   `(data, model)`, reduced over `F`, are `[D]` on `data`. An array `init` makes from a shape
   alone (Adafactor's `(1,)` placeholders) is replicated.
4. Every leaf that is not paired (step counts, scalars, the state of schedules and line searches)
   is replicated.

A transformation whose `init` cannot run on optax's placeholder pairs nothing; then every leaf
takes the spec of rule 3.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import equinox as eqx
import jax
import numpy as np
import optax
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .._grad import split_params
from .._validate import instance
from ..models import Model
from ..models._introspect import dotted_name
from ..optim import Optimizer
from ..optim._errors import OptimizerMismatchError
from ._rules import FieldPlan

__all__ = ["opt_shardings", "state_specs"]


@dataclasses.dataclass(frozen=True)
class _Paired:
    """What a state leaf was paired with: its param's plan, or None (not a copy of a param)."""

    plan: FieldPlan | None


def _masked(x: Any) -> bool:
    # optax.masked leaves a MaskedNode (no leaves) where a param is masked out
    return isinstance(x, optax.MaskedNode)


def _pairs(opt: Optimizer, plan_tree: Any) -> Any | None:
    """A tree like `opt.state` of `_Paired` (MaskedNodes kept), or None when the transformation's
    init cannot run on optax's placeholder (L-BFGS reads a param's dtype in its init)."""
    try:
        return optax.tree_map_params(
            opt.tx,
            lambda leaf, plan: leaf if _masked(leaf) else _Paired(plan),
            opt.state,
            plan_tree,
            transform_non_params=lambda _: _Paired(None),
            is_leaf=_masked,
        )
    except Exception:  # noqa: BLE001 - any user transformation's init: rule 3 decides instead
        return None


def _traced_specs(opt: Optimizer, params: Any, plan_tree: Any, sizes: dict) -> Any | None:
    """A tree like `opt.state` of the spec `opt.tx.init` gives each leaf from params typed by
    their specs (rule 3), or None for an init that explicit sharding rejects."""
    mesh = AbstractMesh(
        tuple(sizes.values()), tuple(sizes), axis_types=(AxisType.Explicit,) * len(sizes)
    )
    typed = jax.tree.map(
        lambda x, p: jax.ShapeDtypeStruct(
            np.shape(x), x.dtype, sharding=NamedSharding(mesh, p.spec)
        ),
        params,
        plan_tree,
    )
    try:
        with jax.sharding.use_abstract_mesh(mesh):
            state = jax.eval_shape(opt.tx.init, typed)
        specs = jax.tree.map(lambda s: P() if s.sharding is None else s.sharding.spec, state)
        # the same structure as the optimizer's state, or nothing is read from it
        return specs if jax.tree.structure(state) == jax.tree.structure(opt.state) else None
    except Exception:  # noqa: BLE001 - any user transformation's init: replicated instead
        return None


def state_specs(m: Model, opt: Optimizer, plans: dict[str, FieldPlan], sizes: dict) -> Any:
    """A tree like `opt.state` holding each leaf's `PartitionSpec`, by the module's rule.

    Args:
        m: the model `opt` updates.
        opt: its optimizer.
        plans: every field's plan by dotted name (`field_plans(m, rules)`).
        sizes: the mesh's axis sizes by name.
    """
    params, _ = split_params(m)
    plan_tree = jax.tree_util.tree_map_with_path(lambda path, _: plans[dotted_name(path)], params)
    replicated = jax.tree.map(lambda _: P(), opt.state)
    pairs = _pairs(opt, plan_tree)
    if pairs is None:  # nothing paired: rule 3 for every leaf
        traced = _traced_specs(opt, params, plan_tree, sizes)
        return replicated if traced is None else traced

    def is_pair(x: Any) -> bool:
        return isinstance(x, _Paired)

    reshaped = jax.tree.map(
        lambda pair, leaf: pair.plan is not None and np.shape(leaf) != pair.plan.shape,
        pairs,
        opt.state,
        is_leaf=is_pair,
    )
    reshaped = any(jax.tree.leaves(reshaped))
    traced = _traced_specs(opt, params, plan_tree, sizes) if reshaped else None
    if traced is None:
        traced = replicated

    def one(pair: _Paired, leaf: Any, spec: P) -> P:
        if pair.plan is None:
            return P()  # rule 4
        if np.shape(leaf) == pair.plan.shape:
            return pair.plan.spec  # rule 2
        return spec  # rule 3

    return jax.tree.map(one, pairs, opt.state, traced, is_leaf=is_pair)


def opt_shardings(m: Model, opt: Any, plans: dict[str, FieldPlan], mesh: Mesh) -> Any:
    """A pytree like `opt` holding each leaf's `NamedSharding`: its state by `state_specs`, its
    step count replicated.

    Raises:
        ArgumentTypeError: (E0003) for an `opt` that is not an `optim.Optimizer`.
        OptimizerMismatchError: (E1201) for an optimizer of another model class.
    """
    instance("opt", opt, Optimizer, "the model's optimizer, e.g. optim.adamw(m, lr=3e-3)")
    if opt.model_class is not type(m):
        raise OptimizerMismatchError(
            f"`{type(opt).__name__}` updates a `{opt.model_class.__name__}`, but its placement "
            f"was asked for a `{type(m).__name__}`",
            fix="pass the model the optimizer was built from",
        )
    specs = state_specs(m, opt, plans, dict(mesh.shape))
    state = jax.tree.map(lambda s: NamedSharding(mesh, s), specs)
    return eqx.tree_at(lambda o: (o.state, o.step), opt, (state, NamedSharding(mesh, P())))
