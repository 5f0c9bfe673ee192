"""The host's view of a graph's weights and state, outside `body`: `graph.total.host` and friends."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["ParamHandle", "StateHandle"]


class _Handle:
    def __init__(self, core, attr: str):
        self._core = core
        self._attr = attr

    @property
    def _decl(self):
        return self._core.decls[self._attr]

    @property
    def name(self) -> str:
        return self._decl.name

    @property
    def shape(self):
        """The shape (a tuple), or for a pytree the shapes by leaf name."""
        d = self._decl
        return d.shapes[0] if d.is_array else dict(zip(d.leaf_names, d.shapes))

    @property
    def dtype(self):
        """The dtype, or for a pytree the dtypes by leaf name."""
        d = self._decl
        return d.dtypes[0] if d.is_array else dict(zip(d.leaf_names, d.dtypes))

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
        return self._core.host_copy(self._attr)

    @property
    def device(self) -> Any:
        """The device array (or pytree) holding this state now; invalid after the next call."""
        return self._core.device_state_value(self._attr)

    def read(self) -> Any:
        """A numpy copy of the device state (same as `graph.read(name)`)."""
        return self._core.read(self._attr)

    def __repr__(self) -> str:
        return f"StateHandle({self.name!r}, shape={self.shape}, dtype={self.dtype})"


class ParamHandle(_Handle):
    """A weight seen from the host: `host` is its value as numpy, `device` the uploaded copy."""

    @property
    def host(self) -> Any:
        d = self._decl
        vals = self._core.param_values(self._attr)
        return np.array(vals[0]) if d.is_array else d.build([np.array(v) for v in vals])

    @property
    def device(self) -> Any:
        """The weight on the device, uploaded on first use and then never again."""
        return self._core.device_param_value(self._attr)

    def __repr__(self) -> str:
        return f"ParamHandle({self.name!r}, shape={self.shape}, dtype={self.dtype})"
