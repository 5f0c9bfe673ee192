"""Bounds checks for indices into states and caches: out of range is an error in every context.

JAX clamps out-of-range gathers and `dynamic_update_slice`s silently, so every index into a state
passes through `check_index`. A concrete index is checked at once and raises `StateIndexError`. A
traced index goes to the mechanism named at the call site: by default `eqx.error_if`, which fails
the whole computation (under `jit`, and per element under `vmap`); or, when the caller passes an
`IndexChecks` list (a `Graph` step does, for every view of its state), into that list, whose owner
checks it before running anything and raises instead of running the step.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import warnings
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _jax_internals as jxi
from .._validate import shorten
from ._errors import GraphBodyError, StateIndexError, StateIndexTypeError

__all__ = [
    "Check",
    "IndexChecks",
    "assume_in_bounds",
    "check_index",
    "in_bounds",
    "raise_index_error",
    "span",
]


@dataclasses.dataclass(frozen=True)
class span:  # noqa: N801 - reads like a slice constructor
    """A slice of static length `size` starting at `start`, which may be a per-call value.

    `self.cache[span(pos, 4)]` reads (or, assigned to, writes) rows `pos .. pos + 3`; a plain
    slice `a[pos:pos + 4]` cannot have a traced start in JAX.
    """

    start: Any
    size: Any  # a static int, checked in __post_init__ (a bool or float is refused, not cast)

    def __post_init__(self):
        size = self.size
        if isinstance(size, bool | np.bool_) or not isinstance(size, int | np.integer) or size < 0:
            raise StateIndexTypeError(
                f"span(start, size) needs a static non-negative int size, got {shorten(size)} "
                f"({type(size).__name__})",
                fix="pass the length as a Python int, e.g. span(pos, 4)",
            )
        object.__setattr__(self, "size", int(size))


def in_bounds(idx, size: int, extent: int = 1) -> jax.Array:
    """`0 <= idx <= size - extent`, compared in `idx`'s own dtype (never narrowed first, so an int64
    index past 2**32 is not wrapped into range)."""
    idx = jnp.asarray(idx)
    ok = idx >= 0
    if size - extent < jnp.iinfo(idx.dtype).max:  # else every value of the dtype is below it
        ok = ok & (idx <= size - extent)
    return ok


@dataclasses.dataclass(frozen=True, eq=False)
class Check:
    """One recorded index, `0 <= index <= size - extent` to hold. When the index is one of the
    inputs the list was given, `source` names it and `input` is its position, else "" and -1."""

    what: str
    size: int
    extent: int
    source: str
    input: int
    index: Any  # the traced index itself, in its own dtype

    @property
    def ok(self) -> jax.Array:
        """Whether the index is in range (computed where it is asked for, in the list's trace)."""
        return in_bounds(self.index, self.size, self.extent)


class IndexChecks:
    """An explicit list of the traced index checks of one computation, for its owner to act on.

    A `Graph` step holds one: the views of its state (and every `KVCache` in its states, bound to
    it with `cache.with_checks(checks)`) record each traced index here instead of failing the
    program, and the graph runs these checks before the step, raising `StateIndexError` instead
    of running it. `sources` are `(name, value)` pairs of the step's inputs: an index that is one
    of them is named in errors (`pos=16`) and is checked on the host, without running anything.

    The list belongs to the trace it is made in: an index traced inside a transformation nested
    in it (`lax.scan`, `vmap`, an inner `jit`) exists only there, cannot be checked before the
    step, and is refused when recorded (`GraphBodyError`, E1409), never dropped.
    """

    def __init__(self, sources: list[tuple[str, Any]] | None = None):
        self.sources = list(sources or ())
        self.entries: list[Check] = []
        self.owner = ""  # what the errors say the indexed values belong to, e.g. "state `cache`"
        self._trace = jxi.current_trace()

    def named(self, owner: str) -> IndexChecks:
        """The same list (entries are shared), its errors saying the indices are into `owner`."""
        view = copy.copy(self)
        view.owner = owner
        return view

    def position_of(self, idx) -> int:
        """Which of `sources` is `idx` itself (the same object), or -1."""
        return next((i for i, (_, value) in enumerate(self.sources) if value is idx), -1)

    def source_of(self, idx) -> str:
        """The name of the input `idx` is, or "" when it is not one of `sources`."""
        at = self.position_of(idx)
        return self.sources[at][0] if at >= 0 else ""

    def record(self, idx, size: int, *, what: str, extent: int = 1):
        """Records `0 <= idx <= size - extent` for a traced `idx` and returns `idx` unchanged.

        Raises:
            GraphBodyError: (E1409) if `idx` was traced inside a transformation nested in the
                computation this list belongs to.
        """
        if jxi.is_tracer(idx) and jxi.trace_of(idx) is not self._trace:
            where = f"{what} (in {self.owner})" if self.owner else what
            raise GraphBodyError(
                f"{where} was indexed with a value traced inside a transformation nested in the "
                "graph's body (lax.scan, vmap, an inner jit, ...); the graph checks every index "
                "before its step runs, and cannot check one that exists only in there",
                fix="index with values of the body itself: unroll the loop into a Python for loop "
                "(e.g. over layers), or compute the index outside the transformation (pos itself "
                "may be used anywhere); outside a Graph, a cache in your own jit checks its "
                "indices with eqx.error_if",
            )
        at = self.position_of(idx)
        self.entries.append(Check(what, size, extent, self.source_of(idx), at, idx))
        return idx

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


def _int() -> np.dtype:
    """JAX's int dtype now: int64 with `jax_enable_x64`, else int32."""
    return np.dtype(jax.dtypes.canonicalize_dtype(np.int64))


def _concrete_int(idx) -> int | None:
    """The exact value of a concrete integer scalar index, or None when `idx` is not one.

    Nothing is converted before this check: an int64 past 2**32 keeps its value (it is not wrapped
    into range), and a bool, float or string is not read as a number."""
    if isinstance(idx, bool | np.bool_):
        return None
    if isinstance(idx, int | np.integer):
        return int(idx)
    dtype = getattr(idx, "dtype", None)
    if getattr(idx, "shape", None) == () and dtype is not None:
        if not isinstance(dtype, np.dtype) or dtype.kind not in "iu":
            return None  # float, bool, complex, PRNG key, ...
        return int(idx)
    return None


def _describe(idx) -> str:
    dtype = getattr(idx, "dtype", None)
    shape = getattr(idx, "shape", None)
    kind = f"dtype {dtype}, shape {tuple(shape)}" if dtype is not None and shape is not None else ""
    shown = f"<traced {jax.typeof(idx).str_short()}>" if jxi.is_tracer(idx) else shorten(idx)
    return f"{shown} ({kind or type(idx).__name__})"


def _traced_int_scalar(idx) -> bool:
    if not jxi.is_tracer(idx) or np.ndim(idx) != 0:
        return False
    dtype = idx.dtype
    return isinstance(dtype, np.dtype) and dtype.kind in "iu"


def check_index(idx, size: int, *, what: str, extent: int = 1, checks: IndexChecks | None = None):
    """Checks `0 <= idx` and `idx + extent <= size`, the same way in every context.

    A concrete index raises at once. A traced one (under `jit`, `vmap`, `scan`) is checked inside
    the program by `eqx.error_if` (the computation fails with a JAX runtime error whose message
    starts with `[E1401]`), or, when `checks` is given, recorded in that list for its owner (a
    `Graph` step, which checks it before running the step) to act on.

    Args:
        idx: an integer scalar: Python int, 0-d integer array, or traced 0-d integer.
        size: the extent of the indexed axis.
        what: how the error names the axis, e.g. "state `total` (axis 0)".
        extent: how many positions starting at `idx` are touched.
        checks: where a traced check goes instead of `eqx.error_if` (see `IndexChecks`).

    Returns:
        `idx` as a Python int when concrete; when traced, `idx` cast to JAX's int dtype after its
        check (which compares it in its own dtype), to be used for the check to run.

    Raises:
        StateIndexTypeError: (E1402) if `idx` is not an integer scalar.
        StateIndexError: (E1401) if `idx` is concrete and out of range.
        GraphBodyError: (E1409) if `checks` is given and `idx` was traced inside a transformation
            nested in the computation `checks` belongs to (see `IndexChecks`).
    """
    traced = _traced_int_scalar(idx)
    value = None if traced else _concrete_int(idx)
    if not traced and value is None:
        raise StateIndexTypeError(
            f"{what} was indexed with {_describe(idx)}, which is not an integer scalar",
            fix="index with an int, a 0-d integer array, or span(start, size)",
        )
    if extent > size:
        raise StateIndexError(
            f"{what} has size {size}, but a span of {extent} positions was asked for",
            fix=f"use a span of at most {size}",
        )
    if value is not None:
        if value < 0 or value + extent > size:
            source = checks.source_of(idx) if checks is not None else None
            raise_index_error(what, size, extent, value, source)
        return value
    if checks is not None:
        checks.record(idx, size, what=what, extent=extent)
    else:
        # eqx.error_if, not a cond: it stays correct under vmap, failing if any element is out.
        idx = eqx.error_if(
            idx,
            ~in_bounds(idx, size, extent),
            f"[E1401] {what} has size {size}: an index outside 0..{size - extent} was "
            "given (JAX would clamp it); pass 0 <= index <= size - extent",
        )
    # Checked in its own dtype above; one dtype after, so indices of several integer dtypes
    # (int8, uint32, ...) can start one slice. A value the cast would wrap never gets this far
    # (a graph refuses the step; error_if fails the program).
    return idx if idx.dtype == _int() else idx.astype(_int())


@contextlib.contextmanager
def assume_in_bounds():
    """Deprecated, and does nothing: every index is checked in every context.

    It used to drop in-program checks inside its block. An unchecked index would be clamped
    silently, so there is nothing to turn off: in a `Graph` the checks run before the step (a
    host comparison for an index that is an input, a small compiled program for one computed in
    the body); in your own `jit`, `eqx.error_if` adds a comparison and a conditional to the program.
    """
    warnings.warn(
        "shapeml.state.assume_in_bounds() is deprecated and does nothing: indices are always "
        "checked; remove the `with` block",
        DeprecationWarning,
        stacklevel=3,
    )
    yield
