"""The conveniences: `sgd`, `adamw`, `adam`, `lion`, `adafactor`, `rmsprop`, one optax call each.

Each checks its hyperparameters (a NaN or negative learning rate, `b1=1.5`, `eps=-1` are refused
with a coded error), builds the optax transformation (user transforms first, then optax's own
optimizer, weight decay masked by the model's `sm.param(decay=...)` declarations) and hands it to
`make`, with the options every optimizer takes. Their settings are stored in checkpoints, so they
restore without a template.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable, Sequence
from typing import Any

import optax

from .._traceback import api_boundary
from .._validate import instance, real
from ..models import Model
from ._from_optax import make
from ._masks import Mask, decay_mask
from ._optimizer import BUILDERS, SGD, AdamW, Optimizer
from ._schedules import Schedule, _Constant, as_schedule
from ._transforms import as_optax

__all__ = ["adafactor", "adam", "adamw", "lion", "rmsprop", "sgd"]


def _all_decay(cls: type[Model]) -> bool:
    """Whether every param of `cls` (and of its sub-models) is declared with decay=True."""
    for spec in cls.__shapeml_fields__.values():
        if spec.kind == "param" and not spec.decay:
            return False
        if spec.kind in ("submodel", "submodels") and not _all_decay(spec.model):
            return False
    return True


def _optax_lr(lr: Any) -> Any:
    if isinstance(lr, _Constant):
        return lr.value  # a plain number: optax scales without a schedule's step count
    return lr.optax() if isinstance(lr, Schedule) else lr


@dataclasses.dataclass(frozen=True)
class _Convenience:
    family: type[Optimizer]
    rule: Callable[..., optax.GradientTransformation]

    def base(self, settings: tuple, model_class: type) -> optax.GradientTransformation:
        try:
            return _cached_base(self, settings, model_class)
        except TypeError:  # an unhashable setting (a user's function that is not): no caching
            return _build_base(self, settings, model_class)


@functools.lru_cache(maxsize=256)
def _cached_base(conv: _Convenience, settings: tuple, model_class: type):
    return _build_base(conv, settings, model_class)


def _build_base(conv: _Convenience, settings: tuple, model_class: type):
    s = dict(settings)
    s["lr"] = _optax_lr(s["lr"])
    transforms = [as_optax(t) for t in s.pop("transforms")]
    if "mask" in s and s["mask"] is None:  # the declarations decide; all decay: no mask at all
        s["mask"] = None if _all_decay(model_class) else decay_mask()
    rule = conv.rule(**s)
    return optax.chain(*transforms, rule) if transforms else rule


def _build(kind: str, m: Any, settings: dict, options: tuple) -> Optimizer:
    conv = BUILDERS[kind]
    instance("m", m, Model, "the sm.Model the optimizer will update")
    transforms = tuple(settings["transforms"])
    for t in transforms:
        as_optax(t)  # refuses a non-transform now, not at the first step
    settings = tuple({**settings, "transforms": transforms}.items())
    return make(conv.family, kind, m, conv.base(settings, type(m)), settings, *options)


def _lr(lr: Any) -> Any:
    return lr if callable(lr) and not isinstance(lr, Schedule) else as_schedule(lr)


def _unit(name: str, v: Any) -> float:
    return real(name, v, low=0.0, high=1.0, high_open=True)


def _nonneg(name: str, v: Any) -> float:
    return real(name, v, low=0.0)


def _mask(v: Any) -> Any:
    if v is None or isinstance(v, Mask):
        return v
    if callable(v):
        return v
    return instance("mask", v, Mask, "a mask: optim.mask('pattern'), optim.decay_mask() or None")


def _flag(name: str, v: Any) -> bool:
    return instance(name, v, bool, "True or False")


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def sgd(
    m: Model,
    lr: Schedule | float | Callable,
    momentum: float = 0.0,
    nesterov: bool = False,
    weight_decay: float = 0.0,
    *,
    mask: Mask | None = None,
    transforms: Sequence[Any] = (),
    skip_nonfinite: bool = True,
    accumulate: int = 1,
    ema: float | None = None,
) -> SGD:
    """SGD for `m`'s params (optax.sgd): an `optim.SGD[type(m)]`.

    Args:
        m: the model it will update.
        lr: a number >= 0, a schedule (`optim.warmup(20, optim.cosine(3e-3, steps))`) or an optax
            schedule.
        momentum, nesterov: heavy-ball momentum in [0, 1) (optax.trace), Nesterov's if asked.
        weight_decay: adds `weight_decay * p` to the gradient of each param `mask` selects
            (default: those declared `sm.param(..., decay=True)`, the default); never to buffers.
        mask: which params decay: `optim.mask("w*")`, `optim.decay_mask() & ~optim.mask(...)`.
        transforms: gradient transforms applied first, in order (`[optim.clip_norm(1.0)]`, any
            optax transformation, or a function `Grad -> Grad`).
        skip_nonfinite, accumulate, ema: the options of `optim.from_optax`: skip (and count) a
            non-finite gradient (default True), average N gradients per update, keep a moving
            average of the weights.

    Raises:
        ArgumentError, ArgumentTypeError: (E0002, E0003) for a hyperparameter out of range (a
            negative or NaN learning rate, momentum 1.5), or of the wrong type.
    """
    settings = {
        "lr": _lr(lr),
        "momentum": _unit("momentum", momentum),
        "nesterov": _flag("nesterov", nesterov),
        "weight_decay": _nonneg("weight_decay", weight_decay),
        "mask": _mask(mask),
        "transforms": transforms,
    }
    return _build("sgd", m, settings, (skip_nonfinite, accumulate, ema))


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def adamw(
    m: Model,
    lr: Schedule | float | Callable,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.01,
    *,
    mask: Mask | None = None,
    transforms: Sequence[Any] = (),
    skip_nonfinite: bool = True,
    accumulate: int = 1,
    ema: float | None = None,
) -> AdamW:
    """AdamW for `m`'s params (optax.adamw): an `optim.AdamW[type(m)]`.

    `b1`, `b2` in [0, 1), `eps` >= 0; weight decay applies to the params `mask` selects (default:
    those not declared `sm.param(..., decay=False)`), never to buffers. Other arguments as `sgd`.

    Example:
        >>> opt = optim.adamw(m, lr=optim.warmup(20, optim.cosine(3e-3, steps)))
    """
    settings = {
        "lr": _lr(lr),
        "b1": _unit("b1", b1),
        "b2": _unit("b2", b2),
        "eps": _nonneg("eps", eps),
        "weight_decay": _nonneg("weight_decay", weight_decay),
        "mask": _mask(mask),
        "transforms": transforms,
    }
    return _build("adamw", m, settings, (skip_nonfinite, accumulate, ema))


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def adam(
    m: Model,
    lr: Schedule | float | Callable,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    *,
    transforms: Sequence[Any] = (),
    skip_nonfinite: bool = True,
    accumulate: int = 1,
    ema: float | None = None,
) -> Optimizer:
    """Adam for `m`'s params (optax.adam), no weight decay. Arguments as `adamw`."""
    settings = {
        "lr": _lr(lr),
        "b1": _unit("b1", b1),
        "b2": _unit("b2", b2),
        "eps": _nonneg("eps", eps),
        "transforms": transforms,
    }
    return _build("adam", m, settings, (skip_nonfinite, accumulate, ema))


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def lion(
    m: Model,
    lr: Schedule | float | Callable,
    b1: float = 0.9,
    b2: float = 0.99,
    weight_decay: float = 1e-3,
    *,
    mask: Mask | None = None,
    transforms: Sequence[Any] = (),
    skip_nonfinite: bool = True,
    accumulate: int = 1,
    ema: float | None = None,
) -> Optimizer:
    """Lion for `m`'s params (optax.lion): sign updates, usually with a 3-10x smaller `lr` than
    AdamW. Weight decay follows `mask` as in `adamw`; other arguments as `sgd`."""
    settings = {
        "lr": _lr(lr),
        "b1": _unit("b1", b1),
        "b2": _unit("b2", b2),
        "weight_decay": _nonneg("weight_decay", weight_decay),
        "mask": _mask(mask),
        "transforms": transforms,
    }
    return _build("lion", m, settings, (skip_nonfinite, accumulate, ema))


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def adafactor(
    m: Model,
    lr: Schedule | float | Callable,
    decay_rate: float = 0.8,
    clipping_threshold: float = 1.0,
    weight_decay: float = 0.0,
    *,
    mask: Mask | None = None,
    transforms: Sequence[Any] = (),
    skip_nonfinite: bool = True,
    accumulate: int = 1,
    ema: float | None = None,
) -> Optimizer:
    """Adafactor for `m`'s params (optax.adafactor): factored second moments, little memory.

    `decay_rate` in [0, 1), `clipping_threshold` > 0; weight decay (optax's `weight_decay_rate`)
    follows `mask` as in `adamw`. Other arguments as `sgd`."""
    settings = {
        "lr": _lr(lr),
        "decay_rate": _unit("decay_rate", decay_rate),
        "clipping_threshold": real(
            "clipping_threshold", clipping_threshold, low=0.0, low_open=True
        ),
        "weight_decay": _nonneg("weight_decay", weight_decay),
        "mask": _mask(mask),
        "transforms": transforms,
    }
    return _build("adafactor", m, settings, (skip_nonfinite, accumulate, ema))


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def rmsprop(
    m: Model,
    lr: Schedule | float | Callable,
    decay: float = 0.9,
    eps: float = 1e-8,
    momentum: float = 0.0,
    nesterov: bool = False,
    centered: bool = False,
    *,
    transforms: Sequence[Any] = (),
    skip_nonfinite: bool = True,
    accumulate: int = 1,
    ema: float | None = None,
) -> Optimizer:
    """RMSProp for `m`'s params (optax.rmsprop). `decay`, `momentum` in [0, 1), `eps` >= 0."""
    settings = {
        "lr": _lr(lr),
        "decay": _unit("decay", decay),
        "eps": _nonneg("eps", eps),
        "momentum": _unit("momentum", momentum),
        "nesterov": _flag("nesterov", nesterov),
        "centered": _flag("centered", centered),
        "transforms": transforms,
    }
    return _build("rmsprop", m, settings, (skip_nonfinite, accumulate, ema))


