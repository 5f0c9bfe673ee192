"""Coded checks inside a compiled step: a `checkify` check whose failure the shell raises as a
coded shapeml error, and the flag that says the shell is tracing a step (its checks are in it).

A check is `coded_check(ok, StateIndexError, message, fix, value)`: a
`checkify.debug_check` whose message carries the error's code and fix, so the shell, which
knows nothing of what is checked, turns a failed check back into that error (`coded_failure`).
"""

from __future__ import annotations

import contextlib
import contextvars

from jax.experimental import checkify

from .._errors import ShapemlError

__all__ = ["coded_check", "coded_failure", "in_step", "tracing_step"]

# A checkify message is `code, message, fix` joined by this separator (never in a message).
_SEP = "\x1f"

_IN_STEP: contextvars.ContextVar[bool] = contextvars.ContextVar("shapeml_in_step", default=False)


@contextlib.contextmanager
def tracing_step():
    """While the shell traces a step: its checks run inside the step's program, which writes
    nothing when one fails, so a check needs no `eqx.error_if` of its own."""
    token = _IN_STEP.set(True)
    try:
        yield
    finally:
        _IN_STEP.reset(token)


def in_step() -> bool:
    """Whether the shell is tracing a step now (see `tracing_step`)."""
    return _IN_STEP.get()


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
