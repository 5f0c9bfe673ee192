"""Declarations of a graph's weights (`param`) and device-resident state (`state`), and the
`sm.Model` class a graph's states are held and saved as.

A declaration records leaf names, shapes and dtypes (and, for a weight given by value, the value);
the `Graph` it is assigned to owns the device copies. Either may be a single array or a pytree of
arrays (an `sm.Model` as weights, a `KVCache` as state), whose leaves get dotted names like
`model.emb`. A graph's states together are one `sm.Model` whose buffers are named by the states.
"""

from __future__ import annotations

import dataclasses
import keyword
import typing
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Shaped

from .._validate import shorten
from ..models import Model, buffer, submodel, zeros
from ..models._introspect import dotted_name
from ._errors import GraphDeclarationError

__all__ = ["Decl", "ParamDecl", "StateDecl", "param", "state", "state_model_class"]


def _check_shape(shape, where: str) -> tuple[int, ...]:
    if isinstance(shape, int | np.integer):
        shape = (shape,)
    ok = isinstance(shape, tuple | list) and all(
        isinstance(d, int | np.integer) and not isinstance(d, bool) and d >= 0 for d in shape
    )
    if not ok:
        raise GraphDeclarationError(
            f"{where} got the shape {shape!r}, which is not a tuple of non-negative ints",
            fix="declare it as e.g. state((rows, width)) or param((D, F), dtype=jnp.float32)",
        )
    return tuple(int(d) for d in shape)


def _dtype(dtype, where: str = "a declaration") -> np.dtype:
    """JAX's canonical form of a numeric or bool `dtype`; anything else is a declaration error."""
    try:
        canonical = np.dtype(jax.dtypes.canonicalize_dtype(dtype))
    except Exception:  # numpy raises several types for what is not a dtype
        canonical = None
    if canonical is None or not (canonical == np.bool_ or jnp.issubdtype(canonical, jnp.number)):
        raise GraphDeclarationError(
            f"{where} got the dtype {shorten(dtype)}, which is not a numeric dtype",
            fix="pass e.g. dtype=jnp.float32, jnp.int32 or jnp.bfloat16",
        )
    return canonical


@dataclasses.dataclass
class Decl:
    """The leaves of one declared weight or state, by relative dotted name ("" for an array).

    `treedef` and `static` rebuild the declared value (an array, or e.g. an `sm.Model`) from its
    leaves; `leaves` maps each leaf's name to its `(shape, dtype)`, in the treedef's order.
    """

    treedef: Any
    static: Any
    leaves: dict[str, tuple[tuple[int, ...], np.dtype]]
    sharding: Any = None
    name: str = ""  # set when assigned to a graph attribute (or given as name=)

    @property
    def is_array(self) -> bool:
        return list(self.leaves) == [""]

    def full_name(self, leaf: str) -> str:
        return f"{self.name}.{leaf}" if leaf else self.name

    def build(self, by_name: dict[str, Any]) -> Any:
        """The declared value with these leaves (arrays or tracers), paired by leaf name."""
        tree = jax.tree_util.tree_unflatten(self.treedef, [by_name[n] for n in self.leaves])
        return tree if self.static is None else eqx.combine(tree, self.static)

    def split(self, value) -> dict[str, Any]:
        """The leaves of a value of the declared structure by name (the inverse of `build`)."""
        if self.is_array:
            return {"": value}
        arrays = eqx.filter(value, eqx.is_array) if self.static is not None else value
        return {dotted_name(p): x for p, x in jax.tree_util.tree_flatten_with_path(arrays)[0]}


def _from_tree(tree, where: str) -> tuple[Any, Any, dict[str, Any]]:
    arrays, static = eqx.partition(tree, eqx.is_array)
    flat, treedef = jax.tree_util.tree_flatten_with_path(arrays)
    if not flat:
        raise GraphDeclarationError(
            f"{where} got a {type(tree).__name__} with no array leaves",
            fix="pass an array, a shape tuple, or a pytree of arrays such as an sm.Model",
        )
    return treedef, static, {dotted_name(p): x for p, x in flat}


_ARRAY = jax.tree_util.tree_structure(0)


@dataclasses.dataclass
class ParamDecl(Decl):
    """A weight: read-only in `body`, uploaded once. `values` (by leaf name) is None until bound."""

    values: dict[str, Any] | None = None


@dataclasses.dataclass
class StateDecl(Decl):
    """A device-resident tensor (or pytree of them), zero on first upload."""


@typing.no_type_check  # validates its arguments itself, with coded errors
def param(value_or_shape, dtype=None, *, sharding=None) -> ParamDecl:
    """Declares a weight of a `Graph`: `self.w = param(array)` in the graph's `__init__`.

    Args:
        value_or_shape: the weight's value (an array, or a pytree of arrays such as an `sm.Model`,
            whose params and buffers all become weights), or its shape as a tuple of ints, in which
            case the weight is bound later with `graph.load_state_dict`.
        dtype: the weight's dtype; by default the value's own (canonicalized, so a float64 numpy
            array becomes float32 unless x64 is enabled), or float32 for a shape.
        sharding: an optional `jax.sharding.Sharding` to place the weight with.

    Returns:
        A declaration; the graph uploads it to the device once, on first use.
    """
    if isinstance(value_or_shape, tuple | list) and all(
        isinstance(d, int | np.integer) for d in value_or_shape
    ):
        shape = _check_shape(value_or_shape, "param(shape)")
        leaves = {"": (shape, _dtype(jnp.float32 if dtype is None else dtype, "param(shape)"))}
        return ParamDecl(_ARRAY, None, leaves, sharding=sharding)
    if isinstance(value_or_shape, jax.Array | np.ndarray) or np.isscalar(value_or_shape):
        treedef, static, values = _ARRAY, None, {"": value_or_shape}
    else:
        treedef, static, values = _from_tree(value_or_shape, "param(value)")
    if dtype is not None:
        dtype = _dtype(dtype, "param(value)")
        values = {n: jnp.asarray(x, dtype) for n, x in values.items()}
    values = {n: _canonical(x) for n, x in values.items()}
    leaves = {n: (tuple(x.shape), np.dtype(x.dtype)) for n, x in values.items()}
    return ParamDecl(treedef, static, leaves, sharding=sharding, values=values)


