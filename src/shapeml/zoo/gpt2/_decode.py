"""GPT-2 decoding against `shapeml.state.KVCache`: a prefill or decode `step`, and `generate`, the
whole token loop (greedy or sampled) in one compiled call."""

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


@functools.partial(jax.jit, static_argnames=("steps", "greedy"))
def _generate(m, prompt, steps, greedy, key, temperature):
    b, t = prompt.shape
    key = None if greedy else key
    # The cache holds what this call reaches, not the whole context: every step attends over
    # `t + steps` slots instead of `T`. Only the prompt's last position needs its logits.
    x, cache = _hidden(m, new_cache(m, b, t + steps), prompt, 0)
    first = pick(_logits(m, x[:, -1]), key, 0, temperature)

    def body(carry, i):
        cache, tok = carry
        x, cache = _hidden(m, cache, tok[:, None], t + i - 1)
        return (cache, pick(_logits(m, x[:, 0]), key, i, temperature)), tok

    # generate() checked t + steps <= T on the host; the in-loop checks never fire.
    (_, last), toks = lax.scan(body, (cache, first), jnp.arange(1, steps))
    new = jnp.concatenate([jnp.swapaxes(toks, 0, 1), last[:, None]], axis=1)
    return jnp.concatenate([prompt, new], axis=1)


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
