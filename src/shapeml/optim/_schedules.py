"""Learning-rate schedules: functions of the step count, built on optax's schedules.

Each is a small frozen dataclass, so it prints as written, composes (`warmup(20, cosine(...))`),
plots (`schedule(jnp.arange(n))`) and round-trips through checkpoint metadata.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import inspect
import typing
from typing import Any

import jax.numpy as jnp
import optax

from .._errors import ArgumentError, ArgumentTypeError
from .._traceback import api_boundary
from .._validate import integer, real, shorten

__all__ = ["Schedule", "constant", "cosine", "from_config", "warmup"]


@api_boundary
class Schedule(abc.ABC):
    """A learning rate as a function of the step count `t` (an int or an int array)."""

    @abc.abstractmethod
    def optax(self) -> optax.Schedule:
        """The same schedule as an optax schedule."""

    @abc.abstractmethod
    def config(self) -> dict[str, Any]:
        """A JSON-able description that `from_config` turns back into the schedule."""

    def __call__(self, t):
        return self.optax()(jnp.asarray(t))


@dataclasses.dataclass(frozen=True)
class _Constant(Schedule):
    value: float

    def optax(self):
        return optax.constant_schedule(self.value)

    def __call__(self, t):  # shaped like `t`, as the other schedules are
        return jnp.full(jnp.shape(t), self.value, jnp.float32)

    def config(self):
        return {"kind": "constant", "value": self.value}

    def __repr__(self):
        return f"constant({self.value})"


@dataclasses.dataclass(frozen=True)
class _Cosine(Schedule):
    peak: float
    steps: int
    floor: float = 0.0

    def optax(self):
        # floor + (peak - floor) * 0.5 * (1 + cos(pi * min(t, steps) / steps)): optax's
        # peak * ((1 - alpha) * cosine + alpha) with alpha = floor / peak
        alpha = self.floor / self.peak if self.peak else 0.0
        return optax.cosine_decay_schedule(self.peak, self.steps, alpha=alpha)

    def config(self):
        return {"kind": "cosine", "peak": self.peak, "steps": self.steps, "floor": self.floor}

    def __repr__(self):
        floor = f", floor={self.floor}" if self.floor else ""
        return f"cosine({self.peak}, {self.steps}{floor})"


@dataclasses.dataclass(frozen=True)
class _Warmup(Schedule):
    steps: int
    then: Schedule
    offset: int = 0

    def optax(self):
        # then(0) * (t + offset) / n for t < n, then then(t - n)
        peak, n = self.then(0), self.steps
        rise = optax.linear_schedule(peak * self.offset / n, peak * (n + self.offset) / n, n)
        return optax.join_schedules([rise, self.then.optax()], [n])

    def config(self):
        cfg = {"kind": "warmup", "steps": self.steps, "then": self.then.config()}
        return {**cfg, "offset": self.offset} if self.offset else cfg

    def __repr__(self):
        offset = f", offset={self.offset}" if self.offset else ""
        return f"warmup({self.steps}, {self.then!r}{offset})"


def _coded_call(fn):
    """`fn` with a call that does not fit its signature (a missing, extra or unknown argument)
    raised as a coded error showing the signature, not Python's bare TypeError."""
    sig = inspect.signature(fn)
    shown = str(
        sig.replace(
            parameters=[p.replace(annotation=p.empty) for p in sig.parameters.values()],
            return_annotation=sig.empty,
        )
    )

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            sig.bind(*args, **kwargs)
        except TypeError as e:
            raise ArgumentTypeError(
                f"optim.{fn.__name__}{shown} was called with {_shown(args, kwargs)}: {e}",
                fix=_FIXES[fn.__name__],
            ) from None
        return fn(*args, **kwargs)

    return call


def _shown(args, kwargs) -> str:
    parts = [shorten(a, 30) for a in args] + [f"{k}={shorten(v, 30)}" for k, v in kwargs.items()]
    return f"({', '.join(parts)})"


_FIXES = {
    "constant": "write e.g. optim.constant(3e-4)",
    "cosine": "write e.g. optim.cosine(6e-4, 5000, floor=6e-5): peak, steps and the floor it "
    "decays to (PyTorch's CosineAnnealingLR(T_max=5000, eta_min=6e-5))",
    "warmup": "write e.g. optim.warmup(100, optim.cosine(6e-4, 5000), offset=1): the rise "
    "is then(0) * (t + offset) / steps (offset=1: PyTorch's LambdaLR(lambda s: (s + 1) / 100))",
}


_MAX_STEPS = 2**31 - 1  # step counts are int32


@api_boundary
@_coded_call
@typing.no_type_check  # validates its arguments itself, with coded errors
def constant(value: float | int) -> Schedule:
    """The same learning rate at every step.

    Raises:
        ArgumentError: (E0002) for a negative, NaN or infinite value.
    """
    return _Constant(real("constant(value)", value, low=0.0))