def _canonical(x):
    if isinstance(x, jax.Array):
        return x  # already on a device: uploading it is free
    arr = np.asarray(x)
    return np.array(arr, dtype=_dtype(arr.dtype))


@typing.no_type_check  # validates its arguments itself, with coded errors
def state(shape_or_tree, dtype=jnp.float32, *, name: str | None = None, sharding=None) -> StateDecl:
    """Declares device-resident state of a `Graph`: `self.total = state((rows, width))`.

    The state is zero when first uploaded, lives on the device across calls, is read and written
    by `body` (`self.total[pos]`, `self.total[pos] = new`), and is updated in place (its buffer is
    donated to each call), so a call costs the same whatever the state's size. The graph's states
    together form one `sm.Model` (`graph.states`), saved with `sm.save`.

    Args:
        shape_or_tree: the shape as a tuple of ints, or a pytree of arrays (e.g. a `KVCache`)
            whose structure, shapes and dtypes the state takes (its values are zeroed).
        dtype: the dtype for a shape (ignored for a pytree).
        name: the name errors, `graph.read` and saved files use (a Python identifier); by
            default the attribute's name.
        sharding: an optional `jax.sharding.Sharding` (e.g. a `NamedSharding` on a mesh); every
            call keeps the state with it, each shard on its own device.

    Returns:
        A declaration for the graph to own.
    """
    if name is not None and not isinstance(name, str):
        raise GraphDeclarationError(
            f"state(name=...) takes a string, got {shorten(name)} ({type(name).__name__})",
            fix="name it with a Python identifier, e.g. state((8, 4), name='total')",
        )
    if isinstance(shape_or_tree, tuple | list | int) and not isinstance(shape_or_tree, bool):
        leaves = {"": (_check_shape(shape_or_tree, "state(shape)"), _dtype(dtype, "state(shape)"))}
        return StateDecl(_ARRAY, None, leaves, sharding=sharding, name=name or "")
    treedef, static, values = _from_tree(shape_or_tree, "state(tree)")
    leaves = {n: (tuple(x.shape), _dtype(x.dtype, "state(tree)")) for n, x in values.items()}
    return StateDecl(treedef, static, leaves, sharding=sharding, name=name or "")


def check_field_names(graph: str, decl: StateDecl) -> None:
    """A state's name and its leaves' names become field names of the graph's state model."""
    for part in [decl.name, *(p for leaf in decl.leaves if leaf for p in leaf.split("."))]:
        if not part.isidentifier() or keyword.iskeyword(part) or part.startswith("_"):
            bad = f"`{part}`"
        elif hasattr(Model, part):
            bad = f"`{part}` (an sm.Model attribute)"
        else:
            continue
        raise GraphDeclarationError(
            f"`{graph}` declares the state `{decl.name}`, whose name or leaf name {bad} cannot "
            "name a buffer of its state model (graph.states)",
            fix="name states (and the fields of a pytree state) with Python identifiers, e.g. "
            "state((8, 4), name='total')",
        )


def state_model_class(graph: str, decls: list[StateDecl]) -> type[Model]:
    """The `sm.Model` subclass `<Graph>State` holding these states as buffers, by name.

    An array state is a buffer; a pytree state (a `KVCache`) is a sub-model whose buffers are its
    leaves, so the saved names are the dotted names of `graph.state_dict()` (`kv_cache.k`).
    """
    tree: dict[str, Any] = {}
    for decl in decls:
        if decl.is_array:
            tree[decl.name] = decl.leaves[""]
            continue
        node = tree.setdefault(decl.name, {})
        for leaf, spec in decl.leaves.items():
            *parents, last = leaf.split(".")
            at = node
            for p in parents:
                at = at.setdefault(p, {})
            at[last] = spec
    return _model_class(f"{graph}State", tree)


def _model_class(qualname: str, tree: dict[str, Any]) -> type[Model]:
    annotations: dict[str, Any] = {}
    namespace: dict[str, Any] = {"__module__": __name__, "__qualname__": qualname}
    for name, spec in tree.items():
        if isinstance(spec, dict):
            sub = _model_class(f"{qualname}.{name}", spec)
            annotations[name], namespace[name] = sub, submodel(sub)
        else:
            shape, dtype = spec
            annotations[name] = Shaped[Array, " ".join(map(str, shape))]
            namespace[name] = buffer(zeros, dtype=dtype)
    namespace["__annotations__"] = annotations
    return type(qualname.rsplit(".", 1)[-1], (Model,), namespace)
