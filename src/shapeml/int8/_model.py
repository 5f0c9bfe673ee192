"""`Int8Model`: the integer-only transformer's tables as an `sm.Model`, and its documented methods.

The field declarations below are the one table of the model's tensors (names, shapes in dims,
dtypes): the JSON file format (`_schema.py`), the tensor-parallel split (the rule table of `_tp.py`,
through `shapeml.sharding`) and every decode path read them from here. The dims share the float transformer's names (`shapeml.zoo.transformer`:
V vocab, T ctx, D width, H heads, F FFN width), plus E, the exp table's length, and Dh = D // H,
the head width. The methods are thin wrappers over pure functions of the model: `_reference.py`
(numpy), `_decode.py` (JAX), `_programs.py` (compiled, one program per signature), `_tp.py`.
"""

from __future__ import annotations

import functools
import json
import os
import types
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jaxtyping import Array, Int8, Int32

from .._io import atomic_write
from .._traceback import api_boundary
from ..models import Dims, Model, buffer, full, ones, static, zeros
from ..state._kvcache import KVCache
from . import _cache, _checks, _programs, _reference, _tp
from ._json import read_json, to_dict
from ._numerics import EXP_TABLE_MAX, REQUANT_POINTS, accumulator_bounds
from ._random import random_model_dict
from ._schema import FILE_DIMS, validate, weight_names
from ._tokenizer import IntLike, TokenIds, Tokenizer

__all__ = ["Int8Model"]


class _host_method:  # noqa: N801 - used as a decorator, like `property`
    """Binds a method as a plain Python method, not as an equinox `BoundMethod`.

    Equinox turns every bound method of a Module into a `BoundMethod` Module (a pytree, so that
    `jax.jit(m.method)` works), built again on each attribute access: about 50-90 us, as long as
    a compiled decode step. `Int8Model`'s methods are host-side wrappers that check concrete
    values before they dispatch, so they cannot be traced anyway.
    """

    def __init__(self, fn):
        self.__func__ = fn
        functools.update_wrapper(self, fn)

    def __get__(self, obj, cls=None):
        return self.__func__ if obj is None else functools.partial(self.__func__, obj)


