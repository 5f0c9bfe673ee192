"""The compiled decode programs: one per kind, tp size and signature of model and arguments, in
the library's one compile cache (`shapeml._compile_cache`), and the calls that run them.

Tokens, positions and prompts are checked on the host before a call (`_checks.py`), so the
programs take them as traced int32 values: a new prompt, position or `n` compiles nothing. (The
KV cache checks its positions again inside the program, with `eqx.error_if`.)
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np

from .._compile_cache import CompileCache, Signature
from ..state import KVCache
from . import _tp
from ._decode import generate_loop
from ._decode import step as step_body

__all__ = ["PROGRAMS", "ProgramKey", "generate", "intermediates", "step"]

_MASKED = ("scores", "dist", "idx", "e", "p")  # attention intermediates, [heads T]


class ProgramKey(NamedTuple):
    """What selects a compiled decode program."""

    kind: str  # "step", "intermediates" or "generate"
    tp: int | None  # None: unsplit; N: shard_map over N devices
    inputs: Signature  # of (model, *args): shapes, dtypes, and the model's dims and statics


def _step(m, tok, pos, cache):
    r = step_body(m, tok, pos, cache)
    return r["logits"], r["next"], r["cache"]  # only what the caller keeps: fewer output buffers


def _build(key: ProgramKey):
    if key.tp is None:
        fn = {"step": _step, "intermediates": step_body, "generate": generate_loop}[key.kind]
    else:
        make = {"step": _tp.tp_step, "generate": _tp.tp_generate}[key.kind]
        fn = make(_tp.make_mesh(key.tp))
    sig = key.inputs

    # The program takes the array leaves the signature was computed from, so the caller flattens
    # model and arguments once (an `sm.Model` flattens in Python, a tuple of arrays in C++).
    def program(*arrays):
        leaves = [getattr(k, "value", None) for k in sig.leaves]  # static leaves: their value
        for i, a in zip(sig.dynamic(), arrays, strict=True):
            leaves[i] = a
        return fn(*jax.tree.unflatten(sig.treedef, leaves))

    return jax.jit(program)


PROGRAMS: CompileCache = CompileCache(_build)


def _run(kind: str, tp: int | None, *inputs):
    sig, leaves = Signature.of(inputs)
    return PROGRAMS.get(ProgramKey(kind, tp, sig))(*(leaves[i] for i in sig.dynamic()))


def step(m, tok: int, pos: int, cache: KVCache, *, tp: int | None = None):
    """One compiled step, `(logits, next, cache)`; tok, pos and cache checked by the caller."""
    args = (np.int32(tok), np.int32(pos))
    if tp is None:
        return _run("step", None, m, *args, cache)
    mesh = _tp.mesh(m, tp)
    return _run("step", tp, _tp.place(m, mesh), *args, _tp.place(cache, mesh))


def intermediates(m, tok: int, pos: int, cache: KVCache) -> dict[str, np.ndarray]:
    """Every intermediate of the compiled step on the host, the masked columns cut off."""
    r = jax.device_get(_run("intermediates", None, m, np.int32(tok), np.int32(pos), cache))
    del r["cache"]
    for k in _MASKED:
        r[k] = r[k][:, : pos + 1]
    return {k: np.asarray(v) for k, v in r.items()}


def generate(m, prompt: list[int], steps: int, *, tp: int | None = None):
    """`(buf, preds, cache)` of `steps` fed tokens from `prompt` (checked by the caller)."""
    buf = np.zeros((m.dims.T + 1,), np.int32)
    buf[: len(prompt)] = prompt
    # numpy arguments: jit transfers them with the call, no separate dispatches
    args = (buf, np.int32(len(prompt)), np.int32(steps))
    if tp is None:
        return _run("generate", None, m, *args)
    return _run("generate", tp, _tp.place(m, _tp.mesh(m, tp)), *args)
