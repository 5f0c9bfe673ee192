"""Learning-rate schedules: functions of the step count, built on optax's schedules.

Each is a small frozen dataclass, so it prints as written, composes (`warmup(20, cosine(...))`),
plots (`schedule(jnp.arange(n))`) and round-trips through checkpoint metadata.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

import jax.numpy as jnp
import optax

from .._errors import ArgumentError, ArgumentTypeError

__all__ = ["Schedule", "constant", "cosine", "from_config", "warmup"]


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


def constant(value: float | int) -> Schedule:
    """The same learning rate at every step."""
    return _Constant(float(value))


def cosine(peak: float | int, steps: int) -> Schedule:
    """Decays from `peak` to 0 over `steps`: `peak * 0.5 * (1 + cos(pi * min(t, steps) / steps))`."""
    if steps <= 0:
        raise ArgumentError(f"cosine(peak, steps) needs steps > 0, got {steps}")
    return _Cosine(float(peak), int(steps))


def warmup(steps: int, then: Schedule | float | int) -> Schedule:
    """Rises linearly from 0 over `steps`, then follows `then` (restarted at 0).

    `lr(t) = then(0) * t / steps` for `t < steps`, then `then(t - steps)`.
    """
    if steps <= 0:
        raise ArgumentError(f"warmup(steps, then) needs steps > 0, got {steps}")
    return _Warmup(int(steps), as_schedule(then))


def as_schedule(lr: Schedule | float | int) -> Schedule:
    if isinstance(lr, Schedule):
        return lr
    if isinstance(lr, (int, float)) and not isinstance(lr, bool):
        return constant(lr)
    raise ArgumentTypeError(
        f"a learning rate is a number or a schedule (constant, cosine, warmup), got {lr!r}"
    )


def from_config(cfg: dict[str, Any]) -> Schedule:
    """Rebuilds a schedule from its `config()`."""
    kind = cfg.get("kind")
    if kind == "constant":
        return constant(cfg["value"])
    if kind == "cosine":
        return cosine(cfg["peak"], cfg["steps"])
    if kind == "warmup":
        return warmup(cfg["steps"], from_config(cfg["then"]))
    raise ArgumentError(f"unknown schedule kind {kind!r}")
