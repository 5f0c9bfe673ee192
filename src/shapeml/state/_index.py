"""Bounds checks for indices into states and caches: out of range is an error in every context.

JAX clamps out-of-range gathers and `dynamic_update_slice`s silently, so every index into a state
or a cache passes through `check_index`. A concrete index is checked at once. A traced one is
checked twice over, by two of JAX's own mechanisms, so that it is caught wherever it runs:

- a `checkify` check (`_step._checks.coded_check`), an explicit error value that `checkify`
  threads out of a computation. The one shell (`shapeml._step`) checkifies its step inside its one
  program and runs the step only when every check passed, so a bad index raises and the donated
  state is untouched;
- `eqx.error_if`, which fails the computation in a user's own `jax.jit` (per element under `vmap`).

While the shell traces a step (`_step._checks.in_step()`), the `eqx.error_if` is left out: the
step's program checks its indices itself, and a host callback in a program would cost every call.
An index that is itself one of the step's inputs (`graph(x, pos=7)`) is checked by the shell on the
host before the call instead (`_step._checks.host_check`): the program then reads no flag for it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _jax_internals as jxi
from .._errors import ShapemlError
from .._step._checks import coded_check, host_check, in_step
from .._traceback import api_boundary
from .._validate import shorten

__all__ = [
    "Check",
    "IndexChecks",
    "StateIndexError",
    "StateIndexTypeError",
    "check_index",
    "coded_runtime_failure",
    "in_bounds",
    "raise_index_error",
    "span",
]


class StateIndexError(
    ShapemlError,
    IndexError,
    code="E1401",
    title="state index out of range",
    explanation="""
A state (or a KV cache) was indexed outside its extent: a position `pos >= size`, or a negative one.

JAX clamps out-of-range indices in gathers and `dynamic_update_slice` without a word, so
`total[16]` on a 16-row state would silently read and overwrite row 15. shapeml checks every index,
the same way in every context: a concrete index raises at once; in a compiled stateful step (a
`Graph`, a `TrainStep`, a cached decoder) the step's program checks its indices before the step
runs, and a bad index raises this error instead of running the step, so nothing is written; in your
own `jit` or `vmap`, `check_index` (and `KVCache`) fail the computation through `eqx.error_if`, with
a JAX runtime error whose message starts with `[E1401]`.

Negative indices are refused rather than counted from the end, because a negative position is
nearly always an off-by-one in a decode loop.

    graph(x, pos=16)          # total has 16 rows: raises E1401
    graph(x, pos=15)          # the last row
""",
):
    pass


class StateIndexTypeError(
    ShapemlError,
    TypeError,
    code="E1402",
    title="not a valid state index",
    explanation="""
A state index must be an integer scalar (a Python int, a 0-d integer array, or a traced 0-d
integer), a slice with static integer bounds, or `shapeml.state.span(start, size)` for a slice of
static length that starts at a per-call position.

    self.total[pos]                    # one row
    self.cache[span(pos, 4)]           # four rows starting at pos
    self.total[0.5]                    # raises E1402: a float is not an index
