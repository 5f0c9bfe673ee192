"""The typed optimizer (`Optimizer[Spotter]`, `AdamW[Spotter]`) and `update`.

An optimizer is an immutable pytree: the optax state of its transformation over exactly its model's
params (never its buffers) and one step count. `update(m, opt, g)` applies the transformation to the
gradient's tree and `optax.apply_updates`, and returns the new model and optimizer. The update rule
is any optax transformation (`from_optax`); `sgd`, `adamw`, ... are conveniences that build one.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

from .._errors import ArgumentTypeError
from .._grad import Grad, split_params
from .._traceback import api_boundary
from ..models import Model
from ..models._introspect import params as named_params
from ._compose import compose, split
from ._errors import (
    GradShapeError,
    ModelShapeError,
    OptimizerKindError,
    OptimizerMismatchError,
    OptionConflictError,
)
from ._masks import Mask
from ._schedules import Schedule
from ._transforms import _ClipNorm

__all__ = ["SGD", "AdamW", "Optimizer", "OptimizerMismatchError", "update"]

FORMAT = 2  # of `config()`; 1: shapeml before optimizers took any optax transformation
OPTIONS = ("skip_nonfinite", "accumulate", "ema")


class _OpaqueSettingError(Exception):
    """A setting JSON cannot describe (a user's function): the checkpoint needs `like=`."""


def _encode(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, Schedule):
        return {"schedule": value.config()}
    if isinstance(value, Mask):
        return {"mask": value.config()}
    if isinstance(value, tuple) and all(isinstance(t, _ClipNorm) for t in value):
        return {"transforms": [t.config() for t in value]}
    raise _OpaqueSettingError


# kind -> the convenience that builds it (filled by `_aliases`): how pickling and checkpoints
# rebuild an optimizer whose optax closures cannot be stored.
BUILDERS: dict[str, Any] = {}


@api_boundary
class Optimizer(eqx.Module):
    """A shapeml optimizer: optax state for a model's params, typed by the model class.

    Attributes:
        state: the optax state of `tx` over the params (a tree shaped like the model, buffers None).
        step: how many gradients were applied (skipped ones excluded).
        kind: "adamw", "sgd", ... for the conveniences, "optax" for `from_optax`.
        base: the optax transformation of the update rule, before the options below.
        settings: the convenience's arguments as (name, value) pairs (what checkpoints store).
        skip_nonfinite, accumulate, ema: the options (see `from_optax`).
    """

    state: Any
    step: jax.Array
    kind: str = eqx.field(static=True)
    base: Any = eqx.field(static=True)
    settings: tuple = eqx.field(static=True)
    skip_nonfinite: bool = eqx.field(static=True)
    accumulate: int = eqx.field(static=True)
    ema: float | None = eqx.field(static=True)
    shapes: tuple = eqx.field(static=True)
    model_class: ClassVar[type | None] = None

    @classmethod
    @functools.cache
    def for_model(cls, model_class: type):
        if not (isinstance(model_class, type) and issubclass(model_class, Model)):
            raise ArgumentTypeError(
                f"{cls.__name__}[...] takes an sm.Model class, got {model_class!r}"
            )
        # `AdamW[Spotter]` is also an `Optimizer[Spotter]`: typed by its model whatever its kind.
        bases = (cls,) if cls is Optimizer else (cls, Optimizer.for_model(model_class))
        return type(
            f"{cls.__name__}[{model_class.__name__}]",
            bases,
            {"model_class": model_class, "__module__": cls.__module__},
        )

    def __class_getitem__(cls, model_class: type):
        return cls.for_model(model_class)

    def __reduce__(self):  # the typed class is made on demand, and optax's closures do not pickle
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if self.kind in BUILDERS:
            fields["base"] = None  # rebuilt from kind and settings
        return (_rebuild, (_family(type(self)), self.model_class, fields))

    @property
    def tx(self) -> optax.GradientTransformationExtraArgs:
        """The whole optax transformation: the update rule wrapped by the options."""
        return compose(self.base, self.skip_nonfinite, self.accumulate, self.ema)

    @property
    def skipped(self) -> jax.Array:
        """How many steps were skipped for a non-finite gradient (0 without `skip_nonfinite`)."""
        if not self.skip_nonfinite:
            return jnp.zeros((), jnp.int32)
        return self.state.total_notfinite

    @property
    def lr(self):
        """The learning rate or schedule a convenience was built with (None for `from_optax`)."""
        return dict(self.settings).get("lr")

    @property
    def transforms(self) -> tuple:
        """The gradient transforms a convenience was built with (`transforms=[...]`)."""
        return dict(self.settings).get("transforms", ())

    def config(self) -> dict[str, Any]:
        """A JSON-able description that rebuilds this optimizer (what checkpoints store);
        `rebuildable: false` when only a `like=` template can restore it."""
        out: dict[str, Any] = {"format": FORMAT, "kind": self.kind}
        out.update({k: getattr(self, k) for k in OPTIONS})
        if self.kind not in BUILDERS:
            return {**out, "rebuildable": False}
        try:
            return {**out, "settings": {k: _encode(v) for k, v in self.settings}}
        except _OpaqueSettingError:
            return {**out, "rebuildable": False}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.settings if k != "transforms" or v)
        opts = [f"skip_nonfinite={self.skip_nonfinite}"]
        if self.accumulate > 1:
            opts.append(f"accumulate={self.accumulate}")
        if self.ema is not None:
            opts.append(f"ema={self.ema}")
        head = f"{type(self).__name__}({args or repr(self.base)}, {', '.join(opts)}"
        return f"{head}, step={self.step}, skipped={self.skipped})"


