"""One run of a graph's body: what `self.<name>` means inside it.

The same `Run` serves the compiled path (values are tracers, traced once) and the reference path
(eager arrays on the host CPU, where every index is concrete and checked at once). Writes update
the state in body order, as plain JAX would (`dynamic_update_slice`, in place under donation), and
reads see them. Every index goes through `check_index`, whose checks the shell runs before the
step, so a step with a bad index never runs at all.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax_internals as jxi
from .._traceback import api_boundary
from .._validate import shorten
from ._decl import Declared
from ._index import StateIndexError, StateIndexTypeError, check_index, span
from ._state_errors import StateWriteError

__all__ = ["Run", "StateView", "checked_value"]


class Run:
    """The weights and states one run of `body` sees, by attribute."""

    def __init__(self, decls: dict[str, Declared], weights: dict[str, Any], states: dict[str, Any]):
        self.decls = decls
        self.weights = weights
        self.states = dict(states)

    def get(self, attr: str):
        """`self.<attr>` inside body: a weight's value, a `StateView`, or a pytree state."""
        decl = self.decls[attr]
        if decl.kind == "param":
            return self.weights[attr]
        if isinstance(decl.template, jax.ShapeDtypeStruct):
            return StateView(self, attr)
        return self.states[attr]

    def assign(self, attr: str, value) -> None:
        """Replaces a whole state (`self.total = new`), checking its leaves, shapes, dtypes."""
        decl = self.decls[attr]
        what = f"state `{decl.name}`"
        spec = decl.template
        if isinstance(spec, jax.ShapeDtypeStruct):
            value = jnp.asarray(checked_value(value, spec.shape, spec.dtype, what, ""))
        else:
            same = jax.tree.structure(value) == jax.tree.structure(spec)
            if not same:
                raise StateWriteError(
                    f"{what} holds a {type(spec).__name__} of leaves {list(decl.leaves)}, but was "
                    f"assigned a {type(value).__name__} of another structure",
                    fix="assign a value built from the state itself, e.g. self.cache = "
                    "self.cache.write(...)",
                )
            flat = jax.tree_util.tree_flatten_with_path(value)[0]
            for (_, x), (leaf, s) in zip(flat, decl.leaves.items(), strict=True):
                checked_value(x, s.shape, s.dtype, f"{what} (leaf `{leaf}`)", "")
        self.states[attr] = value

    def read(self, attr: str, idx):
        spec = self.decls[attr].template
        parts = _resolve(idx, spec.shape, f"state `{self.decls[attr].name}`")
        part = lax.dynamic_slice(
            self.states[attr], [s for s, _, _ in parts], [n for _, n, _ in parts]
        )
        return part.reshape(tuple(n for _, n, keep in parts if keep))

    def write(self, attr: str, idx, new) -> None:
        spec = self.decls[attr].template
        what = f"state `{self.decls[attr].name}`"
        parts = _resolve(idx, spec.shape, what)
        kept = tuple(n for _, n, keep in parts if keep)
        new = checked_value(new, kept, spec.dtype, what, f"[{_show(idx)}]")
        update = jnp.reshape(new, [n for _, n, _ in parts])
        starts = [s for s, _, _ in parts]
        self.states[attr] = lax.dynamic_update_slice(self.states[attr], update, starts)


@api_boundary
class StateView:
    """A state as `body` sees it: `view[pos]` reads, `view[pos] = new` writes, in place.

    Indices are integer scalars (per-call values are fine), static slices, or `span(start, size)`;
    every index is bounds-checked before the step runs, never clamped.
    """

    def __init__(self, run: Run, attr: str):
        self._run = run
        self._attr = attr

    @property
    def name(self) -> str:
        return self._run.decls[self._attr].name

    @property
    def shape(self) -> tuple[int, ...]:
        return self._run.decls[self._attr].template.shape

    @property
    def dtype(self) -> np.dtype:
        return self._run.decls[self._attr].template.dtype

    @property
    def value(self):
        """The whole state, as of this point in the body."""
        return self._run.states[self._attr]

    def set(self, value) -> None:
        """Replaces the whole state (same shape and dtype)."""
        self._run.assign(self._attr, value)

    def __getitem__(self, idx):
        return self._run.read(self._attr, idx)

    def __setitem__(self, idx, new) -> None:
        self._run.write(self._attr, idx, new)

    def __repr__(self) -> str:
        return f"StateView({self.name!r}, shape={self.shape}, dtype={self.dtype})"


def checked_value(value, shape: tuple[int, ...], dtype: np.dtype, what: str, where: str):
    """`value` if it has exactly this shape and dtype (a Python number is filled in).

    Raises:
        StateWriteError: (E1403) naming the state, the expected and the given shape or dtype.
    """
    if isinstance(value, bool | int | float) and not isinstance(value, np.generic):
        return np.full(shape, value, dtype)  # a Python number takes the state's dtype
    if not hasattr(value, "dtype") or not hasattr(value, "shape"):
        raise StateWriteError(
            f"{what}{where} was given {shorten(value)} ({type(value).__name__}), not an array",
            fix="write a jax array (or a Python number); a list is not converted inside body",
        )
    if tuple(np.shape(value)) != tuple(shape):
        raise StateWriteError(
            f"{what}{where} takes a value of shape {tuple(shape)} ({dtype}), but was given "
            f"shape {tuple(np.shape(value))}",
            fix=f"write an array of shape {tuple(shape)}; nothing is broadcast into a state",
        )
    if np.dtype(value.dtype) != dtype:
        raise StateWriteError(
            f"{what}{where} has dtype {dtype}, but was given a value of dtype {value.dtype}",
            fix=f"cast it first: value.astype(jnp.{np.dtype(dtype).name})",
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
        items = items[:at] + (slice(None),) * (len(shape) - len(items) + 1) + items[at + 1 :]
    if len(items) > len(shape):
        raise StateIndexTypeError(
            f"{what} has {len(shape)} axes (shape {shape}), but was indexed with {len(items)}",
            fix="index at most one position or slice per axis",
        )
    items = tuple(items) + (slice(None),) * (len(shape) - len(items))
    out = []
    for axis, (item, size) in enumerate(zip(items, shape, strict=True)):
        where = f"{what} (axis {axis})" if len(shape) > 1 else what
        if isinstance(item, slice):
            out.append(_static_slice(item, size, where))
        elif isinstance(item, span):
            out.append(
                (check_index(item.start, size, what=where, extent=item.size), item.size, True)
            )
        else:
            out.append((check_index(item, size, what=where), 1, False))
    return out


def _static_slice(item: slice, size: int, where: str):
    start, stop, step = item.start, item.stop, item.step
    bounds = [b for b in (start, stop) if b is not None]
    if step not in (None, 1) or not all(
        isinstance(b, int | np.integer) and not isinstance(b, bool) for b in bounds
    ):
        raise StateIndexTypeError(
            f"{where} was sliced with {item!r}; a slice of a state needs static int bounds and "
            "step 1",
            fix="for a slice starting at a per-call position use span(pos, size)",
        )
    start = 0 if start is None else int(start)
    stop = size if stop is None else int(stop)
    if not 0 <= start <= stop <= size:
        raise StateIndexError(
            f"{where} has size {size}, but the slice {start}:{stop} is outside it",
            fix=f"slice within 0:{size} (negative bounds are not counted from the end)",
        )
    return (start, stop - start, True)


def _show(idx) -> str:
    items = idx if isinstance(idx, tuple) else (idx,)
    return ", ".join("<traced>" if jxi.is_tracer(i) else repr(i) for i in items)
