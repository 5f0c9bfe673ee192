"""The host's view of a graph's weights and states, outside `body`: `graph.total.host` and friends."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

__all__ = ["ParamHandle", "StateHandle"]


class _Handle:
    def __init__(self, graph, attr: str):
        self._graph = graph
        self._attr = attr

    @property
    def _decl(self):
        return self._graph._decls[self._attr]

    @property
    def name(self) -> str:
        return self._decl.name

    @property
    def shape(self):
        """The shape (a tuple), or for a pytree the shapes by leaf name."""
        leaves = self._decl.leaves
        return leaves[""].shape if "" in leaves else {n: s.shape for n, s in leaves.items()}

    @property
    def dtype(self):
        """The dtype, or for a pytree the dtypes by leaf name."""
        leaves = self._decl.leaves
        return leaves[""].dtype if "" in leaves else {n: s.dtype for n, s in leaves.items()}

    @property
    def sharding(self):
        return self._decl.sharding


class StateHandle(_Handle):
    """A state seen from the host (outside `body`).

    `host` is the host mirror that `graph.reference(...)` reads and writes; `device` is the live
    device buffer of the compiled path (replaced, its old buffer donated, by every call);
    `graph.read(name)` copies the device state to the host.
    """

    @property
    def host(self) -> Any:
        """A numpy copy of the host mirror of this state (the reference path's state)."""
        g = self._graph
        return jax.tree.map(np.array, g._unpack(g._host_states())[self._attr])

    @property
    def device(self) -> Any:
        """The device array (or pytree) holding this state now; invalid after the next call."""
        return self._graph._unpack(self._graph._states())[self._attr]

    def read(self) -> Any:
        """A numpy copy of the device state (same as `graph.read(name)`)."""
        return self._graph.read(self.name)

    def __repr__(self) -> str:
        return f"StateHandle({self.name!r}, shape={self.shape}, dtype={self.dtype})"


class ParamHandle(_Handle):
    """A weight seen from the host: `host` is its value as numpy, `device` the uploaded copy."""

    @property
    def host(self) -> Any:
        return jax.tree.map(np.array, self._graph._weights()[self._attr])

    @property
    def device(self) -> Any:
        """The weight on the device, uploaded on first use and then never again."""
        return self._graph._compiled().model[self._attr]

    def __repr__(self) -> str:
        return f"ParamHandle({self.name!r}, shape={self.shape}, dtype={self.dtype})"