@api_boundary
class Int8Model(Model):
    """A one-layer decoder-only transformer that runs on integers only, as an `sm.Model`.

    Build one with `Int8Model.from_json(path_or_dict)` (validated; schema in docs/int8.md),
    `Int8Model.random(seed)` or `sm.load(path, Int8Model)`. Every decode path gives the same
    integers: `reference_step` (numpy), `decode_step` (JAX, optionally tensor parallel with
    `tp=N`), `generate` (the whole trace in one compiled call) and `prompt_next_tokens`.

    Attributes:
        tokens: the string each token id spells (static); `tokenizer` converts text.
        meta_json: free-form notes from the file, as JSON text (static); `meta` parses them.
        embed, positions, wq, wk, wv, wo, w1, w2, eq: the int8 weights, in the dims below.
        exp_table: int32 [E], the softmax's exp table.
        requant_pairs: int32 [10 2]: row i is (M, S) of requant point `REQUANT_POINTS[i]`;
            `requant` gives them by name.
    """

    dims = Dims(V=14, T=64, D=32, H=4, F=64, E=128, Dh="D // H")
    tokens: tuple[str, ...] = static()
    meta_json: str = static(default="{}")
    embed: Int8[Array, "V D"] = buffer(zeros)
    positions: Int8[Array, "T D"] = buffer(zeros)
    # The head axis is spelled H*Dh, laid out head after head: the tensor-parallel rule table
    # {"H": "tp", "F": "tp"} splits it by its first factor, whole heads per device (`_tp.py`).
    wq: Int8[Array, "D H*Dh"] = buffer(zeros)
    wk: Int8[Array, "D H*Dh"] = buffer(zeros)
    wv: Int8[Array, "D H*Dh"] = buffer(zeros)
    wo: Int8[Array, "H*Dh D"] = buffer(zeros)
    w1: Int8[Array, "D F"] = buffer(zeros)
    w2: Int8[Array, "F D"] = buffer(zeros)
    eq: Int8[Array, "V D"] = buffer(zeros)
    exp_table: Int32[Array, " E"] = buffer(full(EXP_TABLE_MAX))
    requant_pairs: Int32[Array, "10 2"] = buffer(ones)

    def __check_init__(self):
        _checks.check_model(self)

    # -- the JSON file (import/export) -------------------------------------------------------

    @classmethod
    def from_json(cls, src: str | os.PathLike | Mapping[str, Any]) -> Int8Model:
        """Loads and validates a model file (a path, or the parsed JSON object).

        Raises:
            Int8FileError (E1601) and the other E16xx errors, naming the bad field;
            Int8JsonError (E1614) for a file that is not JSON, nests too deep or is too large;
            FileMissingError (E1304) / FileFormatError (E1302) for a missing or non-UTF-8 file.
        """
        obj = read_json(src)
        return cls(**validate(obj, cls))

    @_host_method
    def to_dict(self) -> dict[str, Any]:
        """The model file as a JSON-ready object (`from_json(m.to_dict())` round-trips)."""
        return to_dict(self)

    @_host_method
    def to_json(self, path: str | os.PathLike | None = None) -> str:
        """The model file's text (compact JSON); with `path`, also written there atomically."""
        text = json.dumps(to_dict(self), separators=(",", ":"))
        if path is not None:
            atomic_write(path, text.encode())
        return text

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
        return cls.from_json(
            random_model_dict(
                cls, seed, d=d, heads=heads, d_ff=d_ff, vocab=vocab, ctx=ctx, table_len=table_len
            )
        )

    # -- sizes, names, text ------------------------------------------------------------------

    d = property(lambda self: self.dims.D)
    heads = property(lambda self: self.dims.H)
    d_ff = property(lambda self: self.dims.F)
    vocab = property(lambda self: self.dims.V)
    ctx = property(lambda self: self.dims.T)

    @property
    def file_dims(self) -> dict[str, int]:
        """The dims under the JSON file's names: d, heads, d_ff, vocab, ctx."""
        return {k: self.dims[d] for k, d in FILE_DIMS.items()}

    @property
    def requant(self) -> dict[str, tuple[int, int]]:
        """Requant point -> (M, S), from `requant_pairs`."""
        pairs = np.asarray(self.requant_pairs).tolist()
        return {n: (m, s) for n, (m, s) in zip(REQUANT_POINTS, pairs, strict=True)}

    @property
    def tensors(self) -> Mapping[str, np.ndarray]:
        """Weight name -> its int8 array on the host (read-only views, in a read-only mapping)."""
        return types.MappingProxyType(
            {n: np.asarray(getattr(self, n)) for n in weight_names(type(self))}
        )

    @property
    def meta(self) -> dict[str, Any]:
        """The file's free-form notes (a fresh dict: edit a copy, the model keeps its own)."""
        return json.loads(self.meta_json)

    @property
    def tokenizer(self) -> Tokenizer:
        """Text to token ids and back (`Tokenizer(self.tokens)`)."""
        return Tokenizer(self.tokens)

    @_host_method
    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (`tokenizer.encode`); raises Int8TokenError (E1608)."""
        return self.tokenizer.encode(text)

    @_host_method
    def decode(self, ids: TokenIds) -> str:
        """The text the token ids spell (`tokenizer.decode`)."""
        return self.tokenizer.decode(ids)

    @_host_method
    def bounds(self) -> dict[str, tuple[int, str]]:
        """Worst-case magnitude of each int32 accumulator, with its formula (all < 2**31)."""
        return accumulator_bounds(self.dims, int(self.exp_table[0]))

    @_host_method
    def summary(self) -> str:
        """Shapes, requant pairs and overflow bounds, as `shapeml int8 check` prints them."""
        table = np.asarray(self.exp_table)
        lines = [
            "int8 transformer: " + ", ".join(f"{k}={v}" for k, v in self.file_dims.items()),
            f"  exp table: {len(table)} entries, {table[0]} .. {table[-1]}",
        ]
        lines += [f"  {n:10s} int8 {tuple(a.shape)}" for n, a in self.tensors.items()]
        lines += [
            f"  requant {n:6s} M={m} S={s} (x * {m / 2**s:.6g})"
            for n, (m, s) in self.requant.items()
        ]
        lines.append("  int32 accumulator bounds (limit 2147483647):")
        lines += [f"    {n:30s} {b:>12d} = {f}" for n, (b, f) in self.bounds().items()]
        return "\n".join(lines)

    # -- the KV cache ------------------------------------------------------------------------

    @_host_method
    def init_cache(self) -> KVCache:
        """An empty KV cache (`shapeml.state.KVCache`, int8): k, v `[1 1 ctx heads d/heads]`,
        one layer, batch 1. Row `pos` of `cache_rows(cache)` is position pos's key/value."""
        return _cache.init_cache(self)

    @_host_method
    def cache_rows(self, cache: KVCache) -> tuple[np.ndarray, np.ndarray]:
        """The cache as the reference holds it: keys and values as int8 [ctx d] numpy arrays."""
        return _cache.cache_rows(self, cache)

    @_host_method
    def cache_from_rows(self, k: np.ndarray, v: np.ndarray) -> KVCache:
        """A KVCache holding int8 [ctx d] key and value rows (e.g. the reference's)."""
        return _cache.cache_from_rows(self, k, v)

    # -- decoding: thin wrappers over the pure functions ---------------------------------------

    @_host_method
    def reference_step(
        self, tok: IntLike, pos: IntLike, k_cache: np.ndarray, v_cache: np.ndarray
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
        return _reference.reference_step(self, tok, pos, k_cache, v_cache)

    @_host_method
    def reference_generate(self, prompt: TokenIds, n: IntLike) -> tuple[list[int], list[int]]:
        """The numpy reference stepped token by token: `(generated, preds)` like `generate`."""
        return _reference.reference_generate(self, prompt, n)

    @_host_method
    def step_intermediates(
        self, tok: IntLike, pos: IntLike, cache: KVCache
    ) -> dict[str, np.ndarray]:
        """The JAX step's intermediates, named and shaped as `reference_step`'s (masked attention
        columns cut off), for checking the two against each other."""
        return _programs.intermediates(self, tok, pos, cache)

    @_host_method
    def decode_step(
        self, tok: IntLike, pos: IntLike, cache: KVCache, *, tp: IntLike | None = None
    ) -> tuple[jax.Array, jax.Array, KVCache]:
        """One compiled decode step: `(tok, pos, cache) -> (logits, next, cache)`.

        Args:
            tok: the token id fed at `pos`.
            pos: 0 <= pos < ctx; rows 0..pos-1 of the cache hold the earlier positions.
            cache: the KV cache (`init_cache()`, a `shapeml.state.KVCache`); not modified.
            tp: None runs unsplit; N splits over a mesh of N devices (`shard_map`, Megatron).

        Returns:
            logits int32 [vocab], next int32 (the first maximal logit), the new cache.
        """
        return _programs.step(self, tok, pos, cache, tp=tp)

    @_host_method
    def generate_arrays(
        self, prompt: TokenIds, n: IntLike, *, tp: IntLike | None = None
    ) -> tuple[jax.Array, jax.Array, KVCache]:
        """`generate` without leaving the device: `(buf, preds, cache)` as device arrays.

        buf int32 [ctx+1] holds prompt then generated tokens; preds int32 [ctx] the `next` of
        each fed position (0 past the trace); cache the final KV cache. One compiled call.
        """
        return _programs.generate(self, prompt, n, tp=tp)

    @_host_method
    def generate(self, prompt: TokenIds, n: IntLike, *, tp: IntLike | None = None) -> list[int]:
        """The n tokens greedy decoding appends to `prompt`, the whole trace in one compiled call
        (a `lax` loop over positions, the cache carried on device).

        Raises:
            Int8TokenError: a prompt token outside the vocabulary.
            Int8PromptError: an empty prompt, or len(prompt) + n - 1 > ctx.
        """
        buf, _, _ = self.generate_arrays(prompt, n, tp=tp)
        start = len(prompt)
        return np.asarray(buf)[start : start + n].tolist()

    @_host_method
    def prompt_next_tokens(self, prompt: TokenIds, *, tp: IntLike | None = None) -> list[int]:
        """The next token each step over `prompt` predicts (len(prompt) ids; the last is the first
        token `generate` would append)."""
        _, preds, _ = _programs.generate(self, prompt, 1, steps=len(prompt), tp=tp)
        return np.asarray(preds)[: len(prompt)].tolist()

    # -- tensor parallel ----------------------------------------------------------------------

    @_host_method
    def tp_manifest(self, tp: IntLike) -> _tp.TpManifest:
        """Where every tensor lives when the decode is split over tp devices."""
        return _tp.manifest(self, tp)

    @_host_method
    def tp_params(self, tp: IntLike) -> Int8Model:
        """This model with every table placed on a tp-device mesh as `tp_manifest(tp)` says (each
        a `jax.Array` whose `.sharding` shows its split). Decoding the placed model with the same
        `tp` skips the per-call placement."""
        return _tp.place(self, _tp.mesh(self, tp))
