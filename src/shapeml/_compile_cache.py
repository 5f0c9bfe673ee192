"""The one compile cache: programs built once per signature of their arguments.

Every shapeml component that compiles something per call shape (a `Graph`'s step, `sm.hoist`'s
split programs, the dead-param analysis of a loss, the int8 decode) keys it the same way: flatten
the arguments, describe each leaf (an array by shape, dtype and weak type; anything else, as
`equinox.filter_jit` does, by its hashable value), and look the `Signature` up in a `CompileCache`.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable
from typing import Any, Generic, NamedTuple, TypeVar

import jax
import numpy as np

from ._errors import ShapemlError
from ._jax_internals import ArrayImpl as _ArrayImpl

__all__ = [
    "CompileCache",
    "Signature",
    "UnhashableStaticError",
    "is_array",
    "is_hashable",
    "leaf_key",
]

T = TypeVar("T")


class UnhashableStaticError(
    ShapemlError,
    TypeError,
    code="E1504",
    title="a non-array argument leaf is not hashable",
    explanation="""
Leaves of the arguments that are not arrays (Python numbers, strings, callables) are treated as
static configuration, like `equinox.filter_jit` does: they are part of the compile-cache key, so
they must be hashable. Pass data as arrays, and configuration as hashable values (tuples, not
lists).
""",
):
    pass


def is_array(x) -> bool:
    """Array leaves are traced; every other leaf is static configuration (as `eqx.filter_jit`)."""
    return isinstance(x, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct))


# Named tuples, not dataclasses: their equality and hashing run in C, on every call's fast path.
class ArrayKey(NamedTuple):
    """What about an array leaf selects a program."""

    shape: tuple  # ints, or symbolic dims (`jax.export`)
    dtype: Any  # a numpy dtype, or a PRNG key dtype
    weak_type: bool


class StaticKey(NamedTuple):
    """A static leaf selects a program by its type and value."""

    type: type
    value: Hashable


def leaf_key(x) -> ArrayKey | StaticKey:
    """The part of a leaf that selects a program.

    Raises:
        UnhashableStaticError: (E1504) for a non-array leaf that cannot be hashed.
    """
    if type(x) is _ArrayImpl:  # the common case, without an ABC isinstance check
        return ArrayKey(x.shape, x.dtype, x.weak_type)
    if is_array(x):
        return ArrayKey(tuple(x.shape), x.dtype, bool(getattr(x, "weak_type", False)))
    if not is_hashable(x):
        raise UnhashableStaticError(
            f"an argument leaf of type `{type(x).__name__}` is neither an array nor hashable",
            fix="pass data as arrays and configuration as hashable values (tuples, not lists)",
        )
    return StaticKey(type(x), x)


def is_hashable(x) -> bool:
    """Whether `x` can be part of a cache key (a model holding arrays cannot)."""
    try:
        hash(x)
    except TypeError:
        return False
    return True


class Signature(NamedTuple):
    """The structure of a pytree of arguments and the key of each of its leaves."""

    treedef: Any
    leaves: tuple[ArrayKey | StaticKey, ...]

    @classmethod
    def of(cls, tree) -> tuple[Signature, list]:
        """The signature of `tree`, and its leaves (so the caller flattens only once)."""
        leaves, treedef = jax.tree.flatten(tree)
        return cls(treedef, tuple(map(leaf_key, leaves))), leaves

    def dynamic(self) -> list[int]:
        """Positions of the array leaves (traced), in flattening order."""
        return [i for i, k in enumerate(self.leaves) if isinstance(k, ArrayKey)]

    def abstract_leaves(self) -> list:
        """The leaves to trace with: a `jax.ShapeDtypeStruct` per array, each static's value."""
        return [
            jax.ShapeDtypeStruct(k.shape, k.dtype, weak_type=k.weak_type)
            if isinstance(k, ArrayKey)
            else k.value
            for k in self.leaves
        ]

    def abstract(self):
        """The pytree this signature describes, with `abstract_leaves()` as its leaves."""
        return jax.tree.unflatten(self.treedef, self.abstract_leaves())

    def fill(self, dynamic) -> list:
        """Every leaf: `dynamic` (e.g. tracers) at the array positions, each static's value."""
        leaves = [k.value if isinstance(k, StaticKey) else None for k in self.leaves]
        for i, x in zip(self.dynamic(), dynamic, strict=True):
            leaves[i] = x
        return leaves

    def rebuild(self, dynamic):
        """The pytree this signature describes, with `dynamic` as its array leaves."""
        return jax.tree.unflatten(self.treedef, self.fill(dynamic))


class CompileCache(Generic[T]):
    """Programs by key, built on a miss by `build(key)`; the least recently used past `maxsize`
    are dropped. Keys are `Signature`s, or named tuples/dataclasses of them. A cache built
    without `build` is given one by each `get`.

    Example:
        >>> cache = CompileCache(lambda sig: jax.jit(f).lower(...).compile(), maxsize=64)
        >>> sig, leaves = Signature.of((args, kwargs))
        >>> program = cache.get(sig)
    """

    def __init__(self, build: Callable[[Any], T] | None, *, maxsize: int | None = None):
        self._build = build
        self._maxsize = maxsize
        self._programs: collections.OrderedDict[Any, T] = collections.OrderedDict()
        self.builds = 0  # how many programs were built (traces, compiles) over the cache's life

    def get(self, key, build: Callable[[Any], T] | None = None) -> T:
        """The program for `key`, built on first sight (by `build`, else the cache's builder)."""
        program = self._programs.get(key)
        if program is not None:
            if self._maxsize is not None:
                self._programs.move_to_end(key)
            return program
        program = (build or self._build)(key)
        self.builds += 1
        self._programs[key] = program
        if self._maxsize is not None and len(self._programs) > self._maxsize:
            self._programs.popitem(last=False)
        return program

    def __len__(self) -> int:
        return len(self._programs)

    def __contains__(self, key) -> bool:
        return key in self._programs

    def clear(self) -> None:
        """Drops every program (the build count is kept)."""
        self._programs.clear()
