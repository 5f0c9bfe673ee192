"""Bounds checks for indices into states and caches: out of range is an error in every context.

JAX clamps out-of-range gathers and `dynamic_update_slice`s silently, so every index into a state
passes through `check_index`. A concrete index is checked at once and raises `StateIndexError`. A
traced index goes to the mechanism named at the call site: by default `eqx.error_if`, which fails
the whole computation (under `jit`, and per element under `vmap`); or, when the caller passes an
`IndexChecks` list (a `Graph` step does, for every view of its state), into that list, whose owner
discards the writes of a failing call and raises after it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _jax_internals as jxi
from ._errors import StateIndexError, StateIndexTypeError

__all__ = ["IndexChecks", "assume_in_bounds", "check_index", "raise_index_error", "span"]


@dataclasses.dataclass(frozen=True)
class span:  # noqa: N801 - reads like a slice constructor
    """A slice of static length `size` starting at `start`, which may be a per-call value.

    `self.cache[span(pos, 4)]` reads (or, assigned to, writes) rows `pos .. pos + 3`; a plain
    slice `a[pos:pos + 4]` cannot have a traced start in JAX.
    """

    start: Any
    size: int

    def __post_init__(self):
        if not isinstance(self.size, int | np.integer) or self.size < 0:
            raise StateIndexTypeError(
                f"span(start, size) needs a static non-negative int size, got {self.size!r}",
                fix="pass the length as a Python int, e.g. span(pos, 4)",
            )


@dataclasses.dataclass(frozen=True)
class Check:
    """One traced check: `ok` is `0 <= value <= size - extent`. When the index is one of the
    inputs the list was given, `source` names it and `input` is its position, else "" and -1."""

    what: str
    size: int
    extent: int
    source: str
    input: int
    ok: jax.Array
    value: jax.Array


class IndexChecks:
    """An explicit list of the traced index checks of one computation, for its owner to act on.

    A `Graph` step holds one: the views of its state (and a `KVCache` bound to it with
    `cache.with_checks(checks)`) record each traced index here instead of failing the program,
    and the graph runs these checks before the step, raising `StateIndexError` instead of running
    it. `sources` are `(name, value)` pairs of the step's inputs: an index that is one of them is
    named in errors (`pos=16`) and can be checked on the host, without running anything.
    """

    def __init__(self, sources: list[tuple[str, Any]] | None = None):
        self.sources = list(sources or ())
        self.entries: list[Check] = []

    def position_of(self, idx) -> int:
        """Which of `sources` is `idx` itself (the same object), or -1."""
        return next((i for i, (_, value) in enumerate(self.sources) if value is idx), -1)

    def source_of(self, idx) -> str:
        at = self.position_of(idx)
        return self.sources[at][0] if at >= 0 else ""

    def record(self, idx, size: int, *, what: str, extent: int = 1):
        """Records `0 <= idx <= size - extent` for a traced `idx` and returns `idx` unchanged."""
        value = jnp.asarray(idx).astype(jnp.int32)
        ok = (value >= 0) & (value <= size - extent)
        at = self.position_of(idx)
        source = self.sources[at][0] if at >= 0 else ""
        self.entries.append(Check(what, size, extent, source, at, ok, value))
        return idx

    def all_ok(self) -> jax.Array | None:
        """True when every recorded check passed; None when nothing was recorded."""
        if not self.entries:
            return None
        return jnp.all(jnp.stack([c.ok for c in self.entries]))

    def __repr__(self) -> str:
        return f"IndexChecks({len(self.entries)} recorded)"


def index_message(what: str, size: int, extent: int, value: int, source: str | None) -> str:
    """The text of an E1401 error. `source` names the input the index is; "" says it was computed
    in a graph's body; None says nothing (outside a graph)."""
    shown = f"{source}={value}" if source else f"{value}"
    shown += " (computed in body)" if source == "" else ""
    if extent == 1:
        return f"{what} has size {size}, but the index {shown} is outside 0..{size - 1}"
    return (
        f"{what} has size {size}, but the span of {extent} starting at {shown} is outside it "
        f"(it must start in 0..{size - extent})"
    )


def _fix(size: int, extent: int) -> str:
    if extent == 1:
        return f"pass an index with 0 <= index < {size} (negative indices are not counted from the end)"
    return f"start the span at 0 <= start <= {size - extent}"


def raise_index_error(what: str, size: int, extent: int, value: int, source: str | None = None):
    raise StateIndexError(index_message(what, size, extent, value, source), fix=_fix(size, extent))


def _is_int_scalar(x) -> bool:
    return np.ndim(x) == 0 and jnp.issubdtype(jnp.result_type(x), jnp.integer)


def check_index(idx, size: int, *, what: str, extent: int = 1, checks: IndexChecks | None = None):
    """Checks `0 <= idx` and `idx + extent <= size`, the same way in every context.

    A concrete index raises at once. A traced one (under `jit`, `vmap`, `scan`, in a graph's body)
    is checked inside the program: by `eqx.error_if` (the computation fails with a JAX runtime
    error whose message starts with `[E1401]`), or, when `checks` is given, by recording it in
    that list for its owner (a `Graph` step) to act on.

    Args:
        idx: an integer scalar: Python int, 0-d integer array, or traced 0-d integer.
        size: the extent of the indexed axis.
        what: how the error names the axis, e.g. "state `total` (axis 0)".
        extent: how many positions starting at `idx` are touched.
        checks: where a traced check goes instead of `eqx.error_if` (see `IndexChecks`).

    Returns:
        `idx` (an int when concrete); a traced `idx` must be used for its check to run.

    Raises:
        StateIndexTypeError: (E1402) if `idx` is not an integer scalar.
        StateIndexError: (E1401) if `idx` is concrete and out of range.
    """
    if isinstance(idx, bool | np.bool_) or not _is_int_scalar(idx):
        raise StateIndexTypeError(
            f"{what} was indexed with {idx!r} (dtype {jnp.result_type(idx)}, shape "
            f"{np.shape(idx)}), which is not an integer scalar",
            fix="index with an int, a 0-d integer array, or span(start, size)",
        )
    if extent > size:
        raise StateIndexError(
            f"{what} has size {size}, but a span of {extent} positions was asked for",
            fix=f"use a span of at most {size}",
        )
    if not jxi.is_tracer(idx):
        value = int(idx)
        if value < 0 or value + extent > size:
            source = checks.source_of(idx) if checks is not None else None
            raise_index_error(what, size, extent, value, source)
        return value
    if checks is not None:
        return checks.record(idx, size, what=what, extent=extent)
    ok = (idx >= 0) & (idx <= size - extent)
    # eqx.error_if, not a cond: it stays correct under vmap, failing if any element is out.
    return eqx.error_if(
        idx,
        ~ok,
        f"[E1401] {what} has size {size}: an index outside 0..{size - extent} was "
        "given (JAX would clamp it); pass 0 <= index <= size - extent",
    )


@contextlib.contextmanager
def assume_in_bounds():
    """Deprecated, and does nothing: every index is checked in every context.

    It used to drop in-program checks inside its block. The checks now cost a conditional that
    never runs its branch unless an index is out of range; an unchecked index would be clamped
    silently, so there is nothing to turn off.
    """
    warnings.warn(
        "shapeml.state.assume_in_bounds() is deprecated and does nothing: indices are always "
        "checked (the check is cheap); remove the `with` block",
        DeprecationWarning,
        stacklevel=3,
    )
    yield
