"""`Int8Model`: a validated int8 model file and every way to run it (reference, JAX, tensor parallel).

The model itself is immutable host data (numpy). The compiled programs and the device copies of
the tables are built on first use and kept on the instance: the only state here, and a cache.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._files import atomic_write
from ..state import KVCache
from ._decode import Int8Params, generate_loop, new_cache, step_body
from ._errors import Int8PositionError, Int8PromptError, Int8TokenError
from ._reference import reference_step
from ._schema import FORMAT, TENSORS, accumulator_bounds, validate
from ._tp import (
    TpManifest,
    check_tp,
    make_mesh,
    manifest,
    place,
    place_cache,
    tp_generate_fn,
    tp_step_fn,
)

__all__ = ["Int8Model"]


@dataclasses.dataclass(frozen=True, eq=False)
class Int8Model:
    """A one-layer decoder-only transformer that runs on integers only.

    Build one with `Int8Model.from_json(path_or_dict)` (validated; schema in docs/int8.md) or
    `Int8Model.random(seed)`. Every decode path gives the same integers: `reference_step` (numpy),
    `decode_step` (JAX, optionally tensor parallel with `tp=N`), `generate` (the whole trace in one
    compiled call) and `prompt_next_tokens`.

    Attributes:
        dims: d, heads, d_ff, vocab, ctx.
        tokens: the string each token id spells.
        requant: requant point -> (M, S).
        exp_table: int32 [L], the softmax's exp table.
        tensors: name -> int8 array (embed [vocab d], positions [ctx d], wq wk wv wo [d d],
            w1 [d d_ff], w2 [d_ff d], eq [vocab d]).
        meta: free-form notes from the file (how it was trained, its float accuracy, ...).
    """

    dims: Mapping[str, int]
    tokens: tuple[str, ...]
    requant: Mapping[str, tuple[int, int]]
    exp_table: np.ndarray
    tensors: Mapping[str, np.ndarray]
    meta: Mapping[str, Any]
    _cache: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    # -- loading and saving -------------------------------------------------------------------

    @classmethod
    def from_json(cls, src: str | os.PathLike | Mapping[str, Any]) -> Int8Model:
        """Loads and validates a model file (a path, or the parsed JSON object).

        Raises:
            Int8FileError (E1601) and the other E16xx errors, naming the bad field.
        """
        if isinstance(src, Mapping):
            obj = src
        else:
            with open(src, encoding="utf-8") as f:
                obj = json.load(f)
        return cls(**validate(obj))

    def to_dict(self) -> dict[str, Any]:
        """The model file as a JSON-ready object (`from_json(m.to_dict())` round-trips)."""
        return {
            "format": FORMAT,
            "dims": dict(self.dims),
            "tokens": list(self.tokens),
            "requant": {k: [int(m), int(s)] for k, (m, s) in self.requant.items()},
            "exp_table": [int(v) for v in self.exp_table],
            "tensors": {k: self.tensors[k].reshape(-1).astype(int).tolist() for k in TENSORS},
            "meta": dict(self.meta),
        }

    def save(self, path: str | os.PathLike) -> None:
        """Writes the model file atomically (temp file, fsync, rename)."""
        atomic_write(path, json.dumps(self.to_dict(), separators=(",", ":")).encode())

    @classmethod
    def random(
        cls,
        seed: int,
        *,
        d: int = 32,
        heads: int = 4,
        d_ff: int = 64,
        vocab: int = 16,
        ctx: int = 16,
        table_len: int = 64,
    ) -> Int8Model:
        """A random valid model whose requant pairs keep activations spread over int8 (for tests
        and benchmarks; its tokens spell `t0`, `t1`, ...)."""
        from ._random import random_model_dict

        return cls.from_json(
            random_model_dict(
                seed, d=d, heads=heads, d_ff=d_ff, vocab=vocab, ctx=ctx, table_len=table_len
            )
        )

    # -- sizes, text -------------------------------------------------------------------------

    d = property(lambda self: self.dims["d"])
    heads = property(lambda self: self.dims["heads"])
    d_ff = property(lambda self: self.dims["d_ff"])
    vocab = property(lambda self: self.dims["vocab"])
    ctx = property(lambda self: self.dims["ctx"])

    def bounds(self) -> dict[str, tuple[int, str]]:
        """Worst-case magnitude of each int32 accumulator, with its formula (all < 2**31)."""
        return accumulator_bounds(self.dims, int(self.exp_table[0]))

    def summary(self) -> str:
        """Shapes, requant pairs and overflow bounds, as `shapeml int8 check` prints them."""
        lines = [
            "int8 transformer: " + ", ".join(f"{k}={v}" for k, v in self.dims.items()),
            f"  exp table: {len(self.exp_table)} entries, {self.exp_table[0]} .. "
            f"{self.exp_table[-1]}",
        ]
        lines += [f"  {n:10s} int8 {tuple(a.shape)}" for n, a in self.tensors.items()]
        lines += [
            f"  requant {n:6s} M={m} S={s} (x * {m / 2**s:.6g})"
            for n, (m, s) in self.requant.items()
        ]
        lines.append("  int32 accumulator bounds (limit 2147483647):")
        lines += [f"    {n:30s} {b:>12d} = {f}" for n, (b, f) in self.bounds().items()]
        return "\n".join(lines)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`: one per character when every token is one character, otherwise
        one per whitespace-separated word. Raises Int8TokenError on a piece no token spells."""
        ids = {t: i for i, t in enumerate(self.tokens)}
        pieces = list(text) if all(len(t) == 1 for t in self.tokens) else text.split()
        out = []
        for i, piece in enumerate(pieces):
            if piece not in ids:
                raise Int8TokenError(
                    f"piece {i} of the prompt, {piece!r}, is not in the vocabulary",
                    fix=f"use only these tokens: {''.join(self.tokens)!r}"
                    if len(self.tokens) < 80
                    else "see the model's `tokens`",
                )
            out.append(ids[piece])
        return out

    def decode(self, ids: Sequence[int]) -> str:
        """The text the token ids spell."""
        sep = "" if all(len(t) == 1 for t in self.tokens) else " "
        return sep.join(self.tokens[int(i)] for i in ids)

    # -- checks --------------------------------------------------------------------------------

    def _check_tok(self, tok: Any, where: str) -> int:
        t = int(tok)
        if not 0 <= t < self.vocab:
            raise Int8TokenError(
                f"{where} = {t} is outside the vocabulary 0..{self.vocab - 1}",
                fix=f"pass token ids in 0..{self.vocab - 1}",
            )
        return t

    def _check_pos(self, pos: Any) -> int:
        p = int(pos)
        if not 0 <= p < self.ctx:
            raise Int8PositionError(
                f"pos = {p} is outside 0..{self.ctx - 1} (ctx = {self.ctx})",
                fix=f"decode at most ctx = {self.ctx} positions",
            )
        return p

    def _check_prompt(self, prompt: Sequence[int], n: int) -> list[int]:
        prompt = [self._check_tok(t, f"prompt[{i}]") for i, t in enumerate(prompt)]
        if not prompt:
            raise Int8PromptError("the prompt is empty", fix="give at least one token")
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise Int8PromptError(
                f"n = {n!r} must be a non-negative integer", fix="ask for n >= 0 generated tokens"
            )
        if len(prompt) + n - 1 > self.ctx:
            raise Int8PromptError(
                f"a prompt of {len(prompt)} tokens plus n = {n} generated tokens feeds "
                f"{len(prompt) + n - 1} tokens, more than ctx = {self.ctx}",
                fix=f"keep len(prompt) + n - 1 <= {self.ctx}",
            )
        return prompt

    def _check_cache(self, cache: Any) -> KVCache:
        want = (1, 1, self.ctx, self.heads, self.d // self.heads)
        if not isinstance(cache, KVCache):
            raise Int8PositionError(
                f"cache must be a shapeml.state.KVCache, got {type(cache).__name__}",
                fix="start from model.init_cache()",
            )
        for name, a in (("k", cache.k), ("v", cache.v)):
            if tuple(a.shape) != want or a.dtype != jnp.int8:
                raise Int8PositionError(
                    f"cache.{name} is {a.dtype}{tuple(a.shape)}, expected int8{want}",
                    fix="start from model.init_cache()",
                )
        return cache

    # -- decoding ------------------------------------------------------------------------------

    def init_cache(self) -> KVCache:
        """An empty KV cache (`shapeml.state.KVCache`, int8): k, v `[1 1 ctx heads d/heads]`,
        one layer, batch 1. Row `pos` of `cache_rows(cache)` is position pos's key/value."""
        return new_cache(self.ctx, self.heads, self.d // self.heads)

    def cache_rows(self, cache: KVCache) -> tuple[np.ndarray, np.ndarray]:
        """The cache as the reference holds it: keys and values as int8 [ctx d] numpy arrays."""
        cache = self._check_cache(cache)
        k, v = jax.device_get((cache.k, cache.v))
        return (np.asarray(k).reshape(self.ctx, self.d), np.asarray(v).reshape(self.ctx, self.d))

    def cache_from_rows(self, k: np.ndarray, v: np.ndarray) -> KVCache:
        """A KVCache holding int8 [ctx d] key and value rows (e.g. the reference's)."""
        shape = (1, 1, self.ctx, self.heads, self.d // self.heads)
        rows = []
        for name, x in (("k", k), ("v", v)):
            x = np.asarray(x)
            if x.shape != (self.ctx, self.d) or x.dtype != np.int8:
                raise Int8PositionError(
                    f"{name} rows are {x.dtype}{x.shape}, expected int8{(self.ctx, self.d)}",
                    fix="pass the reference's k_cache / v_cache",
                )
            rows.append(jnp.asarray(x.reshape(shape)))
        c = self.init_cache()
        return eqx.tree_at(lambda c: (c.k, c.v), c, tuple(rows))

    def _params(self) -> Int8Params:
        if "params" not in self._cache:
            t = self.tensors
            self._cache["params"] = Int8Params(
                *(jnp.asarray(t[n]) for n in Int8Params._fields[:-1]),
                jnp.asarray(self.exp_table, jnp.int32),
            )
        return self._cache["params"]

    def reference_step(
        self, tok: int, pos: int, k_cache: np.ndarray, v_cache: np.ndarray
    ) -> dict[str, np.ndarray]:
        """The numpy integer decode step (docs/int8.md, written out); every intermediate by name.

        Args:
            tok: token id at this position.
            pos: the position, 0 <= pos < ctx.
            k_cache, v_cache: int8 [ctx d], rows 0..pos-1 filled (not modified).

        Returns:
            name -> int64 array, including `logits` [vocab], `next`, and the updated `k_cache`,
            `v_cache` (int8 [ctx d]). Attention intermediates are [heads pos+1].
        """
        tok, pos = self._check_tok(tok, "tok"), self._check_pos(pos)
        return reference_step(
            self.dims,
            self.requant,
            self.exp_table,
            self.tensors,
            tok,
            pos,
            np.asarray(k_cache),
            np.asarray(v_cache),
        )

    def reference_generate(self, prompt: Sequence[int], n: int) -> tuple[list[int], list[int]]:
        """The numpy reference stepped token by token: `(generated, preds)` like `generate`."""
        prompt = self._check_prompt(prompt, n)
        kc = np.zeros((self.ctx, self.d), np.int8)
        vc = np.zeros_like(kc)
        seq, preds = list(prompt), []
        for t in range(len(prompt) + n - 1):
            r = reference_step(
                self.dims, self.requant, self.exp_table, self.tensors, seq[t], t, kc, vc
            )
            kc, vc = r["k_cache"], r["v_cache"]
            preds.append(int(r["next"]))
            if t + 1 >= len(prompt):
                seq.append(int(r["next"]))
        return seq[len(prompt) :], preds

    def _step_fn(self, full: bool = False):
        key = "step_full" if full else "step"
        if key not in self._cache:

            def f(p, tok, pos, cache):
                r = step_body(p, tok, pos, cache, pairs=self.requant, heads=self.heads)
                # the plain step returns only what the caller keeps: fewer output buffers
                return r if full else (r["logits"], r["next"], r["cache"])

            self._cache[key] = jax.jit(f)
        return self._cache[key]

    def step_intermediates(self, tok: int, pos: int, cache: KVCache) -> dict[str, np.ndarray]:
        """The JAX step's intermediates, named and shaped as `reference_step`'s (masked attention
        columns cut off), for checking the two against each other."""
        tok, pos = self._check_tok(tok, "tok"), self._check_pos(pos)
        cache = self._check_cache(cache)
        r = self._step_fn(full=True)(self._params(), np.int32(tok), np.int32(pos), cache)
        r = jax.device_get(r)
        del r["cache"]
        for k in ("scores", "dist", "idx", "e", "p"):
            r[k] = r[k][:, : pos + 1]
        return {k: np.asarray(v) for k, v in r.items()}

    def decode_step(
        self, tok: int, pos: int, cache: KVCache, *, tp: int | None = None, reduce: str = "exact"
    ) -> tuple[jax.Array, jax.Array, KVCache]:
        """One compiled decode step: `(tok, pos, cache) -> (logits, next, cache)`.

        Args:
            tok: the token id fed at `pos`.
            pos: 0 <= pos < ctx; rows 0..pos-1 of the cache hold the earlier positions.
            cache: the KV cache (`init_cache()`, a `shapeml.state.KVCache`); not modified.
            tp: None runs unsplit; N splits over a mesh of N devices (`shard_map`, Megatron).
            reduce: "exact" (the rule); "requant_first" requants partial sums before the
                all-reduce, which is wrong: a negative control for tests, tp only.

        Returns:
            logits int32 [vocab], next int32 (the first maximal logit), the new cache.
        """
        tok, pos = self._check_tok(tok, "tok"), self._check_pos(pos)
        cache = self._check_cache(cache)
        if tp is None:
            return self._step_fn()(self._params(), np.int32(tok), np.int32(pos), cache)
        fn, mesh = self._tp(tp, "step", reduce)
        c = place_cache(mesh, cache)
        return fn(self.tp_params(tp), np.int32(tok), np.int32(pos), c)

    def _tp(self, tp: int, kind: str, reduce: str):
        check_tp(tp, self.dims)
        if reduce not in ("exact", "requant_first"):
            raise ValueError(f"reduce must be 'exact' or 'requant_first', got {reduce!r}")
        key = (kind, tp, reduce)
        if key not in self._cache:
            mesh = make_mesh(tp)
            make = tp_step_fn if kind == "step" else tp_generate_fn
            fn = make(mesh, self.requant, self.heads, self.init_cache(), reduce)
            self._cache[key] = (fn, mesh)
        return self._cache[key]

    def tp_params(self, tp: int) -> Int8Params:
        """The model's tables placed on a tp-device mesh as `tp_manifest(tp)` says (each a
        `jax.Array` whose `.sharding` shows its split); placed once, then reused."""
        key = ("params", tp)
        if key not in self._cache:
            _, mesh = self._tp(tp, "step", "exact")
            self._cache[key], _ = place(mesh, self._params(), self.init_cache())
        return self._cache[key]

    def tp_manifest(self, tp: int) -> TpManifest:
        """Where every tensor lives when the decode is split over tp devices."""
        return manifest(self.dims, len(self.exp_table), tp)

    def _run(self, prompt: list[int], steps: int, tp: int | None, reduce: str):
        buf = np.zeros((self.ctx + 1,), np.int32)
        buf[: len(prompt)] = prompt
        # numpy arguments: jit transfers them with the call, no separate dispatches
        args = (buf, np.int32(len(prompt)), np.int32(steps))
        if tp is None:
            if "generate" not in self._cache:
                body = functools.partial(generate_loop, pairs=self.requant, heads=self.heads)
                self._cache["generate"] = jax.jit(body)
            return self._cache["generate"](self._params(), *args)
        fn, _ = self._tp(tp, "generate", reduce)
        return fn(self.tp_params(tp), *args)

    def generate_arrays(
        self, prompt: Sequence[int], n: int, *, tp: int | None = None, reduce: str = "exact"
    ) -> tuple[jax.Array, jax.Array, KVCache]:
        """`generate` without leaving the device: `(buf, preds, cache)` as device arrays.

        buf int32 [ctx+1] holds prompt then generated tokens; preds int32 [ctx] the `next` of
        each fed position (0 past the trace); cache the final KV cache. One compiled call.
        """
        prompt = self._check_prompt(prompt, n)
        return self._run(prompt, len(prompt) + n - 1, tp, reduce)

    def generate(self, prompt: Sequence[int], n: int, *, tp: int | None = None) -> list[int]:
        """The n tokens greedy decoding appends to `prompt`, the whole trace in one compiled call
        (a `lax` loop over positions, the cache carried on device).

        Raises:
            Int8TokenError: a prompt token outside the vocabulary.
            Int8PromptError: an empty prompt, or len(prompt) + n - 1 > ctx.
        """
        buf, _, _ = self.generate_arrays(prompt, n, tp=tp)
        buf = np.asarray(buf)
        return [int(t) for t in buf[len(prompt) : len(prompt) + n]]

    def prompt_next_tokens(self, prompt: Sequence[int], *, tp: int | None = None) -> list[int]:
        """The next token each step over `prompt` predicts (len(prompt) ids; the last is the first
        token `generate` would append)."""
        prompt = self._check_prompt(prompt, 1)
        _, preds, _ = self._run(prompt, len(prompt), tp, "exact")
        return [int(t) for t in np.asarray(preds)[: len(prompt)]]
