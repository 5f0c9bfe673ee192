"""A hoisted function's arguments split as `equinox.filter_jit` splits them: array leaves are
traced, every other leaf is static configuration, part of the key jax.jit compiles by."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from .._jax_internals import ArrayImpl
from ._errors import UnhashableStaticError

__all__ = ["abstract", "combine", "is_array", "partition"]

# `(treedef, statics)`: the structure, and per leaf its value if static, None if an array (None
# is never a leaf); `statics` is None when every leaf is an array.
Static = tuple[Any, tuple | None]


def is_array(x) -> bool:
    """Array leaves are traced; every other leaf is static configuration (as `eqx.filter_jit`)."""
    return isinstance(x, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct))


def partition(tree) -> tuple[list, Static]:
    """The array leaves of `tree` in flattening order, and the rest of it (hashable).

    Raises:
        UnhashableStaticError: (E1504) for a non-array leaf that cannot be hashed.
    """
    leaves, treedef = jax.tree.flatten(tree)
    if all(type(x) is ArrayImpl or is_array(x) for x in leaves):
        return leaves, (treedef, None)
    statics = tuple(None if is_array(x) else x for x in leaves)
    for x in statics:
        try:
            hash(x)
        except TypeError:
            raise UnhashableStaticError(
                f"an argument leaf of type `{type(x).__name__}` is neither an array nor hashable",
                fix="pass data as arrays and configuration as hashable values (tuples, not lists)",
            ) from None
    return [x for x in leaves if is_array(x)], (treedef, statics)


def combine(arrays, static: Static):
    """The pytree `partition` split: `arrays` (or tracers, or shapes) at the array leaves."""
    treedef, statics = static
    if statics is None:
        return jax.tree.unflatten(treedef, arrays)
    it = iter(arrays)
    return jax.tree.unflatten(treedef, [next(it) if s is None else s for s in statics])


def abstract(x) -> jax.ShapeDtypeStruct:
    """The shape, dtype and weak type of an array, tracer or `jax.ShapeDtypeStruct`: what a
    trace of it depends on."""
    a = x if isinstance(x, jax.ShapeDtypeStruct) else jax.typeof(x)
    return jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type)
