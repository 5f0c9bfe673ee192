"""The prepared tensors of one set of weight arrays, found again by the arrays' identity.

`Hoisted` keeps the last `cache_size` of these, keyed by `WeightsKey`; each holds the tensors
every prepare program handed over (by `Tag`), and those the last call read.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any

from ._program import Tag
from ._static import is_array

_is = operator.is_


@dataclasses.dataclass(frozen=True)
class WeightsKey:
    """A set of weight leaves: arrays by identity, static leaves by type and value.

    JAX arrays are immutable, so the same array object means the same values. The key holds the
    leaves, so the ids it compares stay theirs while it is in a cache.
    """

    treedef: Any
    ids: tuple
    leaves: list = dataclasses.field(compare=False, repr=False)

    @classmethod
    def of(cls, leaves: list, treedef) -> WeightsKey:
        ids = tuple(id(x) if is_array(x) else (type(x), x) for x in leaves)
        return cls(treedef, ids, leaves)


class Prepared:
    """What one set of weights has computed: per `Tag`, the boundary tensors and the weight
    leaves main reads on every call (PRNG keys); `tag`, `boundary` and `per_call` are those the
    last call used."""

    __slots__ = ("boundary", "n", "per_call", "tag", "tensors", "w_leaves", "w_tree")

    def __init__(self, key: WeightsKey):
        self.w_leaves = key.leaves
        self.w_tree = key.treedef
        self.n = len(key.leaves)
        self.tensors: dict[Tag, tuple[tuple, tuple]] = {}
        self.tag: Tag | None = None
        self.boundary: tuple = ()
        self.per_call: tuple = ()

    def holds(self, w_leaves: list, w_tree) -> bool:
        """Whether these are exactly the leaves (the same objects) this was prepared from."""
        return (
            self.n == len(w_leaves)
            and self.w_tree == w_tree
            and all(map(_is, w_leaves, self.w_leaves))
        )

    def use(self, tag: Tag) -> bool:
        """Makes the tensors prepared for `tag` the current ones; False if there are none."""
        found = self.tensors.get(tag)
        if found is None:
            return False
        self.tag = tag
        self.boundary, self.per_call = found
        return True

    def keep(self, tag: Tag, boundary: tuple, per_call: tuple) -> None:
        """Stores (and makes current) what prepare computed for `tag`."""
        self.tensors[tag] = (boundary, per_call)
        self.use(tag)
