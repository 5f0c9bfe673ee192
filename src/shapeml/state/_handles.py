"""The host's view of a graph's weights and state, outside `body`: `graph.total.host` and friends."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["ParamHandle", "StateHandle"]


class _Handle:
    def __init__(self, storage, attr: str):
        self._storage = storage
        self._attr = attr

    @property
    def _decl(self):
        return self._storage.decls[self._attr]

    @property
    def name(self) -> str:
        return self._decl.name

    @property
    def shape(self):
        """The shape (a tuple), or for a pytree the shapes by leaf name."""
        d = self._decl
        return d.leaves[""][0] if d.is_array else {n: s for n, (s, _) in d.leaves.items()}

    @property
    def dtype(self):
        """The dtype, or for a pytree the dtypes by leaf name."""
        d = self._decl
        return d.leaves[""][1] if d.is_array else {n: t for n, (_, t) in d.leaves.items()}

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
        return self._storage.host_copy(self._attr)

    @property
    def device(self) -> Any:
        """The device array (or pytree) holding this state now; invalid after the next call."""
        return self._storage.build_state(self._attr, self._storage.device_by_name())

    def read(self) -> Any:
        """A numpy copy of the device state (same as `graph.read(name)`)."""
        return self._storage.read(self._attr)

    def __repr__(self) -> str:
        return f"StateHandle({self.name!r}, shape={self.shape}, dtype={self.dtype})"


class ParamHandle(_Handle):
    """A weight seen from the host: `host` is its value as numpy, `device` the uploaded copy."""

    @property
    def host(self) -> Any:
        values = self._storage.weight_values(self._attr)
        return self._decl.build({n: np.array(v) for n, v in values.items()})

    @property
    def device(self) -> Any:
        """The weight on the device, uploaded on first use and then never again."""
        return self._storage.device_weights()[self._attr]

    def __repr__(self) -> str:
        return f"ParamHandle({self.name!r}, shape={self.shape}, dtype={self.dtype})"
