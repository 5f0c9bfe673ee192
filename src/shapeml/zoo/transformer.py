"""A small float decoder-only transformer, with cached decoding through `shapeml.state.KVCache`.

No layer norms and no biases, ReLU MLPs, a learned positional table and a tied head
(`logits = x @ embed.T`): the plain design that `shapeml.int8` quantizes. Per layer:
`x = x + attn(x)` (causal, `H` heads of `D // H`), then `x = x + relu(x @ w1) @ w2`.
`forward` recomputes the whole sequence; `step` runs `n` new tokens against a cache (a prefill when
`n` is the prompt, a decode step when `n == 1`); `generate` runs the whole token loop in one
compiled call; `CachedDecoder` is the same decode step as a `Graph` with the cache as its state.
"""

from __future__ import annotations

import functools
import math
import typing

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Float, Int, PRNGKeyArray

from .. import _jax_internals as jxi
from .. import nn
from .._errors import ShapemlError
from .._shaped import shaped
from .._traceback import api_boundary
from .._validate import instance, integer, shorten
from ..models import Dims, Model, normal
from ..models import param as field
from ..state import Graph, KVCache, StateIndexError, check_index, param, state
from ._errors import TransformerDimsError
from ._sampling import check_sampling, pick

__all__ = [
    "CachedDecoder",
    "GenerateError",
    "Transformer",
    "TransformerDimsError",
    "forward",
    "generate",
    "loss",
    "new_cache",
    "step",
]


class GenerateError(
    ShapemlError,
    ValueError,
    code="E1411",
    title="invalid generation request",
    explanation="""
`generate(m, prompt, steps, key=..., temperature=...)` needs the prompt as an integer array of
token ids `[b, t]` with at least one sequence of at least one token. A float or bool prompt is
refused rather than truncated to ids. Token ids outside the vocabulary, and a prompt plus steps
longer than the context `T`, are index errors (E1401) instead; `steps` (an int >= 1), `key` (one
PRNG key, or None) and `temperature` (> 0 when sampling: the logits are divided by it) are
checked as arguments (E0002, E0003).

    generate(m, jnp.asarray([[1, 2, 3]]), 20)                # greedy
    generate(m, prompt, 20, key=jax.random.key(0), temperature=0.8)
""",
):
    pass


@api_boundary
class Transformer(Model):
    """The decoder's weights; per-layer weights are stacked along `L`."""

    # The attention weights are spelled by heads (`H*Dh`, which is `D`) so that a rule table can
    # split them by head: `sm.shard(m, mesh, {"H": "model"})`.
    dims = Dims(V=32, T=64, D=32, H=4, F=64, L=2, Dh="D // H")
    embed: Float[Array, "V D"] = field(normal(std=0.3))
    pos: Float[Array, "T D"] = field(normal(std=0.1))
    wq: Float[Array, "L D H*Dh"] = field(normal(std=0.15))
    wk: Float[Array, "L D H*Dh"] = field(normal(std=0.15))
    wv: Float[Array, "L D H*Dh"] = field(normal(std=0.15))
    wo: Float[Array, "L H*Dh D"] = field(normal(std=0.15))
    w1: Float[Array, "L D F"] = field(normal(std=0.15))
    w2: Float[Array, "L F D"] = field(normal(std=0.1))

    def __check_init__(self):
        d = self.dims
        if d.H < 1 or d.D % d.H:
            raise TransformerDimsError(
                f"`Transformer` has D={d.D} and H={d.H}: the width D is split into H heads of "
                "D // H, so H must be at least 1 and divide D",
                fix=f"pick H among the divisors of D={d.D} (e.g. H={_divisor_near(d.D, d.H)}), "
                "or a D that is a multiple of H",
            )


def _divisor_near(n: int, h: int) -> int:
    """The divisor of `n` (>= 1) closest to `h`, for the fix of a TransformerDimsError."""
    return min((k for k in range(1, max(n, 1) + 1) if n % k == 0), key=lambda k: abs(k - h))


def _embed(m, tokens):
    # Ids outside the vocabulary read NaN rather than a clamped row (ids traced under an outer
    # jit cannot be checked on the host), so a bad id can never pass for a real token.
    return jnp.take(m.embed, tokens, axis=0, mode="fill", fill_value=jnp.nan)


def _check_tokens(tokens, vocab: int) -> None:
    # A gather clamps out-of-vocab ids and wraps negative ones; concrete ids are checked here.
    # Traced ids are checked before a stateful step runs (the CachedDecoder), like its positions;
    # in a user's own jit they read NaN (see _embed): no error_if, no round trip per call.
    if jxi.is_tracer(tokens):
        if tokens.size:
            what = f"token ids (the vocabulary V={vocab})"
            check_index(jnp.min(tokens), vocab, what=what, error_in_jit=False)
            check_index(jnp.max(tokens), vocab, what=what, error_in_jit=False)
        return
    arr = np.asarray(tokens)
    if arr.size and (arr.min() < 0 or arr.max() >= vocab):
        bad = int(arr.min()) if arr.min() < 0 else int(arr.max())
        raise StateIndexError(
            f"token id {bad} is outside the vocabulary of V={vocab} ids",
            fix=f"pass token ids in 0..{vocab - 1}",
        )