""",
):
    pass


@api_boundary
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


def index_message(what: str, size: int, extent: int, value: Any) -> str:
    """The text of an E1401 error (`value` may be `{}`, checkify's slot for the runtime value)."""
    if extent == 1:
        return f"{what} has size {size}, but the index {value} is outside 0..{size - 1}"
    return (
        f"{what} has size {size}, but the span of {extent} starting at {value} is outside it "
        f"(it must start in 0..{size - extent})"
    )


def _fix(size: int, extent: int) -> str:
    if extent == 1:
        return f"pass an index with 0 <= index < {size} (negative indices are not counted from the end)"
    return f"start the span at 0 <= start <= {size - extent}"


def raise_index_error(what: str, size: int, extent: int, value: int):
    raise StateIndexError(index_message(what, size, extent, value), fix=_fix(size, extent))


# The `eqx.error_if` message is `[E1401] message, fix` joined by this separator (never in a
# message), so the coded error can be raised again from JAX's runtime error.
_SEP = "\x1f"


def _runtime_message(what: str, size: int, extent: int) -> str:
    """The E1401 text `eqx.error_if` fails a computation with (it cannot show the value)."""
    return (
        f"{what} has size {size}, but an index outside 0..{size - extent} was given (JAX would "
        f"clamp it){_SEP}{_fix(size, extent)}{_SEP}"
    )


def coded_runtime_failure(error: Exception) -> ShapemlError | None:
    """The coded error a JAX runtime error raised by `check_index`'s `eqx.error_if` stands for
    (an index traced inside a transformation of an eagerly run step), else None."""
    text = str(error)
    start = text.find(f"[{StateIndexError.code}] ")
    if start < 0 or _SEP not in text[start:]:
        return None
    message, fix, _ = text[start + 8 :].split(_SEP, 2)
    return StateIndexError(message, fix=fix)


@dataclasses.dataclass(frozen=True, eq=False)
class Check:
    """One recorded index: `0 <= index <= size - extent` is to hold. `source` names the input the
    index is (one of the list's `sources`), or is ""."""

    what: str
    size: int
    extent: int
    source: str
    index: Any  # the traced index itself, in its own dtype

    @property
    def ok(self) -> jax.Array:
        """Whether the index is in range (computed where it is asked for, in the list's trace)."""
        return in_bounds(self.index, self.size, self.extent)


@api_boundary
class IndexChecks:
    """An explicit list of traced index checks, for a caller that acts on them itself.

    `check_index(i, n, what=..., checks=checks)` appends a `Check` here instead of checking a traced
    index inside the computation. `sources` are `(name, value)` pairs: an index that is one of the
    values (the same object) is recorded with its name. shapeml's own stateful steps do not need
    one: the shell checks every index before its step runs.
    """

    def __init__(self, sources: list[tuple[str, Any]] | None = None):
        self.sources = list(sources or ())
        self.entries: list[Check] = []

    def record(self, idx, size: int, *, what: str, extent: int = 1):
        """Records `0 <= idx <= size - extent` for a traced `idx` and returns `idx` unchanged."""
        source = next((name for name, value in self.sources if value is idx), "")
        self.entries.append(Check(what, size, extent, source, idx))
        return idx

    def __repr__(self) -> str:
        return f"IndexChecks({len(self.entries)} recorded)"


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


@api_boundary
def check_index(
    idx,
    size: int,
    *,
    what: str,
    extent: int = 1,
    checks: IndexChecks | None = None,
    error_in_jit: bool = True,
):
    """Checks `0 <= idx` and `idx + extent <= size`, the same way in every context.

    A concrete index raises at once. A traced one (under `jit`, `vmap`, `scan`) is checked by a
    `checkify` check, which the shell's program runs before its step, and by `eqx.error_if`, which fails the
    computation in your own `jit` (a JAX runtime error whose message starts with `[E1401]`); when
    `checks` is given, it is recorded in that list instead, for the caller to act on.

    Args:
        idx: an integer scalar: Python int, 0-d integer array, or traced 0-d integer.
        size: the extent of the indexed axis.
        what: how the error names the axis, e.g. "state `total` (axis 0)".
        extent: how many positions starting at `idx` are touched.
        checks: where a traced check goes instead (see `IndexChecks`).
        error_in_jit: False leaves a traced index unchecked in your own `jit` (the caller makes an
            out-of-range value harmless, e.g. reads NaN); a stateful step still checks it first.

    Returns:
        `idx` as a Python int when concrete; when traced, `idx` cast to JAX's int dtype after its
        check (which compares it in its own dtype).

    Raises:
        StateIndexTypeError: (E1402) if `idx` is not an integer scalar.
        StateIndexError: (E1401) if `idx` is concrete and out of range.
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
            raise_index_error(what, size, extent, value)
        return value
    if checks is not None:
        checks.record(idx, size, what=what, extent=extent)
    else:
        # `{}` is the slot for the runtime value; braces in `what` are escaped for it.
        shown = what.replace("{", "{{").replace("}", "}}")
        message = index_message(shown, size, extent, "{}")
        if host_check(idx, 0, size - extent, StateIndexError, message, _fix(size, extent)):
            return idx if idx.dtype == _int() else idx.astype(_int())  # the shell checks it
        ok = in_bounds(idx, size, extent)
        coded_check(ok, StateIndexError, message, _fix(size, extent), idx)
        if error_in_jit and not in_step():
            # eqx.error_if, not a cond: it stays correct under vmap, failing if any element is out.
            message = f"[{StateIndexError.code}] {_runtime_message(what, size, extent)}"
            idx = eqx.error_if(idx, ~ok, message)
    # Checked in its own dtype above; one dtype after, so indices of several integer dtypes
    # (int8, uint32, ...) can start one slice.
    return idx if idx.dtype == _int() else idx.astype(_int())
