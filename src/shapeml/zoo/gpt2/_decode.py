"""GPT-2 decoding against `shapeml.state.KVCache`: a prefill or decode `step`, and `generate`, the
whole token loop (greedy or sampled) in one compiled call."""

from __future__ import annotations

import functools
import typing

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from ..._shaped import shaped
from ..._traceback import api_boundary
from ..._validate import instance
from ...state._kvcache import KVCache
from .._decoding import generate_with, token_loop
from ._model import GPT2, positions

__all__ = ["generate", "new_cache", "step"]


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def new_cache(m: GPT2, batch: int = 1, ctx: int | None = None) -> KVCache:
    """An empty cache for `m`: `L` layers, `batch` sequences of `ctx` positions (default `T`),
    `H` heads of `Dh`, in the weights' dtype."""
    instance("m", m, GPT2, "a GPT2")
    d = m.dims
    ctx = d.T if ctx is None else ctx
    return KVCache(d.L, ctx, d.H, d.D // d.H, m.wte.w.dtype, batch=batch, name="GPT-2 KV cache")


@shaped
def step(
    m: GPT2, cache: KVCache, tokens: Int[Array, "b n"], pos: int | Int[Array, ""]
) -> tuple[Float[Array, "b n V"], KVCache]:
    """Runs `n` new tokens at positions `pos .. pos + n - 1` against the cache.

    `n` = the prompt at `pos = 0` is a prefill, `n = 1` a decode step; `pos` may be traced (no
    recompile).

    Args:
        m: the weights.
        cache: from `new_cache(m, batch=b)`, holding positions `0 .. pos - 1`.
        tokens: the new token ids `[b n]`.
        pos: the position of the first new token.

    Returns:
        `(logits [b n V], cache)`, the cache now also holding the new positions.

    Raises:
        StateIndexError: (E1401) if `pos + n` exceeds `T` or the cache, or `pos < 0`.
    """
    x, cache = _hidden(m, cache, tokens, pos)
    return _logits(m, x), cache


def _hidden(m: GPT2, cache: KVCache, tokens, pos):
    """The final hidden states `[b n D]` (after `ln_f`) of `step`, and the cache."""
    x = m.wte(tokens) + positions(m, pos, tokens.shape[1])
    for layer, block in enumerate(m.h):
        a, cache = block.attn.step(block.ln_1(x), cache, layer, pos)
        x = x + a
        x = x + block.mlp(block.ln_2(x))
    return m.ln_f(x), cache


def _logits(m: GPT2, x):
    """`x @ wte.w.T` as one dot over the table as it is stored: `[V D]`, contracted on `D`. (The
    training head's `dense(x, w.T)` inside a decode loop made XLA copy the transposed table,
    `V * D` floats, at every token.)"""
    return jnp.einsum("...d,vd->...v", x, m.wte.w)


def _last(m, cache, tokens, pos):
    # only the last position's logits: one product with the table, not one per position
    x, cache = _hidden(m, cache, tokens, pos)
    return _logits(m, x[:, -1]), cache


@functools.partial(jax.jit, static_argnames=("steps", "greedy"))
def _generate(m, prompt, steps, greedy, key, temperature):
    # The cache holds what this call reaches, not the whole context: every step attends over
    # `t + steps` slots instead of `T`.
    cache = new_cache(m, prompt.shape[0], prompt.shape[1] + steps)
    return token_loop(_last, m, cache, prompt, steps, greedy, key, temperature)


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def generate(
    m: GPT2,
    prompt: Int[Array, "b t"],
    steps: int,
    *,
    key: PRNGKeyArray | None = None,
    temperature: float = 1.0,
) -> Int[Array, "b _"]:
    """Extends each prompt by `steps` tokens through the KV cache, in one compiled call.

    Greedy (`key=None`) decoding equals `transformers`' `generate(do_sample=False)` for the
    same weights (without its stopping at an end-of-text token).

    Args:
        m: the weights.
        prompt: token ids `[b t]`, `t >= 1`.
        steps: how many tokens to add (`t + steps <= T`).
        key: None for greedy decoding (argmax); a PRNG key to sample, token `i` drawn with
            `jax.random.fold_in(key, i)` from `softmax(logits / temperature)`.
        temperature: the sampling temperature (> 0); ignored when greedy.

    Returns:
        `[b t + steps]`: the prompt followed by the new tokens.

    Raises:
        GenerateError: (E1411) for a prompt that is not a non-empty integer `[b t]` array.
        StateIndexError: (E1401) for `t + steps > T`.
        LayerInputError: (E1803) for a token id outside `0 .. V-1`.
        ArgumentTypeError, ArgumentError: (E0003, E0002) for `steps` not an int >= 1, a `key`
            that is not one PRNG key, or a `temperature` that is not a number > 0.
    """
    instance("m", m, GPT2, "a GPT2")
    return generate_with(_generate, m, prompt, steps, key, temperature)
