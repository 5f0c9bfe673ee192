"""Optimizers typed by their model (`AdamW[Spotter]`), built on optax, and `update`.

An optimizer is an immutable pytree holding optax state for exactly its model's params and one
step count; `update(m, opt, g)` returns the new model and optimizer. Learning rates are read from
that count, so there is no scheduler to step.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import typing
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from .._errors import ArgumentTypeError
from .._grad import Grad, split_params
from ..models import Model
from ..models._introspect import params as named_params
from ._errors import GradShapeError, ModelShapeError, OptimizerKindError, OptimizerMismatchError
from ._schedules import Schedule, as_schedule

__all__ = [
    "SGD",
    "AdamW",
    "Optimizer",
    "OptimizerMismatchError",
    "adamw",
    "sgd",
    "update",
]


class _Count(NamedTuple):
    count: jax.Array


def _count_updates() -> optax.GradientTransformation:
    """Counts applied updates: the optimizer's one step count where optax keeps none."""
    return optax.GradientTransformation(
        lambda params: _Count(jnp.zeros((), jnp.int32)),
        lambda updates, state, params=None: (
            updates,
            _Count(optax.safe_int32_increment(state.count)),
        ),
    )


class Optimizer(eqx.Module):
    """Base of shapeml optimizers: optax state for a model's params, typed by the model class."""

    state: Any
    skipped: jax.Array
    lr: Schedule = eqx.field(static=True)
    transforms: tuple = eqx.field(static=True)
    skip_nonfinite: bool = eqx.field(static=True)
    hyper: tuple = eqx.field(static=True)
    shapes: tuple = eqx.field(static=True)
    model_class: ClassVar[type | None] = None
    kind: ClassVar[str] = "optimizer"

    @classmethod
    @functools.cache
    def for_model(cls, model_class: type):
        if not (isinstance(model_class, type) and issubclass(model_class, Model)):
            raise ArgumentTypeError(
                f"{cls.__name__}[...] takes an sm.Model class, got {model_class!r}"
            )
        return type(
            f"{cls.__name__}[{model_class.__name__}]",
            (cls,),
            {"model_class": model_class, "__module__": cls.__module__},
        )

    def __class_getitem__(cls, model_class: type):
        return cls.for_model(model_class)

    def __reduce__(self):  # the typed class is made on demand, so pickle rebuilds it
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return (_rebuild, (type(self).__mro__[1], self.model_class, fields))

    @property
    def step(self) -> jax.Array:
        """How many updates have been applied (skipped steps excluded): what schedules read."""
        return optax.tree_utils.tree_get(self.state, "count")

    def config(self) -> dict[str, Any]:
        """Everything needed to rebuild this optimizer for a model (see `load_checkpoint`)."""
        return {
            "kind": self.kind,
            **dict(self.hyper),
            "lr": self.lr.config(),
            "transforms": [t.config() for t in self.transforms],
            "skip_nonfinite": self.skip_nonfinite,
        }

    @abc.abstractmethod
    def tx(self) -> optax.GradientTransformation:
        """The optax transformation of this optimizer's update rule (before the learning rate)."""

    def __repr__(self) -> str:
        hyper = ", ".join(f"{k}={v}" for k, v in self.hyper)
        return f"{type(self).__name__}(lr={self.lr!r}, {hyper}, step={self.step}, skipped={self.skipped})"


def _rebuild(kind: type[Optimizer], model_class: type, fields: dict) -> Optimizer:
    return kind[model_class](**fields)


class SGD(Optimizer):
    """Stochastic gradient descent with optional (Nesterov) momentum and weight decay."""

    kind: ClassVar[str] = "sgd"

    def tx(self):
        h = dict(self.hyper)
        parts = []
        if h["weight_decay"]:
            parts.append(optax.add_decayed_weights(h["weight_decay"]))
        if h["momentum"]:
            parts.append(optax.trace(decay=h["momentum"], nesterov=h["nesterov"]))
        return optax.chain(*parts, _count_updates())


class AdamW(Optimizer):
    """Adam with decoupled weight decay (optax.adamw's math, its count the optimizer's step)."""

    kind: ClassVar[str] = "adamw"

    def tx(self):
        h = dict(self.hyper)
        return optax.chain(
            optax.scale_by_adam(b1=h["b1"], b2=h["b2"], eps=h["eps"]),
            optax.add_decayed_weights(h["weight_decay"]),
        )


def _build(cls, m: Model, lr, hyper: dict, transforms, skip_nonfinite: bool):
    if not isinstance(m, Model):
        raise ArgumentTypeError(
            f"{cls.kind}(m, ...) takes the sm.Model it will update, got {type(m).__name__}"
        )
    typed = cls[type(m)]
    shapes = tuple((k, tuple(v.shape), str(v.dtype)) for k, v in named_params(m).items())
    proto = typed(
        state=None,
        skipped=jnp.zeros((), jnp.int32),
        lr=as_schedule(lr),
        transforms=tuple(transforms),
        skip_nonfinite=skip_nonfinite,
        hyper=tuple(hyper.items()),
        shapes=shapes,
    )
    params, _ = split_params(m)
    return eqx.tree_at(
        lambda o: o.state, proto, proto.tx().init(params), is_leaf=lambda x: x is None
    )


