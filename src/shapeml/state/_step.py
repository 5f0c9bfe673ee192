"""One run of a graph's body: what `self.<name>` means inside it, and its index checks.

The same `Step` serves the compiled path (values are tracers, traced once) and the reference path
(eager arrays on the host CPU, where every index is concrete and checked at once). Writes update
the state in body order, as plain JAX would (`dynamic_update_slice`, in place under donation), and
reads see them. Every traced index goes into the step's `IndexChecks` (also those of every `KVCache`
in a state, bound to the list while the body runs); the graph runs those checks before the step, so
a step with a bad index never runs at all.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax_internals as jxi
from .._validate import shorten
from ._decl import Decl, ParamDecl, StateDecl
from ._errors import StateIndexError, StateIndexTypeError, StateWriteError
from ._index import IndexChecks, check_index, span
from ._kvcache import KVCache

__all__ = ["StateView", "Step", "bind_caches"]


class Step:
    """The weights and states one run of `body` sees, by attribute, and its index checks."""

    def __init__(
        self,
        decls: dict[str, Decl],
        weights: dict[str, Any],
        states: dict[str, Any],
        checks: IndexChecks,
    ):
        self.decls = decls
        self.weights = weights
        self.states = dict(states)
        self.kinds = {attr: type(value) for attr, value in states.items()}
        self.checks = checks
        self._bound: dict[str, IndexChecks] = {}

    def get(self, attr: str):
        """`self.<attr>` inside body: a weight's value, a `StateView`, or a pytree state."""
        decl = self.decls[attr]
        if isinstance(decl, ParamDecl):
            return self.weights[attr]
        if decl.is_array:
            return StateView(self, attr)
        # Every KVCache in a pytree state, nested or not, records its indices in this step's
        # list (one bound list per state: the same static field each time it is read).
        if attr not in self._bound:
            self._bound[attr] = self.checks.named(f"state `{decl.name}`")
        return bind_caches(self.states[attr], self._bound[attr])

    def assign(self, attr: str, value) -> None:
        """Replaces a whole state (`self.total = new`), checking its leaves, shapes, dtypes."""
        decl: StateDecl = self.decls[attr]  # type: ignore[assignment]
        what = f"state `{decl.name}`"
        if decl.is_array:
            shape, dtype = decl.leaves[""]
            value = jnp.asarray(checked_value(value, shape, dtype, what, ""))
        else:
            kind = self.kinds[attr]
            got = decl.split(value) if isinstance(value, kind) else None
            if got is None or list(got) != list(decl.leaves):
                raise StateWriteError(
                    f"{what} holds a {kind.__name__} with leaves {list(decl.leaves)}, but was "
                    f"assigned a {type(value).__name__}"
                    + (f" with leaves {list(got)}" if got is not None else ""),
                    fix="assign a value built from the state itself, e.g. self.cache = "
                    "self.cache.write(...)",
                )
            for leaf, (shape, dtype) in decl.leaves.items():
                checked_value(got[leaf], shape, dtype, f"{what} (leaf `{leaf}`)", "")
        self.states[attr] = value

    def read(self, attr: str, idx):
        decl = self.decls[attr]
        spec = _resolve(idx, decl.leaves[""][0], f"state `{decl.name}`", self.checks)
        part = lax.dynamic_slice(
            self.states[attr], [s for s, _, _ in spec], [n for _, n, _ in spec]
        )
        return part.reshape(tuple(n for _, n, keep in spec if keep))

    def write(self, attr: str, idx, new) -> None:
        decl = self.decls[attr]
        shape, dtype = decl.leaves[""]
        what = f"state `{decl.name}`"
        spec = _resolve(idx, shape, what, self.checks)
        new = checked_value(new, tuple(n for _, n, k in spec if k), dtype, what, f"[{_show(idx)}]")
        update = jnp.reshape(new, [n for _, n, _ in spec])
        starts = [s for s, _, _ in spec]
        self.states[attr] = lax.dynamic_update_slice(self.states[attr], update, starts)


def bind_caches(tree, checks: IndexChecks | None):
    """`tree` with every `KVCache` in it (at any depth) checking its positions into `checks`;
    `None` unbinds them, as for everything that leaves a graph's body."""
    return jax.tree.map(
        lambda x: x.with_checks(checks) if isinstance(x, KVCache) else x,
        tree,
        is_leaf=lambda x: isinstance(x, KVCache),
    )


class StateView:
    """A state as `body` sees it: `view[pos]` reads, `view[pos] = new` writes, in place.

    Indices are integer scalars (per-call values are fine), static slices, or
    `span(start, size)`; every index is bounds-checked (recorded in the step's `IndexChecks`),
    never clamped.
    """

    def __init__(self, step: Step, attr: str):
        self._step = step
        self._attr = attr

    @property
    def name(self) -> str:
        return self._step.decls[self._attr].name

    @property
    def shape(self) -> tuple[int, ...]:
        return self._step.decls[self._attr].leaves[""][0]

    @property
    def dtype(self) -> np.dtype:
        return self._step.decls[self._attr].leaves[""][1]

    @property
    def value(self):
        """The whole state, as of this point in the body."""
        return self._step.states[self._attr]

    def set(self, value) -> None:
        """Replaces the whole state (same shape and dtype)."""
        self._step.assign(self._attr, value)

    def __getitem__(self, idx):
        return self._step.read(self._attr, idx)

    def __setitem__(self, idx, new) -> None:
        self._step.write(self._attr, idx, new)

    def __repr__(self) -> str:
        return f"StateView({self.name!r}, shape={self.shape}, dtype={self.dtype})"


def _dtype_of(value, what: str):
    if isinstance(value, bool | int | float) and not isinstance(value, np.generic):
        return None  # a Python number takes the state's dtype
    if not hasattr(value, "dtype") or not hasattr(value, "shape"):
        raise StateWriteError(
            f"{what} was given {shorten(value)} ({type(value).__name__}), not an array",
            fix="write a jax array (or a Python number); a list is not converted inside body",
        )
    return np.dtype(value.dtype)


def checked_value(value, shape: tuple[int, ...], dtype: np.dtype, what: str, where: str):
    """`value` if it has exactly this shape and dtype (a Python number is filled in).

    Raises:
        StateWriteError: (E1403) naming the state, the expected and the given shape or dtype.
    """
    dt = _dtype_of(value, what + where)
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


def _resolve(idx, shape: tuple[int, ...], what: str, checks: IndexChecks):
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
            start = check_index(item.start, size, what=where, extent=item.size, checks=checks)
            out.append((start, item.size, True))
        else:
            out.append((check_index(item, size, what=where, checks=checks), 1, False))
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
