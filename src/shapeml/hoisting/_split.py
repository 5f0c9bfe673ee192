"""Splitting a traced program into the part that depends only on the weights and the rest.

The prepare program holds every equation reachable only from the weights and constants (never
from a per-call input, a PRNG key or a side effect); the main program holds the rest and reads
the prepare program's results (the boundary tensors) as ordinary arguments.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from .. import _jax_internals as ji
from .._traceback import api_boundary

# Ops that only lay out an existing tensor: a broadcast seen through them is still a broadcast.
_LAYOUT_OPS = frozenset({"reshape", "squeeze", "expand_dims", "transpose", "broadcast_in_dim"})
# Ops whose result can be far bigger than their operands for no work: cheap to redo per call.
_EXPANDING_OPS = frozenset({"broadcast_in_dim", "iota"})


@api_boundary
@dataclasses.dataclass(frozen=True)
class Boundary:
    """One tensor handed from prepare to main.

    `source` says where its value comes from: `"prepared"` (computed by prepare, `index` into its
    outputs), `"weight"` (a weight leaf passed through, `index` into the dynamic weight leaves) or
    `"const"` (a constant captured by the trace, `index` into `Split.consts`).
    """

    source: str
    index: int
    shape: tuple
    dtype: Any
    nbytes: int
    producer: str  # the primitive that computed it, or "weight"/"const"


@dataclasses.dataclass(frozen=True)
class Split:
    """The two programs and how to wire them (see `split`)."""

    prepare: ji.ClosedJaxpr  # (prepare weights..., prepare consts...) -> prepared tensors
    prepare_weights: tuple[int, ...]  # indices into the dynamic weight leaves
    prepare_consts: tuple[int, ...]  # indices into `consts`
    consts: tuple
    main: ji.ClosedJaxpr  # (boundary..., per-call weights..., inputs...) -> outputs
    boundary: tuple[Boundary, ...]
    per_call_weights: tuple[int, ...]  # weight leaves main reads directly every call (keys)
    prepare_ops: dict[str, int]
    main_ops: dict[str, int]
    cut_broadcasts: int
    over_budget: int


def split(
    closed: ji.ClosedJaxpr,
    n_weights: int,
    *,
    max_prepared_bytes: int | None,
    cut_broadcasts: bool,
) -> Split:
    """Splits `closed`, whose first `n_weights` inputs are weight leaves and the rest per-call inputs.

    Weight leaves that are PRNG keys count as per-call. An equation goes to prepare when all its
    operands are known, it draws no random bits and touches no key, has no side effect, and its
    results have concrete shapes. Then boundary tensors that are only broadcasts of smaller ones
    are cut (the broadcast moves to main), and while the prepared bytes exceed
    `max_prepared_bytes` the producer of the largest prepared tensor moves to main.
    """
    known_w = [not ji.is_key_dtype(v.aval.dtype) for v in closed.jaxpr.invars[:n_weights]]
    n_inputs = len(closed.jaxpr.invars) - n_weights
    jaxpr = ji.inline_jit(closed, known_w + [False] * n_inputs)
    jx = jaxpr.jaxpr
    consts = tuple(jaxpr.consts)
    w_vars = list(jx.invars[:n_weights])
    in_vars = list(jx.invars[n_weights:])

    known: set = {v for v, k in zip(w_vars, known_w) if k} | set(jx.constvars)
    producer: dict = {}
    eqns = jx.eqns
    in_main = []
    for i, eqn in enumerate(eqns):
        ok = (
            all(v in known for v in ji.eqn_input_vars(eqn))
            and not ji.has_effects(eqn)
            and not ji.is_random(eqn)
            and all(ji.is_concrete_aval(v.aval) for v in eqn.outvars)
        )
        if ok:
            known.update(eqn.outvars)
            for v in eqn.outvars:
                producer[v] = i
        in_main.append(not ok)
    is_prepare = [not m for m in in_main]

    def boundary_vars() -> list:
        defined = set()
        out = {}
        for i, eqn in enumerate(eqns):
            if in_main[i]:
                for v in ji.eqn_input_vars(eqn):
                    if v in known and v not in defined:
                        out[v] = None
                defined.update(eqn.outvars)
        for v in jx.outvars:
            if not ji.is_literal(v) and v in known and v not in defined:
                out[v] = None
        return list(out)

    cuts = 0
    if cut_broadcasts:
        changed = True
        while changed:
            changed = False
            for v in boundary_vars():
                chain = _broadcast_chain(v, eqns, producer)
                if chain and not all(in_main[i] for i in chain):
                    for i in chain:
                        in_main[i] = True
                    cuts += 1
                    changed = True

    moves = 0
    if max_prepared_bytes is not None:
        while True:
            computed = [v for v in boundary_vars() if v in producer]
            total = sum(ji.nbytes(v.aval) for v in computed)
            if total <= max_prepared_bytes or not computed:
                break
            largest = max(computed, key=lambda v: ji.nbytes(v.aval))
            in_main[producer[largest]] = True
            moves += 1

    bvars = boundary_vars()
    computed = [v for v in bvars if v in producer]
    w_index = {v: j for j, v in enumerate(w_vars)}
    c_index = {v: j for j, v in enumerate(jx.constvars)}

    # Prepare: all known weights and consts in, the computed boundary tensors out, then pruned.
    prep_w = [j for j, k in enumerate(known_w) if k]
    prepare = ji.build_closed_jaxpr(
        [w_vars[j] for j in prep_w] + list(jx.constvars),
        computed,
        [e for e, p in zip(eqns, is_prepare) if p],
        name="prepare",
    )
    prepare, used = ji.prune(prepare)
    prepare_weights = tuple(j for j, u in zip(prep_w, used[: len(prep_w)]) if u)
    prepare_consts = tuple(j for j, u in enumerate(used[len(prep_w) :]) if u)

    boundary = []
    for v in bvars:
        if v in producer:
            src, idx, what = "prepared", computed.index(v), ji.eqn_name(eqns[producer[v]])
        elif v in w_index:
            src, idx, what = "weight", w_index[v], "weight"
        else:
            src, idx, what = "const", c_index[v], "const"
        aval = v.aval
        boundary.append(Boundary(src, idx, tuple(aval.shape), aval.dtype, ji.nbytes(aval), what))

    per_call_w = [j for j, k in enumerate(known_w) if not k]
    main = ji.build_closed_jaxpr(
        bvars + [w_vars[j] for j in per_call_w] + in_vars,
        jx.outvars,
        [e for e, m in zip(eqns, in_main) if m],
        name="main",
    )
    main, _ = ji.prune(main, keep_inputs=True)

    return Split(
        prepare=prepare,
        prepare_weights=prepare_weights,
        prepare_consts=prepare_consts,
        consts=consts,
        main=main,
        boundary=tuple(boundary),
        per_call_weights=tuple(per_call_w),
        prepare_ops=dict(Counter(ji.eqn_name(e) for e in prepare.jaxpr.eqns)),
        main_ops=dict(Counter(ji.eqn_name(e) for e in main.jaxpr.eqns)),
        cut_broadcasts=cuts,
        over_budget=moves,
    )


def _broadcast_chain(v, eqns, producer) -> list[int]:
    """The trailing equations making `v` that main should redo instead of caching their result.

    That is the whole chain when `v` is a broadcast (seen through layout ops) of something
    smaller, and otherwise the trailing reshapes and same-size broadcasts, which cost nothing in
    main but would store a copy (several copies, when one tensor is reshaped for several uses).
    A transpose moves data, so it is kept in prepare unless it sits on a broadcast.
    """
    out_size = ji.size(v.aval)
    chain: list[int] = []
    free = 0
    moved_data = False
    while v in producer:
        i = producer[v]
        eqn = eqns[i]
        name = ji.eqn_name(eqn)
        ins = ji.eqn_input_vars(eqn)
        if name in _EXPANDING_OPS and out_size > sum(ji.size(x.aval) for x in ins):
            return [*chain, i]
        if name not in _LAYOUT_OPS or len(ins) != 1:
            break
        chain.append(i)
        moved_data |= name == "transpose"
        if not moved_data:
            free = len(chain)
        v = ins[0]
    return chain[:free]
