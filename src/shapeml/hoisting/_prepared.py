"""The prepared tensors of one set of weight arrays, and the ready-to-run calls that read them.

`Hoisted` keeps these in a `CompileCache` keyed by `WeightsKey` (the weight arrays by identity);
each holds, per input signature, a `Run`: everything a call needs besides its inputs.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import Any, NamedTuple

from .._compile_cache import Signature, is_array, leaf_key
from ._program import PrepareKey

_is = operator.is_


@dataclasses.dataclass(frozen=True)
class WeightsKey:
    """A set of weight leaves: arrays by identity, static leaves by value.

    JAX arrays are immutable, so the same array object means the same values. The key holds the
    leaves, so the ids it compares stay theirs while it is in a cache.
    """

    treedef: Any
    ids: tuple  # per leaf: `id` of an array, `leaf_key` of a static
    leaves: list = dataclasses.field(compare=False, repr=False)

    @classmethod
    def of(cls, leaves: list, treedef) -> WeightsKey:
        ids = tuple(id(x) if is_array(x) else leaf_key(x) for x in leaves)
        return cls(treedef, ids, leaves)


class Run(NamedTuple):
    """One call of the main program, all but its inputs bound."""

    main: Callable  # jitted: (boundary, per_call, dynamic inputs) -> outputs
    boundary: tuple  # the prepared tensors (and passed-through weights) main reads
    per_call: tuple  # weight leaves main reads directly on every call (PRNG keys)
    dynamic: list[int] | None  # positions of the array input leaves; None when all are

    def __call__(self, in_leaves: list):
        if self.dynamic is not None:
            in_leaves = [in_leaves[i] for i in self.dynamic]
        return self.main(self.boundary, self.per_call, in_leaves)


class Prepared:
    """What one set of weights has computed: boundary tensors per prepare program, and a `Run`
    per input signature seen with these weights."""

    __slots__ = ("boundaries", "last_run", "last_signature", "n", "runs", "w_leaves", "w_tree")

    def __init__(self, key: WeightsKey):
        self.w_leaves = key.leaves
        self.w_tree = key.treedef
        self.n = len(key.leaves)
        self.boundaries: dict[PrepareKey, tuple] = {}
        self.runs: dict[Signature, Run] = {}
        self.last_signature: Signature | None = None
        self.last_run: Run | None = None

    def holds(self, w_leaves: list, w_tree) -> bool:
        """Whether these are exactly the leaves (the same objects) this was prepared from."""
        return (
            self.n == len(w_leaves)
            and self.w_tree == w_tree
            and all(map(_is, w_leaves, self.w_leaves))
        )

    def run_for(self, sig: Signature) -> Run | None:
        """The run for inputs of this signature, if one was made."""
        if sig == self.last_signature:
            return self.last_run
        run = self.runs.get(sig)
        if run is not None:
            self.last_signature, self.last_run = sig, run
        return run

    def remember(self, sig: Signature, run: Run) -> None:
        self.runs[sig] = run
        self.last_signature, self.last_run = sig, run
