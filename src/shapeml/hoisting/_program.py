"""One traced-and-split program: its compiled prepare and main halves and how to call them.

A `Program` is built once per `ProgramKey` (the signatures of the weights and the inputs); it holds
no weight values, so new weights of the same shapes reuse it (and its compiled code).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from .. import _jax_internals as ji
from .._compile_cache import Signature
from ._split import Split, split


class ProgramKey(NamedTuple):
    """What selects a program: the weights' and the inputs' signatures, and how many positional
    arguments `f` was called with (to put the weights back in their places)."""

    weights: Signature
    inputs: Signature
    n_args: int


class PrepareKey(NamedTuple):
    """Equal for programs whose prepare halves compute the same thing (e.g. one model traced at
    batch 1 and at batch 32), so one set of weights is prepared once for both."""

    jaxpr: str
    weights: tuple[int, ...]  # the dynamic weight leaves prepare reads
    consts: tuple[int, ...]  # ids of the constants it reads (held by the program, so stable)


@dataclasses.dataclass
class Program:
    """A traced `f`, split, with its compiled halves.

    `prepare(dyn_weights)` returns the tuple of boundary tensors main reads;
    `main(boundary, per_call_weights, dyn_inputs)` returns `f`'s output pytree.
    """

    split: Split
    out_tree: Any
    prepare_fn: Callable | None
    main: Callable
    prepare_key: PrepareKey

    def prepare(self, dyn_weights) -> tuple:
        s = self.split
        computed = ()
        if self.prepare_fn is not None:
            with jax.ensure_compile_time_eval():
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


def trace(f: Callable, assemble: Callable, key: ProgramKey) -> tuple[ji.ClosedJaxpr, Any]:
    """Traces `f` as a function of the array leaves of `key` only (statics are baked in).

    `assemble(w_leaves, in_leaves)` rebuilds `f`'s `(args, kwargs)` from full leaf lists.
    Returns the closed jaxpr, whose inputs are the weights' array leaves then the inputs', and
    the structure of `f`'s output.
    """
    w_template, in_template = key.weights.abstract_leaves(), key.inputs.abstract_leaves()
    w_dyn, in_dyn = key.weights.dynamic(), key.inputs.dynamic()
    out_tree = []
    nw = len(w_dyn)

    def flat(*dyn):
        args, kwargs = assemble(key.weights.fill(dyn[:nw]), key.inputs.fill(dyn[nw:]))
        outs, tree = jax.tree.flatten(f(*args, **kwargs))
        out_tree.append(tree)
        return outs

    avals = [w_template[i] for i in w_dyn] + [in_template[i] for i in in_dyn]
    closed = ji.make_closed_jaxpr(flat, *avals)
    return closed, out_tree[0]


def build(
    closed: ji.ClosedJaxpr,
    out_tree,
    n_weights: int,
    *,
    max_prepared_bytes: int | None,
    cut_broadcasts: bool,
) -> Program:
    """Splits a traced program and wraps both halves in `jax.jit`."""
    s = split(
        closed, n_weights, max_prepared_bytes=max_prepared_bytes, cut_broadcasts=cut_broadcasts
    )
    prepare_fn = None
    if s.prepare.jaxpr.outvars:
        run_prepare = ji.as_fun(s.prepare)

        def prepare(*weights_and_consts):
            return tuple(run_prepare(*weights_and_consts))

        prepare_fn = jax.jit(prepare)
    run_main = ji.as_fun(s.main)

    # One jitted call per forward: the prepared tensors are plain arguments, and the output
    # pytree is rebuilt inside jit, where jax does it in C++.
    def main(boundary, per_call, inputs):
        return jax.tree.unflatten(out_tree, run_main(*boundary, *per_call, *inputs))

    key = PrepareKey(
        str(s.prepare.jaxpr),
        s.prepare_weights,
        tuple(id(s.consts[i]) for i in s.prepare_consts),
    )
    return Program(s, out_tree, prepare_fn, jax.jit(main), key)
