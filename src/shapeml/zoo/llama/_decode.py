"""Llama-family decoding against `shapeml.state.KVCache` (`K` key/value heads per layer): a
prefill or decode `step`, and `generate`, the whole token loop (greedy or sampled) in one
compiled call."""

from __future__ import annotations

import functools
import typing

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Float, Int, PRNGKeyArray

from ... import nn
from ..._shaped import shaped
from ..._traceback import api_boundary
from ..._validate import instance, integer
from ...state._index import StateIndexError
from ...state._kvcache import KVCache
from .._sampling import check_sampling, pick
from ..transformer import _check_prompt
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


@functools.partial(jax.jit, static_argnames=("steps", "greedy"))
def _generate(m, prompt, steps, greedy, key, temperature):
    b, t = prompt.shape
    key = None if greedy else key
    # The cache holds what this call reaches: every step attends over `t + steps` slots.
    logits, cache = step(m, new_cache(m, b, t + steps), prompt, 0)
    first = pick(logits[:, -1], key, 0, temperature)

    def body(carry, i):
        cache, tok = carry
        logits, cache = step(m, cache, tok[:, None], t + i - 1)
        return (cache, pick(logits[:, 0], key, i, temperature)), tok

    # generate() checked t + steps <= T on the host; the in-loop checks never fire.
    (_, last), toks = lax.scan(body, (cache, first), jnp.arange(1, steps))
    new = jnp.concatenate([jnp.swapaxes(toks, 0, 1), last[:, None]], axis=1)
    return jnp.concatenate([prompt, new], axis=1)


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
    t = _check_prompt(prompt)
    steps = integer("steps", steps, low=1, fix="pass how many tokens to add, a Python int >= 1")
    temperature = check_sampling(key, temperature)
    if t + steps > m.dims.T:
        raise StateIndexError(
            f"a prompt of {t} tokens plus {steps} new ones does not fit the context T={m.dims.T}",
            fix=f"generate at most {m.dims.T - t} tokens after this prompt",
        )
    ids = np.asarray(prompt)
    if ids.min() < 0 or ids.max() >= m.dims.V:  # never a NaN row read as logits
        bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
        raise nn.LayerInputError(
            f"token id {bad} is outside the vocabulary of V={m.dims.V} ids",
            fix=f"pass ids in 0..{m.dims.V - 1}",
        )
    dummy = jax.random.key(0) if key is None else key
    return _generate(
        m, jnp.asarray(ids, jnp.int32), steps, key is None, dummy, jnp.float32(temperature)
    )
