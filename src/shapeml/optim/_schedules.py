"""Learning-rate schedules: functions of the step count, built on optax's schedules.

Each is a small frozen dataclass, so it prints as written, composes (`warmup(20, cosine(...))`),
plots (`schedule(jnp.arange(n))`) and round-trips through checkpoint metadata.
"""

from __future__ import annotations

import abc
import dataclasses
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

    def optax(self):
        # peak * 0.5 * (1 + cos(pi * min(t, steps) / steps))
        return optax.cosine_decay_schedule(self.peak, self.steps, alpha=0.0)

    def config(self):
        return {"kind": "cosine", "peak": self.peak, "steps": self.steps}

    def __repr__(self):
        return f"cosine({self.peak}, {self.steps})"


@dataclasses.dataclass(frozen=True)
class _Warmup(Schedule):
    steps: int
    then: Schedule

    def optax(self):
        # then(0) * t / n for t < n, then then(t - n)
        rise = optax.linear_schedule(0.0, self.then(0), self.steps)
        return optax.join_schedules([rise, self.then.optax()], [self.steps])

    def config(self):
        return {"kind": "warmup", "steps": self.steps, "then": self.then.config()}

    def __repr__(self):
        return f"warmup({self.steps}, {self.then!r})"


_MAX_STEPS = 2**31 - 1  # step counts are int32


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def constant(value: float | int) -> Schedule:
    """The same learning rate at every step.

    Raises:
        ArgumentError: (E0002) for a negative, NaN or infinite value.
    """
    return _Constant(real("constant(value)", value, low=0.0))


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def cosine(peak: float | int, steps: int) -> Schedule:
    """Decays from `peak` to 0 over `steps`: `peak * 0.5 * (1 + cos(pi * min(t, steps) / steps))`.

    Raises:
        ArgumentError, ArgumentTypeError: (E0002, E0003) for a negative or non-finite `peak`, or
            `steps` that is not a whole number >= 1 (`10.7` is refused, not truncated).
    """
    peak = real("cosine(peak, steps): peak", peak, low=0.0)
    return _Cosine(peak, integer("cosine(peak, steps): steps", steps, low=1, high=_MAX_STEPS))


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def warmup(steps: int, then: Schedule | float | int) -> Schedule:
    """Rises linearly from 0 over `steps`, then follows `then` (restarted at 0).

    `lr(t) = then(0) * t / steps` for `t < steps`, then `then(t - steps)`.

    Raises:
        ArgumentError, ArgumentTypeError: (E0002, E0003) for `steps` that is not a whole number
            >= 1 (`2.5` is refused, not truncated), or a bad `then`.
    """
    steps = integer("warmup(steps, then): steps", steps, low=1, high=_MAX_STEPS)
    return _Warmup(steps, as_schedule(then, "warmup(steps, then): then"))


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
    if not isinstance(kind, str) or kind not in fields:
        raise ArgumentError(
            f"unknown schedule kind {shorten(kind)}", fix="use constant, cosine or warmup"
        )
    if set(cfg) != {"kind", *fields[kind]}:
        raise ArgumentError(
            f"a {kind} schedule is described by {', '.join(fields[kind])}, got {sorted(cfg)}",
            fix="describe it as schedule.config() does",
        )
    if kind == "constant":
        return constant(cfg["value"])
    if kind == "cosine":
        return cosine(cfg["peak"], cfg["steps"])
    return warmup(cfg["steps"], from_config(cfg["then"], depth + 1))