@api_boundary
@_coded_call
@typing.no_type_check  # validates its arguments itself, with coded errors
def cosine(peak: float | int, steps: int, floor: float | int = 0.0) -> Schedule:
    """Decays from `peak` to `floor` over `steps`, then stays at `floor`:
    `floor + (peak - floor) * 0.5 * (1 + cos(pi * min(t, steps) / steps))`.

    `cosine(peak, steps, floor)` is PyTorch's `CosineAnnealingLR(opt, T_max=steps,
    eta_min=floor)` with `lr=peak`, step for step up to `steps` (PyTorch's rises again after).

    Args:
        peak: the rate at step 0, >= 0.
        steps: the length of the decay, a whole number >= 1.
        floor: the rate it decays to, `0 <= floor <= peak` (default 0).

    Example:
        >>> optim.cosine(6e-4, 5000, floor=6e-5)(jnp.array([0, 2500, 5000, 9000]))
        Array([6.0e-04, 3.3e-04, 6.0e-05, 6.0e-05], dtype=float32)

    Raises:
        ArgumentError, ArgumentTypeError: (E0002, E0003) for a negative or non-finite `peak`,
            `steps` that is not a whole number >= 1 (`10.7` is refused, not truncated), a
            `floor` outside `[0, peak]`, or a call that does not fit the signature.
    """
    peak = real("cosine(peak, steps, floor): peak", peak, low=0.0)
    steps = integer("cosine(peak, steps, floor): steps", steps, low=1, high=_MAX_STEPS)
    floor = real(
        "cosine(peak, steps, floor): floor",
        floor,
        low=0.0,
        high=peak,
        fix=f"pass a floor between 0 and peak={peak}, e.g. floor={peak / 10:g}",
    )
    return _Cosine(peak, steps, floor)


@api_boundary
@_coded_call
@typing.no_type_check  # validates its arguments itself, with coded errors
def warmup(steps: int, then: Schedule | float | int, *, offset: int = 0) -> Schedule:
    """Rises linearly over `steps`, then follows `then` (restarted at 0).

    `lr(t) = then(0) * (t + offset) / steps` for `t < steps`, then `then(t - steps)`. With the
    default `offset=0` the first step's rate is exactly 0 (optax's `linear_schedule`); with
    `offset=1` it is `then(0) / steps`, reaching `then(0)` at step `steps - 1`, as PyTorch's
    `LambdaLR(opt, lambda s: min(1, (s + 1) / steps))` recipes do.

    Args:
        steps: the length of the rise, a whole number >= 1.
        then: the schedule after it (or a number: a constant rate).
        offset: the rise's count at step 0, `0 <= offset <= steps`.

    Example:
        >>> optim.warmup(4, 1e-3, offset=1)(jnp.arange(6))
        Array([0.00025, 0.0005 , 0.00075, 0.001  , 0.001  , 0.001  ], dtype=float32)

    Raises:
        ArgumentError, ArgumentTypeError: (E0002, E0003) for `steps` that is not a whole number
            >= 1 (`2.5` is refused, not truncated), a bad `then` or `offset`, or a call that does
            not fit the signature.
    """
    steps = integer("warmup(steps, then): steps", steps, low=1, high=_MAX_STEPS)
    offset = integer(
        "warmup(steps, then, offset=): offset",
        offset,
        low=0,
        high=steps,
        fix="pass offset=0 (the rise starts at 0) or offset=1 (PyTorch's (s + 1) / steps)",
    )
    return _Warmup(steps, as_schedule(then, "warmup(steps, then): then"), offset)


def as_schedule(lr: Any, name: str = "lr") -> Schedule:
    """`lr` as a Schedule: a number becomes `constant(lr)` (checked: finite and >= 0)."""
    if isinstance(lr, Schedule):
        return lr
    if getattr(lr, "shape", None) == () or (
        isinstance(lr, (int, float)) and not isinstance(lr, bool)
    ):
        return _Constant(real(name, lr, low=0.0))
    raise ArgumentTypeError(
        f"`{name}` is a number or a schedule (constant, cosine, warmup), got {shorten(lr)}",
        fix=f"pass e.g. {name}=3e-3 or {name}=optim.warmup(20, optim.cosine(3e-3, steps))",
    )


_MAX_DEPTH = 32  # schedules nest (warmup of warmup ...); a deeper description is a corrupt file


def from_config(cfg: Any, depth: int = 0) -> Schedule:
    """Rebuilds a schedule from its `config()`, checking every part.

    Raises:
        ArgumentError, ArgumentTypeError: (E0002, E0003) for a malformed description.
    """
    if not isinstance(cfg, dict) or depth > _MAX_DEPTH:
        raise ArgumentTypeError(
            f"a schedule description is a JSON object nested at most {_MAX_DEPTH} deep, "
            f"got {shorten(cfg)}",
            fix="describe it as schedule.config() does",
        )
    kind = cfg.get("kind")
    fields = {"constant": ("value",), "cosine": ("peak", "steps"), "warmup": ("steps", "then")}
    optional = {"constant": (), "cosine": ("floor",), "warmup": ("offset",)}
    if not isinstance(kind, str) or kind not in fields:
        raise ArgumentError(
            f"unknown schedule kind {shorten(kind)}", fix="use constant, cosine or warmup"
        )
    if not {"kind", *fields[kind]} <= set(cfg) <= {"kind", *fields[kind], *optional[kind]}:
        raise ArgumentError(
            f"a {kind} schedule is described by {', '.join(fields[kind])}, got {sorted(cfg)}",
            fix="describe it as schedule.config() does",
        )
    if kind == "constant":
        return constant(cfg["value"])
    if kind == "cosine":
        return cosine(cfg["peak"], cfg["steps"], cfg.get("floor", 0.0))
    return warmup(cfg["steps"], from_config(cfg["then"], depth + 1), offset=cfg.get("offset", 0))
