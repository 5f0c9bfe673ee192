"""Formulations of the char GPT's layers for `gpt_profile.py --forms`: the same numbers, asked of
XLA in different layouts.

The causal rotary attention (projections in, output projection out), `ATTENTION`:

  tokens_major  what `nn.MultiHeadAttention` runs: `dense` projections to `[b t H Dh]`, score and
                mix einsums that relayout them to `[b H t s]` and back;
  heads_major   projections straight to `[b H t Dh]` (`einsum("btd,dhk->bhtk")`), the score and mix
                einsums consuming that layout, the output projection contracting `H Dh` at once;
  dpa           `jax.nn.dot_product_attention(q, k, v, is_causal=True)` on `[b t H Dh]` (XLA's
                implementation on CPU);
  fused_qkv     one `dense` projection to `3 * D` split into q, k, v, then as tokens_major;
  fused_heads_major  one projection to `[3 b H t Dh]`, then as heads_major.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from shapeml.nn._dense import dense


def _angles(t: int, k: int):
    half = k // 2
    freq = 10_000.0 ** (-jnp.arange(half, dtype=jnp.float32) * 2.0 / k)
    angle = jnp.arange(t, dtype=jnp.float32)[:, None] * freq[None, :]
    return jnp.cos(angle), jnp.sin(angle)


def _rope(x, cos, sin):
    """`x [..., t, k]` with `cos, sin` broadcast to it by the caller."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return jnp.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def _softmax_mix(scores, v_spec, v):
    t = scores.shape[-1]
    causal = jnp.tril(jnp.ones((t, t), bool))
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    return jax.nn.softmax(scores, axis=-1), causal


def tokens_major(p, x, heads):
    b, t, d = x.shape
    k = d // heads
    cos, sin = _angles(t, k)
    cs, sn = cos[None, :, None, :], sin[None, :, None, :]
    q = _rope(dense(x, p["q"]).reshape(b, t, heads, k), cs, sn) * (1 / math.sqrt(k))
    kk = _rope(dense(x, p["k"]).reshape(b, t, heads, k), cs, sn)
    v = dense(x, p["v"]).reshape(b, t, heads, k)
    s = jnp.einsum("bnhk,bshk->bhns", q, kk)
    pr, _ = _softmax_mix(s, None, v)
    return dense(jnp.einsum("bhns,bshk->bnhk", pr, v).reshape(b, t, d), p["o"])


def fused_qkv(p, x, heads):
    b, t, d = x.shape
    k = d // heads
    cos, sin = _angles(t, k)
    cs, sn = cos[None, :, None, :], sin[None, :, None, :]
    w = jnp.concatenate([p["q"], p["k"], p["v"]], axis=1)
    q, kk, v = jnp.split(dense(x, w).reshape(b, t, 3, heads, k), 3, axis=2)
    q = _rope(q[:, :, 0], cs, sn) * (1 / math.sqrt(k))
    kk = _rope(kk[:, :, 0], cs, sn)
    s = jnp.einsum("bnhk,bshk->bhns", q, kk)
    pr, _ = _softmax_mix(s, None, v)
    return dense(jnp.einsum("bhns,bshk->bnhk", pr, v[:, :, 0]).reshape(b, t, d), p["o"])


def heads_major(p, x, heads):
    b, t, d = x.shape
    k = d // heads
    cos, sin = _angles(t, k)
    cs, sn = cos[None, None], sin[None, None]

    def proj(w):
        return jnp.einsum("btd,dhk->bhtk", x, w.reshape(d, heads, k))

    q = _rope(proj(p["q"]), cs, sn) * (1 / math.sqrt(k))
    kk = _rope(proj(p["k"]), cs, sn)
    v = proj(p["v"])
    s = jnp.einsum("bhnk,bhsk->bhns", q, kk)
    pr, _ = _softmax_mix(s, None, v)
    out = jnp.einsum("bhns,bhsk->bhnk", pr, v)
    return jnp.einsum("bhnk,hkd->bnd", out, p["o"].reshape(heads, k, d))


def fused_heads_major(p, x, heads):
    b, t, d = x.shape
    k = d // heads
    cos, sin = _angles(t, k)
    cs, sn = cos[None, None], sin[None, None]
    w = jnp.stack([p["q"], p["k"], p["v"]]).reshape(3, d, heads, k)
    q, kk, v = jnp.einsum("btd,cdhk->cbhtk", x, w)
    q = _rope(q, cs, sn) * (1 / math.sqrt(k))
    kk = _rope(kk, cs, sn)
    s = jnp.einsum("bhnk,bhsk->bhns", q, kk)
    pr, _ = _softmax_mix(s, None, v)
    out = jnp.einsum("bhns,bhsk->bhnk", pr, v)
    return jnp.einsum("bhnk,hkd->bnd", out, p["o"].reshape(heads, k, d))


def dpa(p, x, heads):
    b, t, d = x.shape
    k = d // heads
    cos, sin = _angles(t, k)
    cs, sn = cos[None, :, None, :], sin[None, :, None, :]
    q = _rope(dense(x, p["q"]).reshape(b, t, heads, k), cs, sn)
    kk = _rope(dense(x, p["k"]).reshape(b, t, heads, k), cs, sn)
    v = dense(x, p["v"]).reshape(b, t, heads, k)
    out = jax.nn.dot_product_attention(q, kk, v, is_causal=True, implementation="xla")
    return dense(out.reshape(b, t, d), p["o"])


ATTENTION = {
    "tokens_major": tokens_major,
    "heads_major": heads_major,
    "dpa": dpa,
    "fused_qkv": fused_qkv,
    "fused_heads_major": fused_heads_major,
}


# The MLP half of a block, LayerNorm -> up -> tanh-GELU -> down, `MLP`:
#   layers       what `nn.LayerNorm` and `nn.MLP` run: two-pass variance, `jax.nn.gelu(approximate)`;
#   one_pass_ln  the variance as `E[x^2] - E[x]^2` (one pass over x) and `lax.rsqrt`;
#   sigmoid_gelu the tanh-GELU as `x * sigmoid(2 z)` (= `x * (1 + tanh z) / 2`): one logistic;
#   both         the two together.
_C = math.sqrt(2 / math.pi)


def _ln_two_pass(x, s, b):
    mean = jnp.mean(x, -1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), -1, keepdims=True)
    return (x - mean) * jnp.reciprocal(jnp.sqrt(var + 1e-5)) * s + b


def _ln_one_pass(x, s, b):
    mean = jnp.mean(x, -1, keepdims=True)
    var = jnp.mean(jnp.square(x), -1, keepdims=True) - jnp.square(mean)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * s + b


def _gelu_tanh(x):
    return jax.nn.gelu(x, approximate=True)


def _gelu_sigmoid(x):
    return x * jax.nn.sigmoid(2 * _C * (x + 0.044715 * x * x * x))


def _mlp(ln, act):
    def run(p, x):
        h = dense(ln(x, p["scale"], p["bias"]), p["up"]) + p["b_up"]
        return dense(act(h), p["down"]) + p["b_down"]

    return run


MLP = {
    "layers": _mlp(_ln_two_pass, _gelu_tanh),
    "one_pass_ln": _mlp(_ln_one_pass, _gelu_tanh),
    "sigmoid_gelu": _mlp(_ln_two_pass, _gelu_sigmoid),
    "both": _mlp(_ln_one_pass, _gelu_sigmoid),
}
