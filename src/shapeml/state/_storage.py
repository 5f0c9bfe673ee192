"""What a graph holds: its declarations, its weights (uploaded once), its states as one `sm.Model`
on the device (buffers replaced by each call's donated outputs), and the host mirror of the states
that `reference` runs against. Every leaf is paired with its declaration by dotted name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._cast import cast_host_array
from .._errors import similar
from .._validate import shorten
from ..models import Model
from ..models._introspect import dotted_name
from ._decl import Decl, ParamDecl, StateDecl, state_model_class
from ._errors import (
    GraphDeclarationError,
    LoadStateDictError,
    StateAllocationError,
    StateNotFoundError,
    UnboundParamError,
)

__all__ = ["Storage"]

_copy = jax.jit(jnp.copy)


def _cpu():
    return jax.devices("cpu")[0]


def zeros(what: str, shape, dtype, sharding=None, *, host: bool = False) -> jax.Array:
    """A zero buffer for a state, owned on the device (or on the host CPU when `host`); E1412
    naming `what` when the memory cannot be had, not a MemoryError or XLA's RESOURCE_EXHAUSTED."""
    try:
        if host:
            return jax.device_put(np.zeros(shape, dtype), _cpu())
        return _owned(np.zeros(shape, dtype), sharding)
    except (MemoryError, ValueError, jax.errors.JaxRuntimeError) as e:
        size = math.prod(shape) * np.dtype(dtype).itemsize
        raise StateAllocationError(
            f"{what} of shape {tuple(shape)} ({np.dtype(dtype).name}, {size:,} bytes) could not "
            f"be allocated{' on the host' if host else ''}: {shorten(str(e))}",
            fix="declare a smaller state (fewer rows or a narrower width)",
        ) from None


def _owned(value, sharding) -> jax.Array:
    """A device buffer that owns its memory: on CPU `device_put` may alias the numpy array, and a
    state's buffer is donated and written in place by every call."""
    put = jax.device_put(value) if sharding is None else jax.device_put(value, sharding)
    return _copy(put)