def _family(cls: type) -> type:
    """The untyped class (`AdamW` for `AdamW[Spotter]`)."""
    return cls.__mro__[1] if cls.model_class is not None else cls


def _rebuild(family: type[Optimizer], model_class: type, fields: dict) -> Optimizer:
    if fields["base"] is None:
        fields["base"] = BUILDERS[fields["kind"]].base(fields["settings"], model_class)
    return family[model_class](**fields)


@api_boundary
class SGD(Optimizer):
    """Stochastic gradient descent (optax.sgd), optionally with (Nesterov) momentum, weight decay."""


@api_boundary
class AdamW(Optimizer):
    """Adam with decoupled weight decay (optax.adamw)."""


def shapes_of(m: Model) -> tuple:
    return tuple((k, tuple(v.shape), str(v.dtype)) for k, v in named_params(m).items())


def _check(m: Any, opt: Any, g: Any) -> None:  # any input: it is the validator
    if not isinstance(opt, Optimizer):
        raise OptimizerKindError(
            f"update(m, opt, g) needs a shapeml optimizer as `opt`, got {type(opt).__name__}",
            fix="build one with optim.adamw(m, lr=...), or optim.from_optax(m, tx) for any optax tx",
        )
    if type(m) is not opt.model_class:
        raise OptimizerMismatchError(
            f"`{type(opt).__name__}` updates a `{opt.model_class.__name__}`, but was given a "
            f"`{type(m).__name__}`",
            fix=f"build the optimizer from the model it updates: opt = optim.{opt.kind}(m, ...)",
        )
    if not isinstance(g, Grad) or g.model_class is not type(m):
        got = type(g).__name__
        raise GradShapeError(
            f"update(m, opt, g) needs a Grad[{type(m).__name__}], got {got}",
            fix="compute it with sm.value_and_grad(loss, m, ...)",
        )
    model_shapes = shapes_of(m)
    if model_shapes != opt.shapes:
        raise ModelShapeError(
            f"`{type(m).__name__}`'s params changed since `{type(opt).__name__}` was built: "
            + _diff(opt.shapes, model_shapes, "optimizer", "model"),
            fix=f"build a new optimizer for this model: opt = optim.{opt.kind}(m, ...)",
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


@api_boundary
@typing.no_type_check  # validates its arguments itself, with E12xx errors
def update(m: Model, opt: Optimizer, g: Grad):
    """One optimizer step: returns `(new_model, new_opt)`.

    Runs `opt.tx.update` on the gradient's tree (params only) and `optax.apply_updates`; buffers
    are never seen by the transformation and never change. With `skip_nonfinite` (the default), a
    gradient holding a NaN or inf changes no weight and no state, and counts in `opt.skipped`.

    Raises:
        OptimizerMismatchError, OptimizerKindError, GradShapeError, ModelShapeError: (E1201-E1204)
            naming what differs; checked when traced, never per compiled step.
    """
    _check(m, opt, g)
    params, rest = split_params(m)
    updates, state = opt.tx.update(g.tree, opt.state, params)
    new_params = optax.apply_updates(params, updates)
    took = state.last_finite.astype(jnp.int32) if opt.skip_nonfinite else 1  # skipped: 0
    new_opt = eqx.tree_at(lambda o: (o.state, o.step), opt, (state, opt.step + took))
    return eqx.combine(new_params, rest), new_opt


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def averaged(m: Model, opt: Optimizer) -> Model:
    """The moving average of `m`'s params that `opt` keeps (built with `ema=DECAY`), with `m`'s
    buffers: a model of the same class, e.g. to evaluate or save.

    Example:
        >>> opt = optim.adamw(m, lr=3e-3, ema=0.999)
        >>> ...  # train
        >>> sm.save("spotter-ema.safetensors", optim.averaged(m, opt))

    Raises:
        OptionConflictError: (E1207) if `opt` keeps no average.
        OptimizerMismatchError: (E1201) if `opt` is for another model class.
    """
    if not isinstance(opt, Optimizer):
        raise OptimizerKindError(
            f"averaged(m, opt) needs a shapeml optimizer, got {type(opt).__name__}",
            fix="build it with ema=: optim.adamw(m, lr=..., ema=0.999)",
        )
    if type(m) is not opt.model_class:
        raise OptimizerMismatchError(
            f"`{type(opt).__name__}` averages a `{opt.model_class.__name__}`, but was given a "
            f"`{type(m).__name__}`",
            fix="pass the model the optimizer trains",
        )
    if opt.ema is None:
        raise OptionConflictError(
            f"`{type(opt).__name__}` keeps no moving average of the weights",
            fix=f"build it with ema=DECAY: optim.{opt.kind}(m, ..., ema=0.999)",
        )
    layers = split(opt.state, opt.skip_nonfinite, opt.accumulate, opt.ema)
    _, rest = split_params(m)
    return eqx.combine(layers.average.ema, rest)
