"""A graph's tensors seen from the host, by dotted name: its weights (the shell's model), its states
(one `sm.Model`, the shell's carry, and its host mirror for `reference`).

`GraphAccess` is the half of `Graph` that reads, writes, saves and loads them; every entry is
paired with its declaration by dotted name (`total`, `kv_cache.k`, `model.emb`), never by position.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from .._cast import cast_host_array
from .._errors import similar
from .._step import Shell
from .._traceback import api_boundary
from .._validate import shorten
from ..models import Model
from ..models._checkpoint import build_model
from ..models._introspect import dotted_name
from ..models._limits import check_size, max_bytes_of
from ._decl import Declared, states_class
from ._errors import LoadStateDictError, StateNotFoundError, UnboundParamError
from ._handles import ParamHandle, StateHandle
from ._state_errors import allocate_zeros

__all__ = ["GraphAccess"]


def _by_name(tree) -> dict[str, Any]:
    return {dotted_name(p): x for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _replaced(tree, by_name: Mapping[str, Any]):
    """`tree` with each leaf named in `by_name` (by dotted name) taken from it."""
    return jax.tree_util.tree_map_with_path(lambda p, x: by_name.get(dotted_name(p), x), tree)


@api_boundary
class GraphAccess:
    """Host access to a graph's weights and states (the base of `Graph`).

    The weights are the shell's model, a dict by attribute (a weight's name is its attribute), so
    a leaf's dotted name there is its name in `state_dict()`, as it is in the states model."""

    _decls: dict[str, Declared]
    _unbound: set[str]  # weights declared by shape and not bound yet: zeros stand in for them

    # the tensors --------------------------------------------------------------------------------
    def _specs(self, kind: str) -> dict[str, jax.ShapeDtypeStruct]:
        """Every leaf of the weights (`kind="param"`) or states by full dotted name."""
        return {
            d.full_name(leaf): spec
            for d in self._decls.values()
            if d.kind == kind
            for leaf, spec in d.leaves.items()
        }

    def _weights(self) -> dict[str, Any]:
        """The weights by attribute, as declared until uploaded; E1404 while one is unbound."""
        if self._unbound:  # on every call: the common case costs one truth test
            unbound = [a for a in self._decls if a in self._unbound]  # in declaration order
            shapes = ", ".join(f"`{a}` {self._decls[a].template.shape}" for a in unbound)
            raise UnboundParamError(
                f"`{type(self).__name__}` has weights declared by shape and not bound: {shapes}",
                fix=f"bind them first: graph.load_state_dict({{'{unbound[0]}': array, ...}})",
            )
        if self._shell is None:
            return {a: d.value for a, d in self._decls.items() if d.kind == "param"}
        return self._shell.model

    def _shell_now(self) -> Shell:
        """The graph's shell, made at first use (declarations close): the weights uploaded once,
        each on its declaration's placement, and zero states."""
        if self._shell is None:
            weights = {
                a: jax.device_put(
                    d.value if d.value is not None else jax.tree.map(jnp.zeros_like, d.template),
                    self._placement(d),
                )
                for a, d in self._decls.items()
                if d.kind == "param"
            }
            shell = Shell(
                self._pure, weights, self._zeros(), name=type(self).__name__,
                takes=type(self).body, copy=False,  # the zero states are handed over, not copied
            )  # fmt: skip
            self.__dict__["_shell"] = shell
        return self._shell

    def _placement(self, decl: Declared):
        """Where a declaration lives: its sharding; else, when another declaration is on a mesh,
        replicated on that mesh (one program spans one set of devices); else the default device."""
        on_mesh = (
            d.sharding for d in self._decls.values() if isinstance(d.sharding, NamedSharding)
        )
        mesh = next(on_mesh, None)
        if decl.sharding is not None or mesh is None:
            return decl.sharding
        return NamedSharding(mesh.mesh, PartitionSpec())

    def _zeros(self, device=None) -> Model:
        """Fresh zero states (on `device`, or each on its declared sharding)."""
        decls = [d for d in self._decls.values() if d.kind == "state"]
        cls = states_class(type(self).__name__, decls)
        check_size(cls, cls.dims, max_bytes_of(None), f"`{type(self).__name__}`'s states")
        by_name = {}
        fix = "declare a smaller state (fewer rows or a narrower width)"
        for d in decls:
            where = device or self._placement(d)
            for leaf, s in d.leaves.items():
                name = d.full_name(leaf)
                by_name[name] = allocate_zeros(
                    s.shape, s.dtype, where, what=f"state `{name}`", fix=fix
                )
        return build_model(cls, cls.dims, by_name, "", {})

    def _states(self) -> Model:
        return self._shell_now().carry

    def _set_states(self, states: Model) -> None:
        self._shell_now().carry = states  # placed as the old states, copied: the shell owns it

    def _host_states(self) -> Model:
        if self._host is None:
            self.__dict__["_host"] = self._zeros(jax.devices("cpu")[0])
        return self._host

    def _unpack(self, states: Model) -> dict[str, Any]:
        """Each state's value by attribute (an array, or its declared pytree) from the model."""
        by_name = _by_name(states)
        out = {}
        for attr, d in self._decls.items():
            if d.kind == "state":
                leaves = [by_name[d.full_name(leaf)] for leaf in d.leaves]
                out[attr] = jax.tree.unflatten(jax.tree.structure(d.template), leaves)
        return out

    def _pack(self, states: Model, values: dict[str, Any]) -> Model:
        """`states` with each leaf taken from the values by attribute (the inverse of `_unpack`)."""
        named = {self._decls[a].name: v for a, v in values.items()}
        return _replaced(states, _by_name(named))

    def _handle(self, attr: str):
        return (ParamHandle if self._decls[attr].kind == "param" else StateHandle)(self, attr)

    def _attr_of(self, name: Any, kind: str | None = None) -> str:
        if not isinstance(name, str):
            raise StateNotFoundError(
                f"`{type(self).__name__}` names its weights and states by strings, got "
                f"{shorten(name)} ({type(name).__name__})",
                fix="pass the state's name, e.g. graph.read('total'); graph.state_dict() lists them",
            )
        attr = next((a for a, d in self._decls.items() if name in (a, d.name)), None)
        if attr is None:
            names = [d.name for d in self._decls.values()]
            raise StateNotFoundError(
                f"`{type(self).__name__}` has no weight or state named `{name}` (it has: "
                f"{', '.join(f'`{n}`' for n in names) or 'none'})",
                fix=similar(name, names, what="state") or "declare it in __init__ with state(...)",
            )
        if kind == "state" and self._decls[attr].kind != "state":
            raise StateNotFoundError(
                f"`{name}` is a weight of `{type(self).__name__}`, not a state",
                fix=f"read a weight with graph.{attr}.host",
            )
        return attr

    # public host access -----------------------------------------------------------------------
    @property
    def states(self) -> Model:
        """A snapshot of every state as one `sm.Model` (class `<Graph>State`), a buffer per state
        named like `state_dict()`: `sm.save(path, graph.states)` saves them, and
        `graph.load_states(sm.load(path, like=graph.states))` brings them back."""
        return jax.tree.map(jnp.copy, self._states())

    def load_states(self, states: Any) -> None:
        """Sets every state from an `sm.Model` like `graph.states` (e.g. from `sm.load`).

        Raises:
            LoadStateDictError: (E1405) listing every missing, unexpected or wrong-shape buffer;
                nothing is loaded then.
        """
        if not isinstance(states, Model):
            raise LoadStateDictError(
                f"load_states takes an sm.Model like graph.states, got {type(states).__name__}",
                fix="pass graph.states, or sm.load(path, like=graph.states)",
            )
        self._load(_by_name(states), require="states")

    @typing.no_type_check  # validates its arguments itself, with coded errors
    def read(self, name: str):
        """A host numpy copy of the device state `name` (a pytree of them for a pytree state)."""
        attr = self._attr_of(name, "state")
        return jax.tree.map(np.array, self._unpack(self._states())[attr])

    @typing.no_type_check  # validates its arguments itself, with coded errors
    def reset(self, *names: str) -> None:
        """Zeroes the named states (all by default), on the device and in the host mirror."""
        every = [a for a, d in self._decls.items() if d.kind == "state"]
        attrs = {self._attr_of(n, "state") for n in names} or every

        def zeroed(tree: Model) -> Model:
            values = self._unpack(tree)
            return self._pack(tree, {a: jax.tree.map(jnp.zeros_like, values[a]) for a in attrs})

        self._set_states(zeroed(self._states()))
        self.__dict__["_host"] = zeroed(self._host_states())

    def state_dict(self) -> dict[str, np.ndarray]:
        """Host copies of every bound weight and every state, keyed by dotted name."""
        weights = {a: w for a, w in self._shell_now().model.items() if a not in self._unbound}
        return {
            k: np.array(v) for k, v in {**_by_name(weights), **_by_name(self._states())}.items()
        }

    @typing.no_type_check  # validates its argument itself (E1405 for anything but a dict)
    def load_state_dict(self, entries: dict[str, Any]) -> None:
        """Binds weights (and, when given, states) by dotted name, all or nothing.

        Every declared weight must be present; states are optional. Each array must have the
        declared shape; a float weight takes any float or int array, cast to its dtype.

        Raises:
            LoadStateDictError: (E1405) listing every missing, unexpected (with near-miss names)
                and wrong-shape or wrong-kind entry; nothing is loaded then.
        """
        self._load(entries, require="weights")

    def _load(self, entries: Any, *, require: str) -> None:
        """Checks every entry, then binds them all or none. `require` is "weights" (each weight
        must be present, states optional) or "states" (each state, and nothing else)."""
        graph = type(self).__name__
        if not isinstance(entries, Mapping):
            raise LoadStateDictError(
                f"`{graph}` takes a dict of arrays by dotted name, got {shorten(entries)} "
                f"({type(entries).__name__})",
                fix="pass a dict like graph.state_dict()",
            )
        weights, states = self._specs("param"), self._specs("state")
        allowed = {**weights, **states} if require == "weights" else states
        wanted = weights if require == "weights" else states
        problems = [
            f"missing {'weight' if n in weights else 'state'} `{n}`"
            for n in wanted
            if n not in entries
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
            problem, converted[key] = _converted(key, value, allowed[key])
            if problem:
                problems.append(problem)
        if problems:
            raise LoadStateDictError(
                f"cannot load into `{graph}` ({len(problems)} problem(s)):\n"
                + "\n".join(f"  - {p}" for p in problems),
                fix="\n".join(hints)
                or "pass exactly the names in graph.state_dict(), with the declared shapes",
            )
        shell = self._shell_now()
        if converted.keys() & weights:  # each placed as the value it replaces
            shell.model = _replaced(shell.model, converted)
            self._unbound -= converted.keys()
        if converted.keys() & states:
            self._set_states(_replaced(self._states(), converted))
            host = jax.device_put(converted, jax.devices("cpu")[0])
            self.__dict__["_host"] = _replaced(self._host_states(), host)


def _converted(key: str, value: Any, spec: jax.ShapeDtypeStruct) -> tuple[str, Any]:
    """`("", array)` for an entry of the declared shape whose values fit the declared dtype, or
    `(problem, None)`."""
    try:
        arr = np.asarray(value)
    except Exception:  # a ragged list, an object numpy cannot convert
        arr = None
    if arr is None or arr.dtype.kind not in "biufcV":
        return f"`{key}` is {shorten(value)}, not a numeric array", None
    if tuple(arr.shape) != tuple(spec.shape):
        return f"`{key}` has shape {tuple(arr.shape)}, expected {tuple(spec.shape)}", None
    cast, why = cast_host_array(arr, spec.dtype)
    return (f"`{key}`: {why}", None) if why else ("", np.array(cast, copy=True))