def _attention(q, k, v, mask, heads: int):
    """`q [b n D]`, `k`/`v` `[b s D]`, `mask [n s]` -> `[b n D]`, before the output projection."""
    b, n, d = q.shape
    s = k.shape[1]
    hd = d // heads
    q = q.reshape(b, n, heads, hd)
    k = k.reshape(b, s, heads, hd)
    v = v.reshape(b, s, heads, hd)
    scores = jnp.einsum("bnhd,bshd->bhns", q, k) / math.sqrt(hd)
    scores = jnp.where(mask[None, None], scores, jnp.finfo(scores.dtype).min)
    p = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bhns,bshd->bnhd", p, v).reshape(b, n, d)


def _mlp(m: Transformer, layer: int, x):
    return jax.nn.relu(x @ m.w1[layer]) @ m.w2[layer]


@shaped
def forward(m: Transformer, tokens: Int[Array, "b t"]) -> Float[Array, "b t V"]:
    """The next-token logits at every position, recomputing the whole sequence (no cache).

    Args:
        m: the weights.
        tokens: token ids `[b, t]`, `t <= T`.

    Returns:
        logits `[b, t, V]`; position `i` only sees tokens `0..i`.
    """
    t = tokens.shape[1]
    _check_tokens(tokens, m.dims.V)
    if t > m.dims.T:
        raise StateIndexError(
            f"a sequence of {t} tokens is longer than the context T={m.dims.T}",
            fix=f"pass at most {m.dims.T} tokens",
        )
    x = _embed(m, tokens) + m.pos[None, :t]
    mask = jnp.tril(jnp.ones((t, t), bool))
    heads = m.dims.H

    def layer(w, x):
        att = _attention(x @ w["wq"], x @ w["wk"], x @ w["wv"], mask, heads)
        x = x + att @ w["wo"]
        return x + jax.nn.relu(x @ w["w1"]) @ w["w2"]

    # One `lax.scan` over the stacked per-layer weights, naming no remat policy: a
    # `TrainStep(remat=...)` / `train(remat=...)` applies to each layer.
    layers = {k: getattr(m, k) for k in ("wq", "wk", "wv", "wo", "w1", "w2")}
    return nn.scan(layer, layers, x) @ m.embed.T


