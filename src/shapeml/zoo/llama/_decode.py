"""Llama-family decoding against `shapeml.state.KVCache` (`K` key/value heads per layer): a
prefill or decode `step`, and `generate`, the whole token loop (greedy or sampled) in one
compiled call."""

from __future__ import annotations

import functools
import typing

import jax
from jaxtyping import Array, Float, Int, PRNGKeyArray

from ..._shaped import shaped
from ..._traceback import api_boundary
from ..._validate import instance
from ...state._kvcache import KVCache
from .._decoding import generate_with, token_loop
from ._model import Llama, logits_of

__all__ = ["generate", "new_cache", "step"]


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def new_cache(m: Llama, batch: int = 1, ctx: int | None = None) -> KVCache:
    """An empty cache for `m`: `L` layers, `batch` sequences of `ctx` positions (default `T`),
    `K` key/value heads of `Dh`, in the weights' dtype."""
    instance("m", m, Llama, "a Llama")
    d = m.dims
    ctx = d.T if ctx is None else ctx
    return KVCache(d.L, ctx, d.K, d.Dh, m.embed.w.dtype, batch=batch, name="Llama KV cache")


@shaped
def step(
    m: Llama, cache: KVCache, tokens: Int[Array, "b n"], pos: int | Int[Array, ""]
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
        StateIndexError: (E1401) if `pos + n` exceeds the cache, or `pos < 0`.
    """
    x = m.embed(tokens)
    for layer, block in enumerate(m.layers):
        a, cache = block.attn.step(block.attn_norm(x), cache, layer, pos)
        x = x + a
        x = x + block.mlp(block.mlp_norm(x))
    return logits_of(m, m.norm(x)), cache


def _last(m, cache, tokens, pos):
    logits, cache = step(m, cache, tokens, pos)
    return logits[:, -1], cache


@functools.partial(jax.jit, static_argnames=("steps", "greedy"))
def _generate(m, prompt, steps, greedy, key, temperature):
    # The cache holds what this call reaches, not the whole context: every step attends over
    # `t + steps` slots instead of `T`.
    cache = new_cache(m, prompt.shape[0], prompt.shape[1] + steps)
    return token_loop(_last, m, cache, prompt, steps, greedy, key, temperature)


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def generate(
    m: Llama,
    prompt: Int[Array, "b t"],
    steps: int,
    *,
    key: PRNGKeyArray | None = None,
    temperature: float = 1.0,
) -> Int[Array, "b _"]:
    """Extends each prompt by `steps` tokens through the KV cache, in one compiled call.

    Greedy (`key=None`) decoding equals `transformers`' `generate(do_sample=False)` for the
    same weights (without its stopping at an end-of-sequence token).

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

    Example:
        >>> out = llama.generate(m, jnp.asarray([[1, 2, 3]]), 20)            # greedy
        >>> out = llama.generate(m, prompt, 20, key=jax.random.key(0), temperature=0.8)
    """
    instance("m", m, Llama, "a Llama")
    return generate_with(_generate, m, prompt, steps, key, temperature)
