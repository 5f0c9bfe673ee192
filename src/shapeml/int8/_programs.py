"""The compiled decode programs, in the library's one compile cache (`shapeml._compile_cache`),
and the calls that run them.

A program is selected by its kind, tp size and the model's `ModelKey`: class, dims, the shapes
and dtypes of its tables and its requant pairs (compile-time constants, which XLA folds into the
requant arithmetic). The statics `tokens` and `meta_json` are no part of the key: the decode
never reads them, so a model rebuilt with new notes shares its programs.

The per-call cost is kept to a dict lookup: each live model's key, array leaves, dims and, per
tp, its tables placed on the mesh are computed once and kept in a side table keyed by the
model's identity (a weak reference drops the entry with the model; the model holds no state).

Tokens, positions and prompts are checked on the host before a call (`_checks.py`), so the
programs take them as traced int32 values: a new prompt, position or `n` compiles nothing. (The
KV cache checks its positions again inside the program, with `eqx.error_if`.)
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, NamedTuple

import jax
import numpy as np

from .._compile_cache import CompileCache, Signature
from ..models._introspect import dotted_name
from ..state._kvcache import KVCache
from . import _cache, _checks, _tp
from ._decode import generate_loop
from ._decode import step as step_body
from ._tokenizer import IntLike, TokenIds

__all__ = ["PROGRAMS", "ModelKey", "ProgramKey", "generate", "intermediates", "step"]

_MASKED = ("scores", "dist", "idx", "e", "p")  # attention intermediates, [heads T]


class ModelKey(NamedTuple):
    """What about a model selects a program (its statics `tokens`, `meta_json` left out)."""

    cls: type
    dims: tuple[tuple[str, int], ...]
    tables: Signature  # of the model's array leaves other than the pairs
    pairs: tuple[tuple[int, int], ...]  # requant pairs, folded into the program as constants


class ProgramKey(NamedTuple):
    """What selects a compiled decode program."""

    kind: str  # "step", "intermediates" or "generate"
    tp: int | None  # None: unsplit; N: shard_map over N devices
    model: ModelKey
    cache: Any  # the KV cache's treedef (step kinds), None (generate)


@dataclasses.dataclass
class _Entry:
    """What a live model's calls reuse: its key, tables and dims, and its placements per tp."""

    ref: weakref.ref
    key: ModelKey
    names: list[str]  # dotted field name of each table
    tables: list  # array leaves, the pairs left out
    dims: Any
    placed: dict = dataclasses.field(default_factory=dict)  # tp -> tables on the mesh


_ENTRIES: dict[int, _Entry] = {}  # id(model) -> entry, dropped when the model is collected
_TEMPLATES: dict[ModelKey, tuple[Any, int, np.ndarray]] = {}  # treedef, pairs' leaf, pairs


def _entry(m) -> _Entry:
    e = _ENTRIES.get(id(m))
    if e is not None and e.ref() is m:
        return e
    with_paths, treedef = jax.tree_util.tree_flatten_with_path(m)
    names = [dotted_name(p) for p, _ in with_paths]  # leaves paired with fields by path
    at = names.index("requant_pairs")
    pairs = np.asarray(jax.device_get(with_paths[at][1]), np.int32)
    tables = [x for i, (_, x) in enumerate(with_paths) if i != at]
    del names[at]
    dims = m.dims
    key = ModelKey(
        type(m), tuple(dims.items()), Signature.of(tables)[0], tuple(map(tuple, pairs.tolist()))
    )
    _TEMPLATES.setdefault(key, (treedef, at, pairs))
    i = id(m)
    e = _Entry(weakref.ref(m, lambda _: _ENTRIES.pop(i, None)), key, names, tables, dims)
    _ENTRIES[i] = e
    return e


def _build(key: ProgramKey):
    treedef, at, pairs = _TEMPLATES[key.model]
    if key.tp is None:
        fn = {"step": _step, "intermediates": step_body, "generate": generate_loop}[key.kind]
    else:
        make = {"step": _tp.tp_step, "generate": _tp.tp_generate}[key.kind]
        fn = make(_tp.tp_mesh(key.tp))

    def program(tables, *args):
        leaves = [*tables[:at], pairs, *tables[at:]]  # the pairs as numpy: constants
        m = jax.tree.unflatten(treedef, leaves)
        if key.cache is not None:
            *args, k, v = args
            args = (*args, jax.tree.unflatten(key.cache, [k, v]))
        return fn(m, *args)

    return jax.jit(program)


PROGRAMS: CompileCache = CompileCache(_build, maxsize=64)
"""The compiled decode programs (a `CompileCache` of at most 64), one per model key, kind and tp."""


def _step(m, tok, pos, cache):
    r = step_body(m, tok, pos, cache)
    return r["logits"], r["next"], r["cache"]  # only what the caller keeps: fewer output buffers


def _tables(e: _Entry, m, tp: IntLike | None) -> list:
    if tp is None:
        return e.tables
    placed = e.placed.get(tp) if type(tp) is int else None  # a list would not even hash
    if placed is None:  # first tp call of this model: check tp, place the tables once
        _tp.check_tp(tp, e.dims)
        placed = e.placed[tp] = _tp.place_tables(m, e.names, e.tables, tp)
    return placed


def _checked_cache(e: _Entry, cache, tp: IntLike | None):
    cache = _cache.check_cache(e.dims, cache)
    (k, v), treedef = jax.tree.flatten(cache)
    if tp is not None:
        k, v = _tp.place_cache(k, v, tp)
    return treedef, k, v


def step(m, tok: IntLike, pos: IntLike, cache: KVCache, *, tp: IntLike | None = None):
    """One compiled step, `(logits, next, cache)`, after checking tok, pos and cache."""
    e = _entry(m)
    tok = _checks.check_token(e.dims, tok, "tok")
    pos = _checks.check_pos(e.dims, pos)
    tables = _tables(e, m, tp)
    treedef, k, v = _checked_cache(e, cache, tp)
    program = PROGRAMS.get(ProgramKey("step", tp, e.key, treedef))
    return program(tables, np.int32(tok), np.int32(pos), k, v)


def intermediates(m, tok: IntLike, pos: IntLike, cache: KVCache) -> dict[str, np.ndarray]:
    """Every intermediate of the compiled step on the host, the masked columns cut off."""
    e = _entry(m)
    tok = _checks.check_token(e.dims, tok, "tok")
    pos = _checks.check_pos(e.dims, pos)
    treedef, k, v = _checked_cache(e, cache, None)
    program = PROGRAMS.get(ProgramKey("intermediates", None, e.key, treedef))
    r = jax.device_get(program(e.tables, np.int32(tok), np.int32(pos), k, v))
    del r["cache"]
    for name in _MASKED:
        r[name] = r[name][:, : pos + 1]
    return {name: np.asarray(a) for name, a in r.items()}


def generate(
    m, prompt: TokenIds, n: IntLike, *, steps: int | None = None, tp: IntLike | None = None
):
    """`(buf, preds, cache)`: `prompt` checked with n tokens to generate, then `steps` fed tokens
    (default len(prompt) + n - 1) in one compiled call."""
    e = _entry(m)
    prompt = _checks.check_prompt(e.dims, prompt, n)
    tables = _tables(e, m, tp)
    buf = np.zeros((e.dims.T + 1,), np.int32)
    buf[: len(prompt)] = prompt
    steps = len(prompt) + n - 1 if steps is None else steps
    program = PROGRAMS.get(ProgramKey("generate", tp, e.key, None))
    # numpy arguments: jit transfers them with the call, no separate dispatches
    return program(tables, buf, np.int32(len(prompt)), np.int32(steps))
