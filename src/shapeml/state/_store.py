"""A graph's storage: its declarations, device copies, host mirror, and the checked loads into them.

Weights are uploaded once (on first use) and re-uploaded only by `load_state_dict`; state lives on
the device, its buffers replaced by each call's donated outputs; the host mirror is what the
reference path runs against.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._cast import cast_host_array
from .._errors import similar
from ._decl import Decl, ParamDecl, StateDecl
from ._errors import (
    GraphDeclarationError,
    LoadStateDictError,
    StateNotFoundError,
    UnboundParamError,
)

__all__ = ["Store"]


def _host_device():
    return jax.devices("cpu")[0]


class Store:
    """Everything a `Graph` holds besides its compiled programs."""

    def __init__(self, graph_name: str):
        self.graph_name = graph_name
        self.decls: dict[str, Decl] = {}  # attribute -> declaration, in declaration order
        self.sealed = False
        self._params: dict[str, ParamDecl] = {}
        self._states: dict[str, StateDecl] = {}
        self._device_params: dict[str, list[jax.Array]] = {}
        self._device_states: dict[str, list[jax.Array]] = {}
        self._host_states: dict[str, Any] = {}
        self._host_params: dict[str, Any] = {}

    # declarations ---------------------------------------------------------------------------
    @property
    def params(self) -> dict[str, ParamDecl]:
        return self._params

    @property
    def states(self) -> dict[str, StateDecl]:
        return self._states

    def declare(self, attr: str, decl: Decl) -> None:
        if self.sealed:
            raise GraphDeclarationError(
                f"`{self.graph_name}.{attr}` was declared after the graph was first called",
                fix="declare every param and state in __init__, before the first call",
            )
        decl.name = decl.name or attr
        for other_attr, other in self.decls.items():
            if other_attr != attr and other.name == decl.name:
                raise GraphDeclarationError(
                    f"`{self.graph_name}` declares the name `{decl.name}` twice "
                    f"(attributes `{other_attr}` and `{attr}`)",
                    fix="give each state its own name=",
                )
        self.decls[attr] = decl
        self._params = {a: d for a, d in self.decls.items() if isinstance(d, ParamDecl)}
        self._states = {a: d for a, d in self.decls.items() if isinstance(d, StateDecl)}
        self._device_params.pop(attr, None)
        self._host_params.pop(attr, None)
        self._device_states.pop(attr, None)
        self._host_states.pop(attr, None)

    def attr_of(self, name: str) -> str:
        if name in self.decls:
            return name
        for attr, decl in self.decls.items():
            if decl.name == name:
                return attr
        names = [d.name for d in self.decls.values()]
        raise StateNotFoundError(
            f"`{self.graph_name}` has no weight or state named `{name}` (it has: "
            f"{', '.join(f'`{n}`' for n in names) or 'none'})",
            fix=similar(name, names, what="state") or "declare it in __init__ with state(...)",
        )

    # weights ----------------------------------------------------------------------------------
    def param_values(self, attr: str) -> list[np.ndarray]:
        decl = self.decls[attr]
        if decl.values is None:
            raise UnboundParamError(
                f"weight `{decl.name}` of `{self.graph_name}` was declared by shape "
                f"{decl.shapes[0]} and never bound",
                fix=f"call graph.load_state_dict({{'{decl.name}': array}}) before calling the graph",
            )
        return decl.values

    def device_param_leaves(self) -> list[jax.Array]:
        """Every weight leaf on the device, uploaded on first use and then reused as is."""
        out = []
        for attr, decl in self.params.items():
            if attr not in self._device_params:
                vals = self.param_values(attr)
                self._device_params[attr] = [_put(v, decl.sharding) for v in vals]
            out += self._device_params[attr]
        return out

    def host_param_value(self, attr: str):
        """The weight as the reference path sees it: eager JAX arrays on the host (CPU) device."""
        if attr not in self._host_params:
            decl = self.decls[attr]
            leaves = [jax.device_put(v, _host_device()) for v in self.param_values(attr)]
            self._host_params[attr] = leaves[0] if decl.is_array else decl.build(leaves)
        return self._host_params[attr]

    def device_param_value(self, attr: str):
        self.device_param_leaves()
        decl = self.decls[attr]
        leaves = self._device_params[attr]
        return leaves[0] if decl.is_array else decl.build(leaves)

    # state --------------------------------------------------------------------------------------
    def _zeros(self, decl: StateDecl) -> list[jax.Array]:
        return [_put_owned(np.zeros(s, d), decl.sharding) for s, d in zip(decl.shapes, decl.dtypes)]

    def device_state_leaves(self) -> list[jax.Array]:
        out = []
        for attr, decl in self.states.items():
            if attr not in self._device_states:
                self._device_states[attr] = self._zeros(decl)
            out += self._device_states[attr]
        return out

    def set_device_state_leaves(self, leaves: list[jax.Array]) -> None:
        at = 0
        for attr, decl in self.states.items():
            n = len(decl.shapes)
            self._device_states[attr] = list(leaves[at : at + n])
            at += n

    def device_state_value(self, attr: str):
        self.device_state_leaves()
        decl = self.decls[attr]
        leaves = self._device_states[attr]
        return leaves[0] if decl.is_array else decl.build(leaves)

    def read(self, attr: str):
        """A host numpy copy of the device state (a copy: the buffer is donated by the next call)."""
        self.device_state_leaves()
        decl = self.decls[attr]
        leaves = [np.array(x, copy=True) for x in self._device_states[attr]]
        return leaves[0] if decl.is_array else decl.build(leaves)

    def host_state(self, attr: str):
        """The host mirror the reference path runs against: numpy for an array state, host-device
        jax arrays for a pytree (whose methods, e.g. `KVCache.write`, use jnp)."""
        if attr not in self._host_states:
            decl = self.decls[attr]
            zeros = [np.zeros(s, d) for s, d in zip(decl.shapes, decl.dtypes)]
            self._host_states[attr] = (
                zeros[0]
                if decl.is_array
                else decl.build([jax.device_put(z, _host_device()) for z in zeros])
            )
        return self._host_states[attr]

    def set_host_state(self, attr: str, value) -> None:
        self._host_states[attr] = value

    def host_copy(self, attr: str):
        decl = self.decls[attr]
        value = self.host_state(attr)
        if decl.is_array:
            return np.array(value, copy=True)
        return decl.build([np.array(x, copy=True) for x in decl.split(value)])

    def reset(self, attrs: list[str]) -> None:
        for attr in attrs:
            self._device_states.pop(attr, None)
            self._host_states.pop(attr, None)

    # load / save --------------------------------------------------------------------------------
    def entries(self) -> dict[str, tuple[str, int, tuple[int, ...], np.dtype]]:
        """Dotted entry name -> (attribute, leaf index, shape, dtype) for every weight and state."""
        out = {}
        for attr, decl in self.decls.items():
            for i, (full, s, d) in enumerate(zip(decl.full_names(), decl.shapes, decl.dtypes)):
                out[full] = (attr, i, s, d)
        return out

    def state_dict(self) -> dict[str, np.ndarray]:
        out = {}
        for full, (attr, i, _, _) in self.entries().items():
            decl = self.decls[attr]
            if isinstance(decl, ParamDecl):
                if decl.values is not None:
                    out[full] = np.array(decl.values[i], copy=True)
            else:
                self.device_state_leaves()
                out[full] = np.array(self._device_states[attr][i], copy=True)
        return out

    def load(self, entries: dict[str, Any]) -> None:
        """Checks every entry, then binds them all (weights and, when given, states) or none."""
        table = self.entries()
        problems: list[str] = []
        hints: list[str] = []
        for full, (attr, _, _, _) in table.items():
            if isinstance(self.decls[attr], ParamDecl) and full not in entries:
                problems.append(f"missing weight `{full}`")
        converted = {}
        for key, value in entries.items():
            if key not in table:
                hint = similar(key, list(table), what="weight or state")
                problems.append(f"unexpected key `{key}`" + (f" ({hint})" if hint else ""))
                if hint:
                    hints.append(hint)
                continue
            _, _, shape, dtype = table[key]
            arr = np.asarray(value)
            if tuple(arr.shape) != tuple(shape):
                problems.append(f"`{key}` has shape {tuple(arr.shape)}, expected {tuple(shape)}")
                continue
            cast, why = cast_host_array(arr, dtype)
            if why:
                problems.append(f"`{key}`: {why}")
                continue
            converted[key] = np.array(cast, copy=True)
        if problems:
            raise LoadStateDictError(
                f"cannot load the state dict into `{self.graph_name}` ({len(problems)} "
                "problem(s)):\n" + "\n".join(f"  - {p}" for p in problems),
                fix="\n".join(hints)
                or "pass exactly the names in graph.state_dict(), with the declared shapes",
            )
        for key, arr in converted.items():
            attr, i, _, _ = table[key]
            decl = self.decls[attr]
            if isinstance(decl, ParamDecl):
                if decl.values is None:
                    decl.values = [None] * len(decl.shapes)
                decl.values = list(decl.values)
                decl.values[i] = arr
                self._device_params.pop(attr, None)  # re-uploaded once, on next use
                self._host_params.pop(attr, None)
            else:
                self.device_state_leaves()  # the other leaves of a pytree state keep their values
                self._device_states[attr][i] = _put_owned(arr, decl.sharding)
                host = self.host_state(attr)
                if decl.is_array:
                    self._host_states[attr] = np.array(arr)
                else:
                    hl = decl.split(host)
                    hl[i] = jax.device_put(arr, _host_device())
                    self._host_states[attr] = decl.build(hl)


def _put(value: np.ndarray, sharding) -> jax.Array:
    return jax.device_put(value) if sharding is None else jax.device_put(value, sharding)


_copy = jax.jit(jnp.copy)


def _put_owned(value: np.ndarray, sharding) -> jax.Array:
    """A device buffer that owns its memory: on CPU `device_put` may alias the numpy array, and a
    state's buffer is donated and written in place by every call."""
    return _copy(_put(value, sharding))