class Storage:
    """The declarations and tensors of one graph (everything but its compiled programs)."""

    def __init__(self, graph: str):
        self.graph = graph
        self.decls: dict[str, Decl] = {}  # attribute -> declaration, in declaration order
        self.sealed = False
        self._weights: dict[str, Any] | None = None  # attribute -> uploaded value
        self._weight_leaves: list[jax.Array] | None = None
        self._host_weights: dict[str, Any] | None = None
        self._cls: type[Model] | None = None  # the `<Graph>State` model class
        self._def: Any = None  # its treedef, and its leaves' dotted names in that order
        self._names: list[str] = []
        self._device: dict[str, jax.Array] = {}  # dotted name -> device buffer (by name at rest)
        self._leaves: list[jax.Array] | None = None  # the same, in treedef order, for each call
        self._host: dict[str, jax.Array] = {}  # dotted name -> host mirror (CPU)

    # declarations -------------------------------------------------------------------------------
    @property
    def state_decls(self) -> dict[str, StateDecl]:
        return {a: d for a, d in self.decls.items() if isinstance(d, StateDecl)}

    def declare(self, attr: str, decl: Decl) -> None:
        for other_attr, other in self.decls.items():
            if other_attr != attr and other.name == decl.name:
                raise GraphDeclarationError(
                    f"`{self.graph}` declares the name `{decl.name}` twice "
                    f"(attributes `{other_attr}` and `{attr}`)",
                    fix="give each state its own name=",
                )
        old = self.decls.get(attr)
        if old is not None:  # a redeclaration drops the old tensors
            for leaf in old.leaves:
                self._device.pop(old.full_name(leaf), None)
                self._host.pop(old.full_name(leaf), None)
        self.sync_device()
        self.decls[attr] = decl
        self._weights = self._weight_leaves = self._host_weights = None
        self._cls, self._leaves = None, None

    def attr_of(self, name: Any) -> str:
        if not isinstance(name, str):
            raise StateNotFoundError(
                f"`{self.graph}` names its weights and states by strings, got {shorten(name)} "
                f"({type(name).__name__})",
                fix="pass the state's name, e.g. graph.read('total'); graph.state_dict() lists them",
            )
        if name in self.decls:
            return name
        for attr, decl in self.decls.items():
            if decl.name == name:
                return attr
        names = [d.name for d in self.decls.values()]
        raise StateNotFoundError(
            f"`{self.graph}` has no weight or state named `{name}` (it has: "
            f"{', '.join(f'`{n}`' for n in names) or 'none'})",
            fix=similar(name, names, what="state") or "declare it in __init__ with state(...)",
        )

    def state_attr(self, name: Any) -> str:
        attr = self.attr_of(name)
        if not isinstance(self.decls[attr], StateDecl):
            raise StateNotFoundError(
                f"`{name}` is a weight of `{self.graph}`, not a state",
                fix=f"read a weight with graph.{attr}.host",
            )
        return attr

    # weights ------------------------------------------------------------------------------------
    def weight_values(self, attr: str) -> dict[str, Any]:
        decl: ParamDecl = self.decls[attr]  # type: ignore[assignment]
        if decl.values is None:
            raise UnboundParamError(
                f"weight `{decl.name}` of `{self.graph}` was declared by shape "
                f"{decl.leaves[''][0]} and never bound",
                fix=f"call graph.load_state_dict({{'{decl.name}': array}}) before calling the graph",
            )
        return decl.values

    def device_weights(self) -> dict[str, Any]:
        """Every weight on the device, by attribute: uploaded on first use, then reused as is."""
        if self._weights is None:
            self._weights = {}
            for attr, decl in self.decls.items():
                if isinstance(decl, ParamDecl):
                    put = lambda v, s=decl.sharding: jax.device_put(v, s)  # noqa: E731
                    values = self.weight_values(attr)
                    self._weights[attr] = decl.build({n: put(v) for n, v in values.items()})
        return self._weights

    def weight_leaves(self) -> list[jax.Array]:
        if self._weight_leaves is None:
            self._weight_leaves = jax.tree.leaves(self.device_weights())
        return self._weight_leaves

    def host_weights(self) -> dict[str, Any]:
        """The weights as the reference path sees them: eager JAX arrays on the host CPU."""
        if self._host_weights is None:
            self._host_weights = {
                attr: jax.device_put(value, _cpu()) for attr, value in self.device_weights().items()
            }
        return self._host_weights

    # states on the device -------------------------------------------------------------------------
    def _table(self) -> dict[str, tuple[str, str]]:
        """Dotted name -> (attribute, leaf name) for every weight and state leaf."""
        return {d.full_name(leaf): (a, leaf) for a, d in self.decls.items() for leaf in d.leaves}

    def _spec(self, name: str):
        attr, leaf = self._table()[name]
        decl = self.decls[attr]
        shape, dtype = decl.leaves[leaf]
        return shape, dtype, decl.sharding

    def _layout(self) -> None:
        if self._cls is None:
            self._cls = state_model_class(self.graph, list(self.state_decls.values()))
            abstract = jax.eval_shape(self._cls.init)
            flat, self._def = jax.tree_util.tree_flatten_with_path(abstract)
            self._names = [dotted_name(p) for p, _ in flat]

    def state_def(self):
        self._layout()
        return self._def

    def state_leaves(self) -> list[jax.Array]:
        if self._leaves is None:
            self._layout()
            for name in self._names:
                if name not in self._device:
                    self._device[name] = zeros(f"state `{name}`", *self._spec(name))
            self._leaves = [self._device[n] for n in self._names]
        return self._leaves

    def set_state_leaves(self, leaves) -> None:
        self._leaves = leaves  # the by-name dict is refreshed only when read (sync_device)

    def sync_device(self) -> None:
        if self._leaves is not None:
            self._device = dict(zip(self._names, self._leaves, strict=True))

    def device_by_name(self) -> dict[str, jax.Array]:
        self.state_leaves()
        self.sync_device()
        return self._device

    def state_model(self, *, copy: bool) -> Model:
        """The device states as a `<Graph>State` model (copies: a call donates the buffers)."""
        by_name = self.device_by_name()
        leaves = [_copy(by_name[n]) if copy else by_name[n] for n in self._names]
        return jax.tree.unflatten(self._def, leaves)

    def build_state(self, attr: str, by_name: dict[str, Any]):
        """The value `body` sees for a state, from a `{dotted name: leaf}` of all states."""
        decl = self.decls[attr]
        return decl.build({leaf: by_name[decl.full_name(leaf)] for leaf in decl.leaves})

    def state_like(self, template: Model, values: dict[str, Any], *, constrain: bool) -> Model:
        """A states model like `template` holding `values` (by attribute), paired by name."""
        by_name = {}
        for attr, decl in self.state_decls.items():
            for leaf, x in decl.split(values[attr]).items():
                x = jnp.asarray(x)
                if constrain and decl.sharding is not None:
                    x = jax.lax.with_sharding_constraint(x, decl.sharding)
                by_name[decl.full_name(leaf)] = x
        flat, treedef = jax.tree_util.tree_flatten_with_path(template)
        return jax.tree.unflatten(treedef, [by_name[dotted_name(p)] for p, _ in flat])

    def read(self, attr: str):
        """A host numpy copy of the device state (a copy: the next call donates the buffer)."""
        decl, by_name = self.decls[attr], self.device_by_name()
        leaves = {leaf: np.array(by_name[decl.full_name(leaf)]) for leaf in decl.leaves}
        return leaves[""] if decl.is_array else decl.build(leaves)

    # the host mirror ----------------------------------------------------------------------------
    def _host_leaf(self, name: str) -> jax.Array:
        if name not in self._host:
            shape, dtype, _ = self._spec(name)
            self._host[name] = zeros(f"state `{name}`", shape, dtype, host=True)
        return self._host[name]

    def host_model(self) -> Model:
        self._layout()
        return jax.tree.unflatten(self._def, [self._host_leaf(n) for n in self._names])

    def set_host_model(self, model: Model) -> None:
        flat = jax.tree_util.tree_flatten_with_path(model)[0]
        self._host.update({dotted_name(p): x for p, x in flat})

    def host_copy(self, attr: str):
        decl = self.decls[attr]
        leaves = {leaf: np.array(self._host_leaf(decl.full_name(leaf))) for leaf in decl.leaves}
        return leaves[""] if decl.is_array else decl.build(leaves)

    def reset(self, attrs: list[str]) -> None:
        """Zeroes these states (all when empty), on the device and in the host mirror."""
        by_name = self.device_by_name()
        for attr in attrs or list(self.state_decls):
            decl = self.decls[attr]
            for leaf in decl.leaves:
                name = decl.full_name(leaf)
                by_name[name] = zeros(f"state `{name}`", *self._spec(name))
                self._host.pop(name, None)
        self._leaves = None

    # names, loading and saving ------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        out = {}
        for name, (attr, leaf) in self._table().items():
            decl = self.decls[attr]
            if isinstance(decl, ParamDecl):
                if decl.values is not None:
                    out[name] = np.array(decl.values[leaf], copy=True)
            else:
                out[name] = np.array(self.device_by_name()[name], copy=True)
        return out

    def load_states(self, states: Any) -> None:
        if not isinstance(states, Model):
            raise LoadStateDictError(
                f"load_states takes an sm.Model like graph.states, got {type(states).__name__}",
                fix="pass graph.states, or sm.load(path, like=graph.states)",
            )
        flat = jax.tree_util.tree_flatten_with_path(states)[0]
        self.load({dotted_name(p): x for p, x in flat}, require="states")

    def load(self, entries: Any, *, require: str) -> None:
        """Checks every entry, then binds them all or none. `require` is "weights" (each weight
        must be present, states optional) or "states" (each state, and nothing else)."""
        if not isinstance(entries, Mapping):
            raise LoadStateDictError(
                f"`{self.graph}` takes a dict of arrays by dotted name, got {shorten(entries)} "
                f"({type(entries).__name__})",
                fix="pass a dict like graph.state_dict()",
            )
        table = self._table()
        kind = {n: isinstance(self.decls[a], ParamDecl) for n, (a, _) in table.items()}
        wanted = [n for n in table if kind[n] == (require == "weights")]
        allowed = table if require == "weights" else wanted
        problems = [
            f"missing {'weight' if kind[n] else 'state'} `{n}`" for n in wanted if n not in entries
        ]
        hints, converted = [], {}
        for key, value in entries.items():
            if not isinstance(key, str):
                problems.append(f"the key {shorten(key)} is not a string")
                continue
            if key not in allowed:
                hint = similar(key, list(allowed), what="weight or state")
                problems.append(f"unexpected key `{key}`" + (f" ({hint})" if hint else ""))
                hints += [hint] if hint else []
                continue
            shape, dtype, _ = self._spec(key)
            try:
                arr = np.asarray(value)
            except Exception:  # a ragged list, an object numpy cannot convert
                arr = None
            if arr is None or arr.dtype.kind not in "biufcV":
                problems.append(f"`{key}` is {shorten(value)}, not a numeric array")
                continue
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
                f"cannot load into `{self.graph}` ({len(problems)} problem(s)):\n"
                + "\n".join(f"  - {p}" for p in problems),
                fix="\n".join(hints)
                or "pass exactly the names in graph.state_dict(), with the declared shapes",
            )
        by_name = self.device_by_name() if any(not kind[k] for k in converted) else {}
        for key, arr in converted.items():
            attr, leaf = table[key]
            decl = self.decls[attr]
            if isinstance(decl, ParamDecl):
                decl.values = {**(decl.values or {}), leaf: arr}
                self._weights = self._weight_leaves = self._host_weights = None
            else:
                by_name[key] = _owned(arr, decl.sharding)
                self._host[key] = jax.device_put(arr, _cpu())
                self._leaves = None
