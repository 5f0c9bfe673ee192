"""Placing a model, its optimizer state and its batches on a device mesh by a rule table.

`partition_specs` needs no mesh (for planning, `shard_map` and `jax.jit(in_shardings=...)` under a
mesh context); `shardings` and `shard` check the table against a mesh first; `partition_spec`
places one array whose axes are named by dims (a KV cache). Fields are paired with their plans by
dotted name, optimizer state with the params by structure (`_opt.py`), never by position.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .._errors import ArgumentError
from .._traceback import api_boundary
from .._validate import instance, shorten
from ..models import Model
from ..models._introspect import dotted_name, statics
from ..optim import Optimizer
from ._errors import AxisReusedError, IndivisibleDimError, UnknownMeshAxisError
from ._opt import opt_shardings
from ._rules import FieldPlan, Rules, check_mesh, plan
from ._table import rules_table

__all__ = [
    "StepShardings",
    "checked_plans",
    "field_plans",
    "partition_spec",
    "partition_specs",
    "place_batch",
    "shard",
    "shardings",
    "shardings_like",
    "step_shardings",
]


@api_boundary
def field_plans(
    m: Model, rules: Rules, sizes: Mapping[str, int] | None = None
) -> dict[str, FieldPlan]:
    """Every param and buffer of `m` by dotted name, with where the rules put it (`sizes`: the
    mesh's axis sizes, which the FSDP preset needs to choose its axes)."""
    instance("m", m, Model, "an sm.Model")
    return {p.name: p for p in plan(type(m), m.dims, rules, statics(m), sizes)}


def checked_plans(m: Model, mesh: Mesh, rules: Rules) -> dict[str, FieldPlan]:
    """`field_plans`, after checking the rules against `mesh` (E1902, E1903)."""
    instance("mesh", mesh, Mesh, "a jax.sharding.Mesh")
    plans = field_plans(m, rules, dict(mesh.shape))
    check_mesh(tuple(plans.values()), rules, mesh)
    return plans


@api_boundary
def partition_specs(m: Model, rules: Rules):
    """A pytree like `m` holding each field's `PartitionSpec`, placing nothing.

    Each axis of a field maps through `rules` by the dim that spells it (see `docs/scaling.md`);
    axes no rule names are replicated (None).

    Example:
        >>> sm.partition_specs(Spotter.init(seed=0), {"D": "data"}).w_h
        PartitionSpec('data', None)

    Raises:
        RuleTableError (E1905), UnknownRuleDimError (E1901), AxisReusedError (E1904).
    """
    plans = field_plans(m, rules)
    return jax.tree_util.tree_map_with_path(lambda path, _: plans[dotted_name(path)].spec, m)


@api_boundary
def shardings(m: Model, mesh: Mesh, rules: Rules):
    """A pytree like `m` holding each field's `NamedSharding` on `mesh` (for `jax.jit`).

    Raises:
        UnknownMeshAxisError (E1902), IndivisibleDimError (E1903), and the errors of
        `partition_specs`.
    """
    plans = checked_plans(m, mesh, rules)
    return jax.tree_util.tree_map_with_path(
        lambda path, _: NamedSharding(mesh, plans[dotted_name(path)].spec), m
    )


@api_boundary
def shard(m: Model, mesh: Mesh, rules: Rules) -> Model:
    """`m` with every field placed on `mesh` as `rules` say: each device holds only its block.

    `{}` replicates everything (data parallel); `{"D": "data"}` splits every field along `D`
    (FSDP); `{"F": "model"}` splits the FFN (tensor parallel). Under `jax.jit` it constrains the
    traced model's layout instead.

    Example:
        >>> mesh = jax.make_mesh((2, 2), ("data", "model"))
        >>> m = sm.shard(m, mesh, {"D": "data", "Dt": "model", "Dc": "model"})
    """
    return jax.device_put(m, shardings(m, mesh, rules))


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def partition_spec(axes: Sequence[str], rules: Rules) -> P:
    """The `PartitionSpec` of one array whose axes are named by dims, by the same rule table.

    Each axis takes the mesh axes of the rule for its name; an axis no rule names is replicated.
    Rules for dims the array does not have are ignored, so one table places a model and the
    arrays beside it: `{"H": "tp", "F": "tp"}` splits the int8 transformer by heads and FFN
    columns, and its KV cache (`KVCache.AXES`) by heads.

    Example:
        >>> sharding.partition_spec(KVCache.AXES, {"H": "tp", "F": "tp"})  # L B T H Dh
        PartitionSpec(None, None, None, 'tp', None)

    Raises:
        ArgumentError: (E0002) for axes that are not a sequence of dim names.
        RuleTableError: (E1905) for a malformed table.
        AxisReusedError: (E1904) when two axes would be split over one mesh axis.
    """
    if isinstance(axes, str) or not isinstance(axes, Sequence):
        raise ArgumentError(
            f"`axes` must be a sequence of dim names, got {shorten(axes)} ({type(axes).__name__})",
            fix='pass the array\'s axis names, e.g. ("L", "B", "T", "H", "Dh"); for a model use '
            "partition_specs(m, rules)",
        )
    for name in axes:
        if not (isinstance(name, str) and name.isidentifier()):
            raise ArgumentError(
                f"axis {shorten(name)} of {shorten(axes)} is not a dim name",
                fix='name each axis by a dim, e.g. ("B", "T", "H", "Dh")',
            )
    table = dict(rules_table(rules))
    split = [table.get(name, ()) for name in axes]
    seen: dict[str, str] = {}
    for name, mesh_axes in zip(axes, split, strict=True):
        for a in mesh_axes:
            if a in seen:
                raise AxisReusedError(
                    f"an array of axes [{' '.join(axes)}] would be split over mesh axis `{a}` "
                    f"along both `{seen[a]}` and `{name}`",
                    fix=f"map `{seen[a]}` or `{name}` to another mesh axis",
                )
            seen[a] = name
    return P(*(None if not a else a[0] if len(a) == 1 else a for a in split))


@api_boundary
def shardings_like(tree: Any, m: Model, mesh: Mesh, rules: Rules):
    """Shardings for `m`'s optimizer: a pytree like it, each leaf's `NamedSharding`.

    Its state is paired with the params by structure (`optax.tree_map_params`): a leaf of a copy
    of the params shaped like its param is placed like it, a reshaped one (Adafactor's row and
    column statistics) as the optimizer's own init places it from the params' specs, and every
    other leaf (step counts, scalars) is replicated; see `docs/scaling.md`. The same as
    `step_shardings(m, tree, mesh, rules).opt`.

    Raises:
        ArgumentTypeError: (E0003) for a tree that is not an `optim.Optimizer` (a model-shaped
            tree is placed by `shardings(m, mesh, rules)`).
        OptimizerMismatchError: (E1201) for an optimizer of another model class; and the errors
            of `shardings`.
    """
    instance(
        "tree",
        tree,
        Optimizer,
        "the model's optimizer (optim.adamw(m, ...)); a model-shaped tree is placed by "
        "sharding.shardings(m, mesh, rules)",
    )
    return opt_shardings(m, tree, checked_plans(m, mesh, rules), mesh)


@api_boundary
@dataclasses.dataclass(frozen=True)
class StepShardings:
    """The shardings of a training step: `jax.jit(step, in_shardings=(model, opt, batch...),
    out_shardings=(model, opt, replicated))`, so the layout never changes between steps."""

    model: Any  # a pytree like the model, of NamedSharding
    opt: Any  # a pytree like the optimizer, of NamedSharding
    batch: NamedSharding  # leading axis over the batch axis (replicated without one)
    replicated: NamedSharding


@api_boundary
def step_shardings(
    m: Model, opt: Any, mesh: Mesh, rules: Rules, batch_axis: str | None = "data"
) -> StepShardings:
    """The shardings of a training step's model, optimizer state and batch on `mesh`.

    Args:
        m: the model; its fields are placed by `rules`.
        opt: its optimizer (an `optim.Optimizer`), its state paired with the params by structure:
            see `shardings_like`.
        mesh: the device mesh.
        rules: dim name -> mesh axis (or tuple of axes, or None).
        batch_axis: the mesh axis the batch's leading dim is split over; None replicates it.

    Raises:
        UnknownMeshAxisError: (E1902) for a batch axis the mesh does not have; and the errors of
            `shardings`.
    """
    instance("mesh", mesh, Mesh, "a jax.sharding.Mesh")
    _check_axis(batch_axis, mesh)
    return StepShardings(
        model=shardings(m, mesh, rules),
        opt=shardings_like(opt, m, mesh, rules),
        batch=NamedSharding(mesh, P(batch_axis)),
        replicated=NamedSharding(mesh, P()),
    )


def _check_axis(axis: str | None, mesh: Mesh) -> None:
    if axis is not None and axis not in mesh.shape:
        raise UnknownMeshAxisError(
            f"the batch axis `{axis}` is not an axis of the mesh "
            f"({', '.join(f'{k}={v}' for k, v in mesh.shape.items())})",
            fix="pass the mesh's data axis as batch_axis, or batch_axis=None to replicate "
            "the batch",
        )


@api_boundary
def place_batch(batch: Any, mesh: Mesh, batch_axis: str | None = "data"):
    """Every array of `batch` (a pytree) split along its leading dim over `batch_axis`.

    Raises:
        UnknownMeshAxisError: (E1902) for an axis the mesh does not have.
        IndivisibleDimError: (E1903) for a batch size that is not a multiple of the axis size.
    """
    instance("mesh", mesh, Mesh, "a jax.sharding.Mesh")
    _check_axis(batch_axis, mesh)
    parts = mesh.shape[batch_axis] if batch_axis is not None else 1

    def one(path, x):
        if np.ndim(x) == 0:
            return jax.device_put(x, NamedSharding(mesh, P()))
        if np.shape(x)[0] % parts:
            raise IndivisibleDimError(
                f"batch entry `{dotted_name(path) or 'batch'}` has {np.shape(x)[0]} rows, which "
                f"do not split evenly over `{batch_axis}`={parts}",
                fix=f"use a batch size that is a multiple of {parts}",
            )
        return jax.device_put(x, NamedSharding(mesh, P(batch_axis)))

    return jax.tree_util.tree_map_with_path(one, batch)
