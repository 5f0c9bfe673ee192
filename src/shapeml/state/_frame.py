"""What `body` sees during one run: weight values, and views that read and write the state.

The same body runs in two modes: traced inside the compiled step (values are tracers, writes are
functional `dynamic_update_slice`s that donation turns into in-place updates) and eagerly on the
host for `Graph.reference` (reads are eager JAX arrays on the CPU; array states are numpy mirrors,
written copy-on-write and committed only when the body returns, so an error mid-body changes
nothing).
"""

from __future__ import annotations

import threading
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax_internals as jxi
from . import _index
from ._decl import StateDecl
from ._errors import StateIndexTypeError, StateWriteError

__all__ = ["Frame", "StateView", "active_frame"]

_local = threading.local()


def active_frame(graph) -> Frame | None:
    """The frame of `graph`'s body while it runs (on this thread), else None."""
    for frame in reversed(getattr(_local, "frames", ())):
        if frame.graph is graph:
            return frame
    return None


class Frame:
    """The values one run of a body reads and writes, keyed by declaration name."""

    def __init__(
        self,
        graph,
        mode: str,
        params: dict[str, Any],
        states: dict[str, Any],
        decls: dict[str, StateDecl],
    ):
        self.graph = graph
        self.mode = mode  # "trace" or "host"
        self.params = params
        self.states = states
        self.decls = decls
        self.copied: set[str] = set()

    def __enter__(self):
        _local.__dict__.setdefault("frames", []).append(self)
        return self

    def __exit__(self, *exc):
        _local.frames.pop()

    def state(self, name: str):
        decl = self.decls[name]
        return StateView(self, name) if decl.is_array else self.states[name]

    def assign(self, name: str, value) -> None:
        """Replaces a whole state (`self.total = new`), checking its structure, shapes, dtypes."""
        decl = self.decls[name]
        what = f"state `{decl.name}`"
        if decl.is_array:
            leaves = [_checked_value(value, decl.shapes[0], decl.dtypes[0], what, "")]
        else:
            got = jax.tree_util.tree_structure(_arrays_of(value, decl))
            if got != decl.treedef:
                raise StateWriteError(
                    f"{what} has the pytree structure {decl.treedef}, but was assigned a value "
                    f"of structure {got}",
                    fix="assign a value built from the state itself, e.g. self.cache = "
                    "self.cache.write(...)",
                )
            leaves = [
                _checked_value(x, s, d, f"{what} (leaf `{n}`)", "")
                for x, s, d, n in zip(decl.split(value), decl.shapes, decl.dtypes, decl.leaf_names)
            ]
        if self.mode == "host":
            leaves = [np.array(x) if decl.is_array else x for x in leaves]
            self.copied.add(name)
        self.states[name] = leaves[0] if decl.is_array else decl.build(leaves)


def _arrays_of(value, decl: StateDecl):
    return eqx.filter(value, eqx.is_array) if decl.static is not None else value


def _dtype_of(value):
    if isinstance(value, bool | int | float) and not isinstance(value, np.generic):
        return None  # a Python number takes the state's dtype
    return np.dtype(value.dtype) if hasattr(value, "dtype") else np.asarray(value).dtype


def _checked_value(value, shape: tuple[int, ...], dtype: np.dtype, what: str, where: str):
    dt = _dtype_of(value)
    if dt is None:
        return np.full(shape, value, dtype)
    if tuple(np.shape(value)) != tuple(shape):
        raise StateWriteError(
            f"{what}{where} takes a value of shape {tuple(shape)} ({dtype}), but was given "
            f"shape {tuple(np.shape(value))}",
            fix=f"write an array of shape {tuple(shape)}; nothing is broadcast into a state",
        )
    if dt != dtype:
        raise StateWriteError(
            f"{what}{where} has dtype {dtype}, but was given a value of dtype {dt}",
            fix=f"cast it first: value.astype(jnp.{dtype.name})",
        )
    return value


