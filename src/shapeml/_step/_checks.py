"""Coded checks of a compiled step: a `checkify` check whose failure the shell raises as a coded
shapeml error, a bounds check on one of the step's inputs that the shell runs on the host instead,
and the context that says the shell is tracing a step.

A check is `coded_check(ok, StateIndexError, message, fix, value)`: a
`checkify.debug_check` whose message carries the error's code and fix, so the shell, which
knows nothing of what is checked, turns a failed check back into that error (`coded_failure`).
A bounds check of a value that is itself one of the step's inputs (`graph(x, pos=7)` indexing
`self.total[pos]`) is `host_check`: recorded while tracing, the shell checks the concrete input
before it dispatches, so the program carries no flag for it and the call never waits on it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Sequence
from typing import Any

from jax.experimental import checkify

from .. import _jax_internals as jxi
from .._errors import ShapemlError

__all__ = [
    "HostCheck",
    "StepTrace",
    "coded_check",
    "coded_failure",
    "host_check",
    "in_step",
    "tracing_step",
]

# A checkify message is `code, message, fix` joined by this separator (never in a message).
_SEP = "\x1f"


@dataclasses.dataclass(frozen=True)
class HostCheck:
    """`low <= inputs[leaf] <= high` for the step's input leaf `leaf`, checked on the host."""

    leaf: int
    low: int
    high: int
    error: type[ShapemlError]
    message: str  # with one `{}` slot for the value (other braces doubled)
    fix: str

    def verify(self, leaves: Sequence) -> None:
        """Raises the coded error when the concrete input is out of bounds (a device array is read
        back: its value is needed before the step may run)."""
        value = int(leaves[self.leaf])
        if not self.low <= value <= self.high:
            raise self.error(self.message.format(value), fix=self.fix)


class StepTrace:
    """What the shell's trace of one step knows: its input tracers (`inputs`, set once traced) and,
    when it may move checks to the host, the ones recorded (`host`)."""

    def __init__(self, host: bool):
        self.inputs: list = []
        self.host: list[HostCheck] | None = [] if host else None


_IN_STEP: contextvars.ContextVar[StepTrace | None] = contextvars.ContextVar(
    "shapeml_in_step", default=None
)


@contextlib.contextmanager
def tracing_step(trace: StepTrace):
    """While the shell traces a step: its checks run inside the step's program (or on the host),
    which writes nothing when one fails, so a check needs no `eqx.error_if` of its own."""
    token = _IN_STEP.set(trace)
    try:
        yield
    finally:
        _IN_STEP.reset(token)


def in_step() -> bool:
    """Whether the shell is tracing a step now (see `tracing_step`)."""
    return _IN_STEP.get() is not None


def host_check(value: Any, low: int, high: int, error: type[ShapemlError], message, fix) -> bool:
    """Records `low <= value <= high` as a check the shell runs on the host before each call, when
    `value` is one of the step's inputs as it came (the tracer itself, used in the step's own trace,
    not in a branch or a loop that may not run); returns whether it did. `message` has one `{}`
    slot for the value (other braces doubled)."""
    trace = _IN_STEP.get()
    # In a branch or a loop the trace running is another one (the input is closed over): the
    # branch may not run, so the check stays in the program.
    if trace is None or trace.host is None or jxi.trace_of(value) is not jxi.current_trace():
        return False
    leaf = next((i for i, x in enumerate(trace.inputs) if x is value), None)
    if leaf is None:
        return False
    trace.host.append(HostCheck(leaf, low, high, error, message, fix))
    return True


def coded_check(ok, error: type[ShapemlError], message: str, fix: str, *values) -> None:
    """A `checkify.debug_check` of `ok` that fails as `error(message, fix=fix)`.

    Args:
        ok: a traced bool scalar, True when the check passes.
        error: the coded error class a failure raises.
        message: the message, with a `{}` slot per value (other braces doubled).
        fix: how to fix it.
        values: the traced values the message shows.
    """
    checkify.debug_check(ok, _SEP.join((error.code, message, fix, "")), *values)


def _classes(cls: type) -> list[type]:
    out = [cls]
    for sub in cls.__subclasses__():
        out += _classes(sub)
    return out


def coded_failure(text: str) -> ShapemlError | None:
    """The coded error a failed `coded_check`'s message stands for, else None (a check of the
    user's own)."""
    parts = text.split(_SEP)
    if len(parts) != 4:
        return None
    error = next((c for c in _classes(ShapemlError) if c.__dict__.get("code") == parts[0]), None)
    return None if error is None else error(parts[1], fix=parts[2])
