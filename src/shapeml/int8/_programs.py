"""The compiled decode programs: `jax.jit` with the program's configuration as static arguments,
so JAX's own cache holds one program per kind, tp size, model key and cache structure.

A model's key is its class, dims and requant pairs (compile-time constants, which XLA folds into
the requant arithmetic); jax.jit adds the shapes, dtypes and placements of its tables, which are
traced arguments. The statics `tokens` and `meta_json` are no part of the key: the decode never
reads them, so a model rebuilt with new notes shares its programs.

The per-call cost is kept to a dict lookup: each live model's key, array leaves, dims and, per
tp, its tables placed on the mesh are computed once and kept in a side table keyed by the
model's identity (a weak reference drops the entry with the model; the model holds no state).

Tokens, positions and prompts are checked on the host before a call (`_checks.py`), so the
programs take them as traced int32 values: a new prompt, position or `n` compiles nothing. (The
KV cache checks its positions again inside the program, with `eqx.error_if`.)
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from typing import Any

import jax
import numpy as np

from ..models._introspect import dotted_name
from ..state._kvcache import KVCache
from . import _cache, _checks, _tp
from ._decode import generate_loop
from ._decode import step as step_body
from ._tokenizer import IntLike, TokenIds

__all__ = ["ModelKey", "generate", "intermediates", "step"]

_MASKED = ("scores", "dist", "idx", "e", "p")  # attention intermediates, [heads T]


@dataclasses.dataclass(frozen=True)
class ModelKey:
    """What about a model selects a program besides its tables' shapes (which jax.jit keys on):
    hashable, so it is a static argument of the programs."""

    cls: type
    dims: tuple[tuple[str, int], ...]
    pairs: tuple[tuple[int, int], ...]  # requant pairs, folded into the program as constants
    at: int  # the pairs' position among the model's leaves
    # Rebuilds the model inside the trace. No part of the key: it holds the statics `tokens` and
    # `meta_json` of the first model seen, which the decode never reads.
    treedef: Any = dataclasses.field(compare=False, repr=False)


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
    key = ModelKey(type(m), tuple(dims.items()), tuple(map(tuple, pairs.tolist())), at, treedef)
    i = id(m)
    e = _Entry(weakref.ref(m, lambda _: _ENTRIES.pop(i, None)), key, names, tables, dims)
    _ENTRIES[i] = e
    return e


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _program(kind: str, tp: int | None, model: ModelKey, cache: Any, tables: list, *args):
    """The decode of `kind` ("step", "intermediates" or "generate"), unsplit (`tp=None`) or under
    `shard_map` over `tp` devices; `cache` is the KV cache's treedef (step kinds) or None."""
    if tp is None:
        fn = {"step": _step, "intermediates": step_body, "generate": generate_loop}[kind]
    else:
        fn = {"step": _tp.tp_step, "generate": _tp.tp_generate}[kind](_tp.tp_mesh(tp))
    pairs = np.asarray(model.pairs, np.int32)  # numpy: constants in the program
    m = jax.tree.unflatten(model.treedef, [*tables[: model.at], pairs, *tables[model.at :]])
    if cache is not None:
        *args, k, v = args
        args = (*args, jax.tree.unflatten(cache, [k, v]))
    return fn(m, *args)


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
    return _program("step", tp, e.key, treedef, tables, np.int32(tok), np.int32(pos), k, v)


def intermediates(m, tok: IntLike, pos: IntLike, cache: KVCache) -> dict[str, np.ndarray]:
    """Every intermediate of the compiled step on the host, the masked columns cut off."""
    e = _entry(m)
    tok = _checks.check_token(e.dims, tok, "tok")
    pos = _checks.check_pos(e.dims, pos)
    treedef, k, v = _checked_cache(e, cache, None)
    args = (np.int32(tok), np.int32(pos), k, v)
    r = jax.device_get(_program("intermediates", None, e.key, treedef, e.tables, *args))
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
    # numpy arguments: jit transfers them with the call, no separate dispatches
    return _program(
        "generate", tp, e.key, None, tables, buf, np.int32(len(prompt)), np.int32(steps)
    )
