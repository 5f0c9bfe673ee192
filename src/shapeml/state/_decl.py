"""Declarations of a graph's weights (`param`) and device-resident state (`state`).

A declaration records names, shapes and dtypes (and, for a weight given by value, the value); the
`Graph` it is assigned to owns the device copies. Either may be a single array or a pytree of arrays
(an `sm.Model` as weights, a `KVCache` as state), whose leaves get dotted names like `model.emb`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._errors import GraphDeclarationError

__all__ = ["Decl", "ParamDecl", "StateDecl", "param", "state"]


def _key_name(key) -> str:
    for attr in ("name", "key", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


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


@dataclasses.dataclass
class Decl:
    """The leaves of one declared weight or state: their dotted names, shapes and dtypes.

    `treedef` and `static` rebuild the declared value (an array, or e.g. an `sm.Model`) from a
    list of leaves; `leaf_names` are relative (`""` for a plain array, `"blocks.0.w1"` in a model).
    """

    treedef: Any
    static: Any
    leaf_names: list[str]
    shapes: list[tuple[int, ...]]
    dtypes: list[np.dtype]
    sharding: Any = None
    name: str = ""  # set when assigned to a graph attribute (or given as name=)

    @property
    def is_array(self) -> bool:
        return self.leaf_names == [""]

    def full_names(self) -> list[str]:
        return [self.name if not n else f"{self.name}.{n}" for n in self.leaf_names]

    def build(self, leaves: Sequence) -> Any:
        """The declared value with these leaves (arrays, tracers or numpy arrays)."""
        tree = jax.tree_util.tree_unflatten(self.treedef, list(leaves))
        return tree if self.static is None else eqx.combine(tree, self.static)

    def split(self, value) -> list:
        """The leaves of a value of the declared structure (the inverse of `build`)."""
        arrays = eqx.filter(value, eqx.is_array) if self.static is not None else value
        return jax.tree_util.tree_leaves(arrays)


def _from_tree(tree, where: str) -> tuple[Decl, list]:
    if isinstance(tree, jax.Array | np.ndarray) or np.isscalar(tree):
        arr = np.asarray(tree) if not isinstance(tree, jax.Array) else tree
        return Decl(
            jax.tree_util.tree_structure(0), None, [""], [tuple(arr.shape)], [np.dtype(arr.dtype)]
        ), [arr]
    arrays, static = eqx.partition(tree, eqx.is_array)
    flat, treedef = jax.tree_util.tree_flatten_with_path(arrays)
    if not flat:
        raise GraphDeclarationError(
            f"{where} got a {type(tree).__name__} with no array leaves",
            fix="pass an array, a shape tuple, or a pytree of arrays such as an sm.Model",
        )
    names = [".".join(_key_name(k) for k in path) for path, _ in flat]
    leaves = [leaf for _, leaf in flat]
    decl = Decl(
        treedef,
        static,
        names,
        [tuple(x.shape) for x in leaves],
        [np.dtype(x.dtype) for x in leaves],
    )
    return decl, leaves


@dataclasses.dataclass
class ParamDecl(Decl):
    """A weight: read-only in `body`, uploaded once. `values` is None until bound."""

    values: list | None = None


@dataclasses.dataclass
class StateDecl(Decl):
    """A device-resident tensor (or pytree of them), zero on first upload."""


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
        A declaration; the graph uploads it to the device once, on first call.
    """
    if isinstance(value_or_shape, tuple | list) and all(
        isinstance(d, int | np.integer) for d in value_or_shape
    ):
        shape = _check_shape(value_or_shape, "param(shape)")
        dt = np.dtype(jax.dtypes.canonicalize_dtype(dtype or jnp.float32))
        return ParamDecl(
            jax.tree_util.tree_structure(0), None, [""], [shape], [dt], sharding=sharding
        )
    decl, leaves = _from_tree(value_or_shape, "param(value)")
    if dtype is not None:
        leaves = [jnp.asarray(x, dtype) for x in leaves]
    host = [np.array(x, dtype=jax.dtypes.canonicalize_dtype(x.dtype)) for x in leaves]
    return ParamDecl(
        decl.treedef,
        decl.static,
        decl.leaf_names,
        [h.shape for h in host],
        [h.dtype for h in host],
        sharding=sharding,
        values=host,
    )


def state(shape_or_tree, dtype=jnp.float32, *, name: str | None = None, sharding=None) -> StateDecl:
    """Declares device-resident state of a `Graph`: `self.total = state((rows, width))`.

    The state is zero when first uploaded, lives on the device across calls, is read and written
    by `body` (`self.total[pos]`, `self.total[pos] = new`), and is updated in place (its buffer is
    donated to each call), so a call costs the same whatever the state's size.

    Args:
        shape_or_tree: the shape as a tuple of ints, or a pytree of arrays (e.g. a `KVCache`)
            whose structure, shapes and dtypes the state takes (its values are zeroed).
        dtype: the dtype for a shape (ignored for a pytree).
        name: the name errors and `graph.read` use; by default the attribute's name.
        sharding: an optional `jax.sharding.Sharding` (e.g. a `NamedSharding` on a mesh); every
            call keeps the state with it, each shard on its own device.

    Returns:
        A declaration for the graph to own.
    """
    if isinstance(shape_or_tree, tuple | list | int) and not isinstance(shape_or_tree, bool):
        shape = _check_shape(shape_or_tree, "state(shape)")
        dt = np.dtype(jax.dtypes.canonicalize_dtype(dtype))
        return StateDecl(
            jax.tree_util.tree_structure(0),
            None,
            [""],
            [shape],
            [dt],
            sharding=sharding,
            name=name or "",
        )
    decl, _ = _from_tree(shape_or_tree, "state(tree)")
    return StateDecl(
        decl.treedef,
        decl.static,
        decl.leaf_names,
        decl.shapes,
        [np.dtype(jax.dtypes.canonicalize_dtype(d)) for d in decl.dtypes],
        sharding=sharding,
        name=name or "",
    )
