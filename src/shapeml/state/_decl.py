"""What a graph declares: its weights (`param`) and its device-resident states (`state`).

A declaration is a template: a pytree whose leaves are `jax.ShapeDtypeStruct`s (one leaf for an
array; a `KVCache` or an `sm.Model` keeps its own structure), plus, for a weight given by value,
the value. At the first call the graph turns its states into one `sm.Model` declared with the
core's own field kinds: a `sm.buffer(sm.zeros)` per array state, a sub-model per pytree state.
"""

from __future__ import annotations

import dataclasses
import keyword
import typing
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Shaped

from .._traceback import api_boundary
from .._validate import held_dtype, numeric_dtype, shorten
from ..models import Model, buffer, submodel, zeros
from ..models._introspect import dotted_name
from ._errors import GraphDeclarationError

__all__ = ["Declared", "param", "state", "states_class"]


@dataclasses.dataclass
class Declared:
    """A declared weight (`kind="param"`) or state (`kind="state"`)."""

    kind: str
    template: Any  # a pytree of jax.ShapeDtypeStruct
    value: Any = None  # a weight's value as declared (None: by shape), uploaded at first use
    sharding: Any = None
    name: str = ""  # set when assigned to a graph attribute (or given as name=)

    @property
    def leaves(self) -> dict[str, jax.ShapeDtypeStruct]:
        """Each leaf's spec by its dotted name under the declaration ("" for an array)."""
        flat = jax.tree_util.tree_flatten_with_path(self.template)[0]
        return {dotted_name(p): s for p, s in flat}

    def full_name(self, leaf: str) -> str:
        return f"{self.name}.{leaf}" if leaf else self.name


def _dtype(dtype, where: str) -> np.dtype:
    """A numeric or bool `dtype` (anything else is E1407), held by this process as declared (E0004
    for float64 without x64)."""
    return held_dtype(numeric_dtype(dtype, where, GraphDeclarationError, bool_ok=True), where)


def _spec(shape, dtype, where: str) -> jax.ShapeDtypeStruct:
    """A declaration by shape (an int or a tuple of non-negative ints; anything else is E1407)."""
    if isinstance(shape, int | np.integer) and not isinstance(shape, bool):
        shape = (shape,)
    ok = isinstance(shape, tuple | list) and all(
        isinstance(d, int | np.integer) and not isinstance(d, bool) and d >= 0 for d in shape
    )
    if not ok:
        raise GraphDeclarationError(
            f"{where} got the shape {shorten(shape)}, which is not a tuple of non-negative ints",
            fix="declare it as e.g. state((rows, width)) or param((D, F), dtype=jnp.float32)",
        )
    return jax.ShapeDtypeStruct(tuple(int(d) for d in shape), _dtype(dtype, where))


def _template(tree, where: str):
    """`tree` with every array leaf a `ShapeDtypeStruct` of JAX's canonical dtype."""
    leaves = jax.tree.leaves(tree)
    if not leaves or not all(hasattr(x, "shape") and hasattr(x, "dtype") for x in leaves):
        raise GraphDeclarationError(
            f"{where} got {shorten(tree)} ({type(tree).__name__}), which is neither a shape nor an "
            "array or a pytree of arrays",
            fix="pass an array, a shape tuple, or a pytree of arrays such as an sm.Model",
        )
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), _dtype(x.dtype, where)), tree)


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def param(value_or_shape, dtype=None, *, sharding=None) -> Declared:
    """Declares a weight of a `Graph`: `self.w = param(array)` in the graph's `__init__`.

    Args:
        value_or_shape: the weight's value (an array, or a pytree of arrays such as an `sm.Model`,
            whose params and buffers all become weights), or its shape as a tuple of ints, in which
            case the weight is bound later with `graph.load_state_dict`.
        dtype: the weight's dtype; by default the value's own (canonicalized, so a float64 numpy
            array becomes float32 unless x64 is enabled), or float32 for a shape.
        sharding: an optional `jax.sharding.Sharding` to place the weight with.

    Returns:
        A declaration; the graph uploads the weight to the device once, on first use.
    """
    if isinstance(value_or_shape, tuple | list) and all(
        isinstance(d, int | np.integer) for d in value_or_shape
    ):
        spec = _spec(value_or_shape, jnp.float32 if dtype is None else dtype, "param(shape)")
        return Declared("param", spec, sharding=sharding)
    value = value_or_shape
    if np.isscalar(value) or isinstance(value, list):
        value = np.asarray(value)
    if dtype is not None:
        cast = _dtype(dtype, "param(value)")
        value = jax.tree.map(lambda x: np.asarray(x, cast), value)
    template = _template(value, "param(value)")
    value = jax.tree.map(lambda x, s: x if isinstance(x, jax.Array) else np.asarray(x, s.dtype),
                         value, template)  # fmt: skip
    return Declared("param", template, value=value, sharding=sharding)


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def state(shape_or_tree, dtype=jnp.float32, *, name: str | None = None, sharding=None) -> Declared:
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
    if isinstance(shape_or_tree, tuple | list | int | np.integer):  # a bool is refused as a shape
        spec = _spec(shape_or_tree, dtype, f"state `{name}`" if name else "state(shape)")
        return Declared("state", spec, sharding=sharding, name=name or "")
    template = _template(shape_or_tree, "state(tree)")
    return Declared("state", template, sharding=sharding, name=name or "")


def check_names(graph: str, decl: Declared) -> None:
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


def states_class(graph: str, decls: list[Declared]) -> type[Model]:
    """The `sm.Model` class `<Graph>State`: a buffer per array state, a sub-model per pytree state
    (its buffers named by the pytree's leaves, so saved names read `kv_cache.k`)."""
    tree: dict[str, Any] = {}
    for decl in decls:
        for leaf, spec in decl.leaves.items():
            *parents, last = decl.full_name(leaf).split(".")
            at = tree
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
            annotations[name] = Shaped[Array, " ".join(map(str, spec.shape))]
            namespace[name] = buffer(zeros, dtype=spec.dtype)
    namespace["__annotations__"] = annotations
    return type(qualname.rsplit(".", 1)[-1], (Model,), namespace)