def sgd(
    m: Model,
    lr: Schedule | float | int,
    momentum: float = 0.0,
    nesterov: bool = False,
    weight_decay: float = 0.0,
    *,
    transforms: Sequence[Callable] = (),
    skip_nonfinite: bool = False,
) -> SGD:
    """SGD state for `m`'s params: an `SGD[type(m)]`.

    Args:
        m: the model it will update.
        lr: a number or a schedule (`warmup(20, cosine(3e-3, steps))`).
        momentum, nesterov: heavy-ball momentum (optax.trace).
        weight_decay: adds `weight_decay * p` to each param's gradient (never to buffers).
        transforms: gradient transforms applied in order before the step (`[clip_norm(1.0)]`).
        skip_nonfinite: skip (and count in `opt.skipped`) a step whose gradient is not finite.
    """
    hyper = {
        "momentum": float(momentum),
        "nesterov": bool(nesterov),
        "weight_decay": float(weight_decay),
    }
    return _build(SGD, m, lr, hyper, transforms, skip_nonfinite)


def adamw(
    m: Model,
    lr: Schedule | float | int,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.01,
    *,
    transforms: Sequence[Callable] = (),
    skip_nonfinite: bool = False,
) -> AdamW:
    """AdamW state for `m`'s params: an `AdamW[type(m)]` (optax.adamw's math).

    Weight decay applies to params only; buffers are never updated.

    Example:
        >>> opt = optim.adamw(m, lr=optim.warmup(20, optim.cosine(3e-3, steps)))
    """
    hyper = {
        "b1": float(b1),
        "b2": float(b2),
        "eps": float(eps),
        "weight_decay": float(weight_decay),
    }
    return _build(AdamW, m, lr, hyper, transforms, skip_nonfinite)


def _check(m: Any, opt: Any, g: Any) -> None:  # any input: it is the validator
    if not isinstance(opt, Optimizer):
        raise OptimizerKindError(
            f"update(m, opt, g) needs a shapeml optimizer as `opt`, got {type(opt).__name__}",
            fix="build one with optim.sgd(m, lr=...) or optim.adamw(m, lr=...)",
        )
    if type(m) is not opt.model_class:
        raise OptimizerMismatchError(
            f"`{type(opt).__name__}` updates a `{opt.model_class.__name__}`, but was given a "
            f"`{type(m).__name__}`",
            fix=f"build the optimizer from the model it updates: opt = optim.{opt.kind}(m, lr=...)",
        )
    if not isinstance(g, Grad) or g.model_class is not type(m):
        got = type(g).__name__
        raise GradShapeError(
            f"update(m, opt, g) needs a Grad[{type(m).__name__}], got {got}",
            fix="compute it with sm.value_and_grad(loss, m, ...)",
        )
    model_shapes = tuple((k, tuple(v.shape), str(v.dtype)) for k, v in named_params(m).items())
    if model_shapes != opt.shapes:
        raise ModelShapeError(
            f"`{type(m).__name__}`'s params changed since `{type(opt).__name__}` was built: "
            + _diff(opt.shapes, model_shapes, "optimizer", "model"),
            fix=f"build a new optimizer for this model: opt = optim.{opt.kind}(m, lr=...)",
        )
    grad_shapes = tuple((k, tuple(v.shape), str(v.dtype)) for k, v in g.named().items())
    if grad_shapes != opt.shapes:
        raise GradShapeError(
            f"the gradient does not match `{type(opt).__name__}`'s params: "
            + _diff(opt.shapes, grad_shapes, "optimizer", "gradient"),
            fix="compute the gradient of the model being trained",
        )


def _diff(expected, got, a: str, b: str) -> str:
    e, g = {k: s for k, *s in expected}, {k: s for k, *s in got}
    parts = [f"`{k}` missing from the {b}" for k in e if k not in g]
    parts += [f"`{k}` not in the {a}" for k in g if k not in e]
    parts += [
        f"`{k}`: {a} [{' '.join(map(str, e[k][0]))}] {e[k][1]}, {b} "
        f"[{' '.join(map(str, g[k][0]))}] {g[k][1]}"
        for k in e
        if k in g and e[k] != g[k]
    ]
    return "; ".join(parts)


@typing.no_type_check  # validates its arguments itself, with E12xx errors
def update(m: Model, opt: Optimizer, g: Grad):
    """One optimizer step: returns `(new_model, new_opt)`.

    Applies the optimizer's transforms to `g`, then the optax update with the learning rate its
    schedule gives at `opt.step`. Buffers are never changed. With `skip_nonfinite`, a step whose
    gradient holds a NaN or inf leaves model and state as they were and counts in `opt.skipped`.

    Raises:
        OptimizerMismatchError, OptimizerKindError, GradShapeError, ModelShapeError: (E1201-E1204)
            naming what differs; checked when traced, never per compiled step.
    """
    _check(m, opt, g)
    for transform in opt.transforms:
        g = transform(g)
    params, rest = split_params(m)
    lr = opt.lr(opt.step)
    updates, state = opt.tx().update(g.tree, opt.state, params)
    updates = jax.tree.map(lambda u: -lr * u, updates)
    new_params = optax.apply_updates(params, updates)
    if opt.skip_nonfinite:
        finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(g.tree)]))
        new_params = jax.tree.map(lambda new, old: jnp.where(finite, new, old), new_params, params)
        state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), state, opt.state)
        skipped = opt.skipped + jnp.where(finite, 0, 1).astype(jnp.int32)
    else:
        skipped = opt.skipped
    new_opt = eqx.tree_at(lambda o: (o.state, o.skipped), opt, (state, skipped))
    return eqx.combine(new_params, rest), new_opt
