"""One traced-and-split program: its compiled prepare and main halves and how to call them.

A `Program` is built once per structure and shapes of the weights and inputs; it holds no weight
values, so new weights of the same shapes reuse it (and its compiled code).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from .. import _jax_internals as ji
from .._compile_cache import UnhashableStaticError
from ._split import Split, split

_STATIC = object()  # marks a static (non-array) leaf in a signature


def is_array(x) -> bool:
    """Array leaves are traced; every other leaf is static configuration (as `eqx.filter_jit`)."""
    return isinstance(x, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct))


_ArrayImpl = ji.ArrayImpl


def leaf_key(x):
    """What about a leaf selects the program: shape, dtype and weak type, or a static value."""
    if type(x) is _ArrayImpl:  # the common case, without an ABC isinstance check
        return (x.shape, x.dtype, x.weak_type)
    if isinstance(x, jax.Array):
        return (x.shape, x.dtype, getattr(x, "weak_type", False))
    if isinstance(x, (np.ndarray, np.generic, jax.ShapeDtypeStruct)):
        return (x.shape, x.dtype, bool(getattr(x, "weak_type", False)))
    try:
        hash(x)
    except TypeError:
        raise UnhashableStaticError(
            f"an argument leaf of type `{type(x).__name__}` is neither an array nor hashable",
            fix="pass data as arrays and configuration as hashable values (tuples, not lists)",
        ) from None
    return (_STATIC, type(x), x)


def aval_of(x):
    """The abstract value to trace a dynamic leaf with."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    return jax.typeof(x)


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
    # Equal for programs whose prepare halves compute the same thing (e.g. one model traced at
    # batch 1 and at batch 32), so one set of weights is prepared once for both.
    prepare_signature: tuple

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


def trace(
    f: Callable,
    assemble: Callable,
    w_template: list,
    in_template: list,
    w_dyn: list[int],
    in_dyn: list[int],
    dyn_avals: list,
) -> tuple[ji.ClosedJaxpr, Any]:
    """Traces `f` as a function of the dynamic leaves only (statics are baked in).

    `assemble(w_leaves, in_leaves)` rebuilds `f`'s `(args, kwargs)` from full leaf lists; the
    templates hold the static leaves, and `w_dyn`/`in_dyn` the positions of the dynamic ones.
    """
    out_tree = []
    nw = len(w_dyn)

    def flat(*dyn):
        w_leaves = list(w_template)
        for pos, x in zip(w_dyn, dyn[:nw]):
            w_leaves[pos] = x
        in_leaves = list(in_template)
        for pos, x in zip(in_dyn, dyn[nw:]):
            in_leaves[pos] = x
        args, kwargs = assemble(w_leaves, in_leaves)
        outs, tree = jax.tree.flatten(f(*args, **kwargs))
        out_tree.append(tree)
        return outs

    closed = ji.make_closed_jaxpr(flat, *dyn_avals)
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

    signature = (
        str(s.prepare.jaxpr),
        s.prepare_weights,
        tuple(id(s.consts[i]) for i in s.prepare_consts),
    )
    return Program(s, out_tree, prepare_fn, jax.jit(main), signature)
