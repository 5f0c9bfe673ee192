"""Bounds checks for every index into a state, on the host or inside the compiled program.

JAX clamps out-of-range gathers and `dynamic_update_slice`s silently, so each index into a state
passes through `check`. A concrete index is checked at once. A traced index that is exactly a
per-call input of a `Graph` becomes a host rule, checked before the next call is dispatched (no
device work, no sync). Any other traced index becomes an in-program check: the graph then gates every
write of the call on all checks passing (`gate`) and raises after the call, so nothing changes.
Outside a graph (plain `jax.jit`) a failing traced check fails the program through
`eqx.error_if` (correct under `vmap`); the JAX runtime error's message starts with `[E1401]`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import _jax_internals as jxi
from ._errors import StateIndexError, StateIndexTypeError

__all__ = [
    "HostRule",
    "Sink",
    "active_sink",
    "assume_in_bounds",
    "check_index",
    "direct_inputs",
    "gate",
    "index_message",
    "input_names",
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
    size: int

    def __post_init__(self):
        if not isinstance(self.size, int | np.integer) or self.size < 0:
            raise StateIndexTypeError(
                f"span(start, size) needs a static non-negative int size, got {self.size!r}",
                fix="pass the length as a Python int, e.g. span(pos, 4)",
            )


@dataclasses.dataclass(frozen=True)
class HostRule:
    """`0 <= inputs[leaf] and inputs[leaf] + extent <= size`, checked before each call."""

    leaf: int
    arg: str
    what: str
    size: int
    extent: int


@dataclasses.dataclass
class _Check:
    what: str
    size: int
    extent: int
    ok: jax.Array
    value: jax.Array


@dataclasses.dataclass
class Sink:
    """Collects the index checks of one trace of a graph's body."""

    direct: dict[int, tuple[int, str]]  # id(tracer of a per-call input) -> (leaf, name)
    ok_all: jax.Array | None = None  # set on the gated second trace
    rules: list[HostRule] = dataclasses.field(default_factory=list)
    checks: list[_Check] = dataclasses.field(default_factory=list)


_local = threading.local()


@contextlib.contextmanager
def assume_in_bounds():
    """Within this block (while tracing), traced indices into states and caches are not checked
    inside the program; concrete ones still are.

    For a loop whose positions the caller has already checked on the host, such as a decode loop
    after `prompt + steps <= ctx` was verified: each in-program check costs a conditional per
    index per iteration (about half the time of a small model's decode step on CPU). Inside a
    `Graph` body, per-call indices are checked on the host anyway and cost nothing.

    Example:
        >>> if t + steps > cache.ctx: raise ...        # checked once, on the host
        >>> with shapeml.state.assume_in_bounds():
        ...     tokens = lax.scan(decode_step, ...)     # traced positions t .. t + steps - 1
    """
    _local.__dict__.setdefault("trusted", []).append(True)
    try:
        yield
    finally:
        _local.trusted.pop()


def active_sink() -> Sink | None:
    stack = getattr(_local, "sinks", None)
    return stack[-1] if stack else None


def push_sink(sink: Sink | None) -> None:
    _local.__dict__.setdefault("sinks", []).append(sink)


def pop_sink() -> None:
    _local.sinks.pop()


def index_message(what: str, size: int, extent: int, value: int, source: str | None = "") -> str:
    """`source` names the input the index came from; "" for an index computed in the program."""
    shown = f"{source}={value}" if source else f"{value} (computed inside the program)"
    if source is None:
        shown = f"{value}"
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


def raise_index_error(what: str, size: int, extent: int, value: int, source: str | None = ""):
    raise StateIndexError(index_message(what, size, extent, value, source), fix=_fix(size, extent))


def _is_int_scalar(x) -> bool:
    return np.ndim(x) == 0 and jnp.issubdtype(jnp.result_type(x), jnp.integer)


def direct_inputs(inputs) -> dict[int, tuple[int, str]]:
    """`id -> (leaf, name)` for the integer scalar leaves of `(args, kwargs)` as given to a body."""
    names = input_names(inputs)
    return {
        id(x): (i, names[i])
        for i, x in enumerate(jax.tree_util.tree_leaves(inputs))
        if np.ndim(x) == 0 and jnp.issubdtype(x.dtype, jnp.integer)
    }


def input_names(inputs) -> list[str]:
    """A name for each leaf of `(args, kwargs)`: the keyword, or `input N` plus a pytree path."""
    out = []
    for path, _ in jax.tree_util.tree_flatten_with_path(inputs)[0]:
        head, first, rest = path[0].idx, path[1], path[2:]
        label = f"input {first.idx}" if head == 0 else str(first.key)
        out.append(label + "".join(str(k) for k in rest))
    return out


def check_index(idx, size: int, *, what: str, extent: int = 1):
    """Checks `0 <= idx` and `idx + extent <= size`; returns `idx` as an int or int32 scalar.

    Args:
        idx: an integer scalar: Python int, 0-d integer array, or traced 0-d integer.
        size: the extent of the indexed axis.
        what: how the error names the axis, e.g. "state `total` (axis 0)".
        extent: how many positions starting at `idx` are touched.

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
    sink = active_sink()
    if not jxi.is_tracer(idx):
        value = int(idx)
        if value < 0 or value + extent > size:
            named = sink is not None and id(idx) in sink.direct
            raise_index_error(what, size, extent, value, sink.direct[id(idx)][1] if named else None)
        return value
    if sink is not None and id(idx) in sink.direct:
        leaf, arg = sink.direct[id(idx)]
        sink.rules.append(HostRule(leaf, arg, what, size, extent))
        return idx
    if getattr(_local, "trusted", None):
        return idx
    idx = jnp.asarray(idx, jnp.int32)
    ok = (idx >= 0) & (idx <= size - extent)
    if sink is not None:
        sink.checks.append(_Check(what, size, extent, ok, idx))
        return idx

    # Outside a graph nothing can gate the writes; fail the whole computation instead
    # (eqx.error_if stays correct under vmap, where a cond would run both branches).
    return eqx.error_if(
        idx,
        ~ok,
        f"[E1401] {what} has size {size}: an index outside 0..{size - extent} was "
        "given (JAX would clamp it); pass 0 <= index <= size - extent",
    )


def gate(new: jax.Array, old: jax.Array) -> jax.Array:
    """`new`, or `old` when the graph's in-program checks failed on this call (a no-op write)."""
    sink = active_sink()
    if sink is None or sink.ok_all is None:
        return new
    return jnp.where(sink.ok_all, new, old)
