"""One traced-and-split program: `f` traced for one signature of its weights and inputs, split,
and how to run its halves.

A `Program` holds no weight values, so new weights of the same shapes reuse it. It is a static
pytree (`jax.tree_util.register_static`): `Hoisted` builds it inside a function `jax.jit` traces
and returns it as that function's output structure, so JAX's own trace cache keeps one per
signature.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax

from .. import _jax_internals as ji
from ._split import Split, split
from ._static import Static, combine


class Tag:
    """What a main program is compiled for besides the inputs: the weights' shapes and static
    part, and what the tensors prepare hands over are.

    Equal for programs whose prepare halves compute the same thing (e.g. one model traced at
    batch 1 and at batch 32), so the tensors prepared for one serve the other. It is part of the
    static key `jax.jit` compiles main by, checked on every call: its hash is computed once.
    """

    __slots__ = ("_consts", "_hash", "boundary", "weights")

    def __init__(self, weights: tuple[tuple, Static], boundary: tuple, consts: tuple):
        self.weights = weights  # (the dynamic weight leaves' shapes, the weights' static part)
        # The prepare program's text, the weight leaves it reads, the source of each tensor
        # handed over, and the ids of the constants read (kept alive here, so the ids stay theirs).
        self.boundary = boundary
        self._consts = consts
        self._hash = hash((weights, boundary))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return self is other or (
            isinstance(other, Tag)
            and self._hash == other._hash
            and self.boundary == other.boundary
            and self.weights == other.weights
        )


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True, eq=False)
class Program:
    """A traced `f`, split: `prepare(dyn_weights)` returns the tensors main reads;
    `main(boundary, per_call_weights, dyn_inputs)` (traced inside jit) returns `f`'s output."""

    split: Split
    out_tree: Any
    tag: Tag
    prepare_fn: Callable | None  # jitted: (prepare weights..., prepare consts...) -> tensors
    run_main: Callable  # the main jaxpr as a function of flat arguments

    def prepare(self, dyn_weights) -> tuple:
        s = self.split
        computed = ()
        if self.prepare_fn is not None:
            with jax.ensure_compile_time_eval():  # concrete even when called under an outer trace
                computed = self.prepare_fn(
                    *[dyn_weights[i] for i in s.prepare_weights],
                    *[s.consts[i] for i in s.prepare_consts],
                )
        out = []
        for b in s.boundary:
            if b.source == "prepared":
                out.append(computed[b.index])
            elif b.source == "weight":
                out.append(dyn_weights[b.index])
            else:
                out.append(s.consts[b.index])
        return tuple(out)

    def per_call(self, dyn_weights) -> tuple:
        return tuple(dyn_weights[i] for i in self.split.per_call_weights)

    def main(self, boundary, per_call, inputs):
        return jax.tree.unflatten(self.out_tree, self.run_main(*boundary, *per_call, *inputs))


def build(
    f: Callable,
    assemble: Callable,
    weights: tuple[Sequence[jax.ShapeDtypeStruct], Static],
    inputs: tuple[Sequence[jax.ShapeDtypeStruct], Static],
    *,
    max_prepared_bytes: int | None,
    cut_broadcasts: bool,
) -> Program:
    """Traces `f` as a function of the array leaves of its weights and inputs (their statics
    baked in), splits it, and wraps prepare in `jax.jit`.

    Args:
        f: the hoisted function.
        assemble: `(weights, (rest, kwargs)) -> (args, kwargs)`, `f`'s arguments.
        weights, inputs: each `(shapes of the array leaves, static part)`, as `partition` made.
    """
    (w_avals, w_static), (in_avals, in_static) = weights, inputs
    nw = len(w_avals)
    out_tree = []

    def flat(*dyn):
        args, kwargs = assemble(combine(dyn[:nw], w_static), combine(dyn[nw:], in_static))
        outs, tree = jax.tree.flatten(f(*args, **kwargs))
        out_tree.append(tree)
        return outs

    closed = ji.make_closed_jaxpr(flat, *w_avals, *in_avals)
    s = split(closed, nw, max_prepared_bytes=max_prepared_bytes, cut_broadcasts=cut_broadcasts)
    prepare_fn = None
    if s.prepare.jaxpr.outvars:
        run_prepare = ji.as_fun(s.prepare)

        def prepare(*weights_and_consts):
            return tuple(run_prepare(*weights_and_consts))

        prepare_fn = jax.jit(prepare)
    consts = [s.consts[i] for i in s.prepare_consts]
    consts += [s.consts[b.index] for b in s.boundary if b.source == "const"]
    boundary = (
        str(s.prepare.jaxpr),
        s.prepare_weights,
        tuple((b.source, b.index) for b in s.boundary),
        tuple(map(id, consts)),
    )
    tag = Tag((tuple(w_avals), w_static), boundary, tuple(consts))
    return Program(s, out_tree[0], tag, prepare_fn, ji.as_fun(s.main))
