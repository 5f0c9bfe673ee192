"""A graph's weight or state seen from the host, outside `body`: `graph.total.host` and friends."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from .._traceback import api_boundary

__all__ = ["ParamHandle", "StateHandle"]


@api_boundary
class StateHandle:
    """A state seen from the host (outside `body`).

    `host` is a numpy copy of the host mirror that `graph.reference(...)` reads and writes;
    `device` is the live device buffer of the compiled path (donated to, and replaced by, every
    call); `read()` copies the device state to the host (as `graph.read(name)`).
    """

    def __init__(self, graph, attr: str):
        self._graph = graph
        self._attr = attr
        self._decl = graph._decls[attr]

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

    @property
    def host(self) -> Any:
        g = self._graph
        return jax.tree.map(np.array, g._unpack(g._host_states())[self._attr])

    @property
    def device(self) -> Any:
        return self._graph._unpack(self._graph._states())[self._attr]

    def read(self) -> Any:
        return self._graph.read(self.name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, shape={self.shape}, dtype={self.dtype})"


@api_boundary
class ParamHandle(StateHandle):
    """A weight seen from the host: `host` is its value as numpy, `device` the uploaded copy
    (uploaded on first use, then never again)."""

    @property
    def host(self) -> Any:
        return jax.tree.map(np.array, self._graph._weights()[self._attr])

    @property
    def device(self) -> Any:
        return self._graph._shell_now().model[self._attr]

    def read(self) -> Any:
        return self.host