def _sgd_rule(lr, momentum, nesterov, weight_decay, mask):
    step = optax.sgd(lr, momentum=momentum or None, nesterov=nesterov)
    if not weight_decay:
        return step
    return optax.chain(optax.add_decayed_weights(weight_decay, mask=mask), step)


BUILDERS.update(
    sgd=_Convenience(SGD, _sgd_rule),
    adamw=_Convenience(
        AdamW,
        lambda lr, b1, b2, eps, weight_decay, mask: optax.adamw(
            lr, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=mask
        ),
    ),
    adam=_Convenience(Optimizer, lambda lr, b1, b2, eps: optax.adam(lr, b1=b1, b2=b2, eps=eps)),
    lion=_Convenience(
        Optimizer,
        lambda lr, b1, b2, weight_decay, mask: optax.lion(
            lr, b1=b1, b2=b2, weight_decay=weight_decay, mask=mask
        ),
    ),
    adafactor=_Convenience(
        Optimizer,
        lambda lr, decay_rate, clipping_threshold, weight_decay, mask: optax.adafactor(
            lr,
            decay_rate=decay_rate,
            clipping_threshold=clipping_threshold,
            weight_decay_rate=weight_decay or None,
            weight_decay_mask=mask,
        ),
    ),
    rmsprop=_Convenience(
        Optimizer,
        lambda lr, decay, eps, momentum, nesterov, centered: optax.rmsprop(
            lr,
            decay=decay,
            eps=eps,
            momentum=momentum or None,
            nesterov=nesterov,
            centered=centered,
        ),
    ),
)
# The public functions, by kind: what a checkpoint's description is rebuilt with.
PUBLIC = {"sgd": sgd, "adamw": adamw, "adam": adam, "lion": lion, "adafactor": adafactor}
PUBLIC["rmsprop"] = rmsprop