def _resolve(idx, shape: tuple[int, ...], what: str):
    """Per axis `(start, size, keep)` for an index, with every start checked against the shape."""
    items = idx if isinstance(idx, tuple) else (idx,)
    if sum(i is Ellipsis for i in items) > 1:
        raise StateIndexTypeError(
            f"{what} was indexed with more than one `...`", fix="use at most one ellipsis"
        )
    if any(i is Ellipsis for i in items):
        at = next(k for k, i in enumerate(items) if i is Ellipsis)
        fill = (slice(None),) * (len(shape) - len(items) + 1)
        items = items[:at] + fill + items[at + 1 :]
    if len(items) > len(shape):
        raise StateIndexTypeError(
            f"{what} has {len(shape)} axes (shape {shape}), but was indexed with {len(items)}",
            fix="index at most one position or slice per axis",
        )
    items = tuple(items) + (slice(None),) * (len(shape) - len(items))
    out = []
    for axis, (item, size) in enumerate(zip(items, shape)):
        where = f"{what} (axis {axis})" if len(shape) > 1 else what
        if isinstance(item, slice):
            start, stop, step = item.start, item.stop, item.step
            bounds = [b for b in (start, stop) if b is not None]
            if step not in (None, 1) or not all(
                isinstance(b, int | np.integer) and not isinstance(b, bool) for b in bounds
            ):
                raise StateIndexTypeError(
                    f"{where} was sliced with {item!r}; a slice of a state needs static int "
                    "bounds and step 1",
                    fix="for a slice starting at a per-call position use span(pos, size)",
                )
            start = 0 if start is None else int(start)
            stop = size if stop is None else int(stop)
            if not 0 <= start <= stop <= size:
                raise _index.StateIndexError(
                    f"{where} has size {size}, but the slice {start}:{stop} is outside it",
                    fix=f"slice within 0:{size} (negative bounds are not counted from the end)",
                )
            out.append((start, stop - start, True))
        elif isinstance(item, _index.span):
            out.append(
                (
                    _index.check_index(item.start, size, what=where, extent=item.size),
                    item.size,
                    True,
                )
            )
        else:
            out.append((_index.check_index(item, size, what=where), 1, False))
    return out


class StateView:
    """A state as `body` sees it: `view[pos]` reads, `view[pos] = new` writes, in place.

    Indices are integer scalars (per-call values are fine), static slices, or
    `span(start, size)`; every index is bounds-checked, never clamped.
    """

    def __init__(self, frame: Frame, name: str):
        self._frame = frame
        self._name = name

    @property
    def name(self) -> str:
        return self._frame.decls[self._name].name

    @property
    def shape(self) -> tuple[int, ...]:
        return self._frame.decls[self._name].shapes[0]

    @property
    def dtype(self) -> np.dtype:
        return self._frame.decls[self._name].dtypes[0]

    @property
    def value(self):
        """The whole state, as of this point in the body."""
        return self._frame.states[self._name]

    def set(self, value) -> None:
        """Replaces the whole state (same shape and dtype)."""
        self._frame.assign(self._name, value)

    def __getitem__(self, idx):
        spec = _resolve(idx, self.shape, f"state `{self.name}`")
        value = self._frame.states[self._name]
        out_shape = tuple(size for _, size, keep in spec if keep)
        if self._frame.mode == "host":
            part = value[tuple(slice(s, s + n) for s, n, _ in spec)]
            return jnp.asarray(np.array(part).reshape(out_shape))
        part = lax.dynamic_slice(value, [s for s, _, _ in spec], [n for _, n, _ in spec])
        return part.reshape(out_shape)

    def __setitem__(self, idx, new) -> None:
        spec = _resolve(idx, self.shape, f"state `{self.name}`")
        out_shape = tuple(size for _, size, keep in spec if keep)
        new = _checked_value(new, out_shape, self.dtype, f"state `{self.name}`", f"[{_show(idx)}]")
        full_shape = tuple(n for _, n, _ in spec)
        frame, name = self._frame, self._name
        if frame.mode == "host":
            if name not in frame.copied:  # copy-on-write: the mirror changes only on success
                frame.states[name] = np.array(frame.states[name])
                frame.copied.add(name)
            frame.states[name][tuple(slice(s, s + n) for s, n, _ in spec)] = np.reshape(
                np.asarray(new), full_shape
            )
            return
        value = frame.states[name]
        starts = [s for s, _, _ in spec]
        new = jnp.reshape(new, full_shape)
        new = _index.gate(new, lax.dynamic_slice(value, starts, list(full_shape)))
        frame.states[name] = lax.dynamic_update_slice(value, new, starts)

    def __repr__(self) -> str:
        return f"StateView({self.name!r}, shape={self.shape}, dtype={self.dtype})"


def _show(idx) -> str:
    items = idx if isinstance(idx, tuple) else (idx,)
    return ", ".join("<traced>" if jxi.is_tracer(i) else repr(i) for i in items)
