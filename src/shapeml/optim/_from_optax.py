"""`from_optax(m, tx)`: any optax transformation as a typed optimizer, and the options every
optimizer takes (`skip_nonfinite`, `accumulate`, `ema`)."""

from __future__ import annotations

import typing
from typing import Any

import jax.numpy as jnp
import optax

from .._grad import split_params
from .._traceback import api_boundary
from .._validate import instance, integer, real, shorten
from ..models import Model
from ._compose import Layers, compose, join, split
from ._errors import OptimizerMismatchError, OptionConflictError
from ._optimizer import Optimizer, _family, shapes_of

__all__ = ["check_options", "from_optax", "make", "reconfigure"]


def check_options(skip_nonfinite: Any, accumulate: Any, ema: Any) -> tuple[bool, int, Any]:
    """The options, checked: a bool, an int >= 1, None or a decay in [0, 1)."""
    instance("skip_nonfinite", skip_nonfinite, bool, "True or False")
    accumulate = integer("accumulate", accumulate, low=1, high=2**31 - 1)  # int32 counts
    if ema is not None:
        ema = real("ema", ema, low=0.0, high=1.0, high_open=True, fix="pass e.g. ema=0.999")
    return skip_nonfinite, accumulate, ema


def make(
    family: type[Optimizer],
    kind: str,
    m: Any,
    base: Any,
    settings: tuple,
    skip_nonfinite: Any,
    accumulate: Any,
    ema: Any,
) -> Optimizer:
    """A `family[type(m)]` with `base` as its update rule, its state initialized over m's params."""
    instance("m", m, Model, "the sm.Model the optimizer will update")
    skip, accumulate, ema = check_options(skip_nonfinite, accumulate, ema)
    params, _ = split_params(m)
    state = compose(base, skip, accumulate, ema).init(params)
    return family[type(m)](
        state=state,
        step=jnp.zeros((), jnp.int32),
        kind=kind,
        base=base,
        settings=settings,
        skip_nonfinite=skip,
        accumulate=accumulate,
        ema=ema,
        shapes=shapes_of(m),
    )


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def from_optax(
    m: Model,
    tx: optax.GradientTransformation | optax.MultiSteps,
    *,
    skip_nonfinite: bool = True,
    accumulate: int = 1,
    ema: float | None = None,
) -> Optimizer:
    """Any optax transformation as an optimizer typed by `m`'s class: an `Optimizer[type(m)]`.

    Its state is `tx.init` over `m`'s params only (a tree shaped like `m`, buffers None);
    `optim.update(m, opt, g)` runs `tx.update` on the gradient's tree and `optax.apply_updates`.

    Args:
        m: the model it will update.
        tx: an `optax.GradientTransformation` (`optax.lion(1e-4)`, an `optax.chain(...)`, ...) or an
            `optax.MultiSteps`.
        skip_nonfinite: wrap `tx` in `optax.apply_if_finite`, so a gradient holding a NaN or inf
            changes nothing and counts in `opt.skipped` (the default: a bad batch never poisons
            the weights).
        accumulate: average this many gradients before each update (`optax.MultiSteps`); `opt.step`
            still counts every gradient.
        ema: keep an exponential moving average of the weights with this decay (e.g. 0.999),
            started at `m`'s weights; `optim.averaged(m, opt)` gives it as a model.

    Example:
        >>> tx = optax.chain(optax.clip_by_global_norm(1.0), optax.lion(optax.cosine_decay_schedule(3e-4, 1000)))
        >>> opt = optim.from_optax(m, tx)            # an optim.Optimizer[Spotter]
        >>> m, opt = optim.update(m, opt, g)

    Raises:
        ArgumentTypeError, ArgumentError: (E0003, E0002) for a `tx` that is not an optax
            transformation, or a bad option.
    """
    if isinstance(tx, optax.MultiSteps):
        tx = tx.gradient_transformation()
    if not isinstance(tx, optax.GradientTransformation):
        instance("tx", tx, optax.GradientTransformation, f"an optax transformation ({shorten(tx)})")
    return make(Optimizer, "optax", m, tx, (), skip_nonfinite, accumulate, ema)


@typing.no_type_check  # validates its arguments itself, with coded errors
def reconfigure(
    m: Model, opt: Optimizer, *, accumulate: int | None = None, ema: float | None = None
) -> Optimizer:
    """`opt` with accumulation and/or a moving average added, its trained state kept.

    An option left None, or equal to the optimizer's, keeps it; one the optimizer already has
    with another value is a conflict (E1207).
    """
    if opt.model_class is not type(m):
        raise OptimizerMismatchError(
            f"`{type(opt).__name__}` is for a `{opt.model_class.__name__}`, not a "
            f"`{type(m).__name__}`",
            fix=f"build the optimizer from the model you train: optim.adamw({type(m).__name__}...)",
        )
    k = opt.accumulate if accumulate is None else integer("accumulate", accumulate, low=1)
    if ema is not None:
        ema = real("ema", ema, low=0.0, high=1.0, high_open=True, fix="pass e.g. ema=0.999")
    d = opt.ema if ema is None else ema
    for name, have, want in (("accumulate", opt.accumulate, k), ("ema", opt.ema, d)):
        default = 1 if name == "accumulate" else None
        if have != want and have != default:
            raise OptionConflictError(
                f"`{type(opt).__name__}` was built with {name}={have}, but {name}={want} was asked",
                fix=f"build the optimizer with {name}={want}, or do not pass {name} again",
            )
    if (k, d) == (opt.accumulate, opt.ema):
        return opt
    fresh = make(_family(type(opt)), opt.kind, m, opt.base, opt.settings, opt.skip_nonfinite, k, d)
    old = split(opt.state, opt.skip_nonfinite, opt.accumulate, opt.ema)
    new = split(fresh.state, fresh.skip_nonfinite, k, d)
    kept = Layers(
        skip=old.skip,
        accumulate=old.accumulate if opt.accumulate == k else new.accumulate,
        base=old.base,
        average=old.average if opt.ema == d else new.average,
    )
    state = join(kept, opt.skip_nonfinite, k, d)
    return type(fresh)(
        state=state,
        step=opt.step,
        kind=opt.kind,
        base=opt.base,
        settings=opt.settings,
        skip_nonfinite=opt.skip_nonfinite,
        accumulate=k,
        ema=d,
        shapes=opt.shapes,
    )