@shaped
def loss(m: Transformer, tokens: Int[Array, "b t"]) -> Float[Array, ""]:
    """The mean cross-entropy of predicting `tokens[:, 1:]` from the tokens before them."""
    return nn.cross_entropy(forward(m, tokens)[:, :-1], tokens[:, 1:])


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def new_cache(m: Transformer, batch: int = 1) -> KVCache:
    """An empty cache for `m`: `L` layers, `T` positions, `H` heads of `D // H`, `m`'s dtype."""
    d = m.dims
    return KVCache(d.L, d.T, d.H, d.D // d.H, m.embed.dtype, batch=batch, name="KV cache")


@shaped
def step(
    m: Transformer, cache: KVCache, tokens: Int[Array, "b n"], pos: int | Int[Array, ""]
) -> tuple[Float[Array, "b n V"], KVCache]:
    """Runs `n` new tokens at positions `pos .. pos + n - 1` against the cache.

    Their keys and values are written into the cache; each attends to every cached position up
    to its own. `n` = the prompt length at `pos = 0` is a prefill, `n = 1` a decode step.

    Args:
        m: the weights.
        cache: a cache from `new_cache(m, batch=b)` holding positions `0 .. pos - 1`.
        tokens: the new token ids `[b, n]`.
        pos: the position of the first new token (an int, or traced: no recompile).

    Returns:
        `(logits [b, n, V], cache)`, the cache now also holding the new positions.

    Raises:
        StateIndexError: (E1401) if `pos + n > T` or `pos < 0`.
    """
    b, n = tokens.shape
    d = m.dims
    _check_tokens(tokens, d.V)
    # Checked as the cache checks its own positions: by eqx.error_if in a plain jit, before the
    # step in a stateful one (the CachedDecoder: a bad pos then changes nothing). The cache is
    # given the unchecked `pos`, so its checks do not depend on this one's error_if.
    what = f"positions of the context T={d.T}"
    at = check_index(pos, d.T, what=what, extent=n)
    x = _embed(m, tokens) + lax.dynamic_slice_in_dim(m.pos, at, n)[None]
    heads, hd = d.H, d.D // d.H
    for layer in range(d.L):
        k = (x @ m.wk[layer]).reshape(b, n, heads, hd)
        v = (x @ m.wv[layer]).reshape(b, n, heads, hd)
        cache = cache.write(layer, pos, k, v)
        keys, values, mask = cache.read(layer, pos, n)
        att = _attention(
            x @ m.wq[layer],
            keys.reshape(b, cache.ctx, d.D),
            values.reshape(b, cache.ctx, d.D),
            mask,
            heads,
        )
        x = x + att @ m.wo[layer]
        x = x + _mlp(m, layer, x)
    return x @ m.embed.T, cache


@functools.partial(jax.jit, static_argnames=("steps", "greedy"))
def _generate(m, prompt, steps, greedy, key, temperature):
    b, t = prompt.shape
    key = None if greedy else key
    logits, cache = step(m, new_cache(m, b), prompt, 0)
    first = pick(logits[:, -1], key, 0, temperature)

    def body(carry, i):
        cache, tok = carry
        logits, cache = step(m, cache, tok[:, None], t + i - 1)
        nxt = pick(logits[:, 0], key, i, temperature)
        return (cache, nxt), tok

    # generate() checked t + steps <= T on the host; the in-loop checks never fire.
    (_, last), toks = lax.scan(body, (cache, first), jnp.arange(1, steps))
    new = jnp.concatenate([jnp.swapaxes(toks, 0, 1), last[:, None]], axis=1)
    return jnp.concatenate([prompt, new], axis=1)


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def generate(
    m: Transformer,
    prompt: Int[Array, "b t"],
    steps: int,
    *,
    key: PRNGKeyArray | None = None,
    temperature: float = 1.0,
) -> Int[Array, "b _"]:
    """Extends each prompt by `steps` tokens, the whole loop in one compiled call via the cache.

    Args:
        m: the weights.
        prompt: token ids `[b, t]`, `t >= 1`.
        steps: how many tokens to add (`t + steps <= T`).
        key: None for greedy decoding (argmax); a PRNG key to sample, token `i` drawn with
            `jax.random.fold_in(key, i)` from `softmax(logits / temperature)`.
        temperature: the sampling temperature (> 0); ignored when greedy.

    Returns:
        `[b, t + steps]`: the prompt followed by the new tokens.

    Raises:
        GenerateError: (E1411) for a prompt that is not a non-empty integer `[b, t]` array.
        StateIndexError: (E1401) for a token id outside `0..V-1`, or `t + steps > T`.
        ArgumentTypeError, ArgumentError: (E0003, E0002) for `steps` not an int >= 1, a `key`
            that is not one PRNG key, or a `temperature` that is not a number > 0.
    """
    instance("m", m, Transformer, "a Transformer")
    t = _check_prompt(prompt)
    steps = integer("steps", steps, low=1, fix="pass how many tokens to add, a Python int >= 1")
    temperature = check_sampling(key, temperature)
    _check_tokens(prompt, m.dims.V)
    if t + steps > m.dims.T:
        raise StateIndexError(
            f"a prompt of {t} tokens plus {steps} new ones does not fit the context T={m.dims.T}",
            fix=f"generate at most {m.dims.T - t} tokens after this prompt",
        )
    dummy = jax.random.key(0) if key is None else key
    return _generate(
        m, jnp.asarray(prompt, jnp.int32), steps, key is None, dummy, jnp.float32(temperature)
    )


def _check_prompt(prompt) -> int:
    """The prompt's length, after checking it is a non-empty `[b, t]` integer array (a float or
    bool prompt is refused, never truncated to ids)."""
    shape, dtype = getattr(prompt, "shape", None), getattr(prompt, "dtype", None)
    kind = np.dtype(dtype).kind if isinstance(dtype, np.dtype) else ""
    if not isinstance(shape, tuple) or kind not in "iu" or kind == "" or len(shape) != 2:
        raise GenerateError(
            f"generate takes the prompt as an integer array [b, t], got {shorten(prompt)}"
            + (f" ({dtype}{list(shape)})" if isinstance(shape, tuple) else ""),
            fix="pass token ids, e.g. jnp.asarray([[1, 2, 3]], jnp.int32)",
        )
    b, t = shape
    if b < 1 or t < 1:
        raise GenerateError(
            f"generate got an empty prompt of shape {list(shape)}",
            fix="pass at least one sequence of at least one token",
        )
    return t


@api_boundary
class CachedDecoder(Graph):
    """The decode step as a `Graph`: weights uploaded once, the KV cache kept on the device.

    `logits = dec(tokens, pos=p)` runs `step` for `tokens [b, n]` at positions `p .. p + n - 1`;
    the cache is updated in place, `p` is traced (one compile per `n`), and a position outside the
    context raises `StateIndexError` before anything runs, so the cache stays as it was.

    Example:
        >>> dec = CachedDecoder(Transformer.init(seed=0), batch=1)
        >>> logits = dec(prompt, pos=0)              # prefill, [1, t, V]
        >>> logits = dec(next_token[:, None], pos=t) # one decode step, [1, 1, V]
    """

    @typing.no_type_check  # validates its arguments itself, with coded errors
    def __init__(self, model: Transformer, batch: int = 1):
        instance("model", model, Transformer, "a Transformer")
        self.model = param(model)
        self.cache = state(new_cache(model, batch), name="kv_cache")

    def body(self, tokens, *, pos):
        logits, self.cache = step(self.model, self.cache, tokens, pos)
        return logits
