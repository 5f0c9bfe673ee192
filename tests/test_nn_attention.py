"""`nn.MultiHeadAttention` against a numpy reference: masks, rotary and learned positions, and the
incremental decode against a `KVCache` agreeing with the whole-sequence forward."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shapeml as sm
from shapeml import nn
from shapeml.state import KVCache

RNG = np.random.default_rng(1)


def _rope(x, positions):
    """Rotates the pairs (i, i + Dh/2) of `x [b t h Dh]` by pos * 10000 ** (-2i / Dh)."""
    k = x.shape[-1]
    out = np.empty_like(x)
    for i in range(k // 2):
        angle = positions * 10000.0 ** (-2.0 * i / k)
        c, s = np.cos(angle)[None, :, None], np.sin(angle)[None, :, None]
        a, b = x[..., i], x[..., i + k // 2]
        out[..., i], out[..., i + k // 2] = a * c - b * s, b * c + a * s
    return out


def reference(m, x, causal, positions):
    """Multi-head attention in float64 numpy, one head at a time."""
    x = np.asarray(x, np.float64)
    b, t, d = x.shape
    h, k = m.dims.H, m.dims.Dh
    w = {n: np.asarray(getattr(m, n).w, np.float64) for n in "qkvo"}
    xqk = x + np.asarray(m.pos, np.float64)[:t] if positions == "learned" else x
    q = (xqk @ w["q"]).reshape(b, t, h, k)
    kk = (xqk @ w["k"]).reshape(b, t, h, k)
    v = (x @ w["v"]).reshape(b, t, h, k)
    if positions == "rotary":
        q, kk = _rope(q, np.arange(t)), _rope(kk, np.arange(t))
    out = np.zeros((b, t, h, k))
    for head in range(h):
        s = np.einsum("bik,bjk->bij", q[:, :, head], kk[:, :, head]) / np.sqrt(k)
        if causal:
            s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out[:, :, head] = p @ v[:, :, head]
    return out.reshape(b, t, d) @ w["o"]


@pytest.mark.parametrize("causal,positions", [(False, "none"), (True, "rotary"), (True, "learned")])
def test_attention_matches_numpy_and_the_cached_decode_matches_the_forward(causal, positions):
    m = nn.MultiHeadAttention.init(seed=0, D=12, H=3, T=8, causal=causal, positions=positions)
    assert type(m) is nn.MultiHeadAttention
    assert (m.dims.Dh, m.causal, m.positions) == (4, causal, positions)
    assert (m.pos is not None) == (positions == "learned")
    assert ("pos" in sm.params(m)) == (positions == "learned")
    x = jnp.asarray(RNG.standard_normal((2, 6, 12)), jnp.float32)
    y = m(x)
    assert y.shape == (2, 6, 12) and y.dtype == jnp.float32
    np.testing.assert_allclose(y, reference(m, x, causal, positions), rtol=1e-4, atol=1e-5)
    if not causal:
        return
    # prefill 2 positions, then decode the rest one at a time, inside one jit (pos traced)
    step = jax.jit(lambda m, x, c, pos: m.step(x, c, 0, pos))
    cache = m.new_cache(layers=2, batch=2)
    assert isinstance(cache, KVCache) and cache.k.shape == (2, 2, 8, 3, 4)
    out, cache = m.step(x[:, :2], cache, 0, 0)
    outs = [out]
    for i in range(2, 6):
        out, cache = step(m, x[:, i : i + 1], cache, jnp.int32(i))
        outs.append(out)
    np.testing.assert_allclose(jnp.concatenate(outs, axis=1), y, rtol=1e-4, atol=1e-5)
    assert float(jnp.abs(cache.k[1]).max()) == 0.0  # layer 1 untouched


def test_attention_with_a_mask_bfloat16_and_errors():
    m = nn.MultiHeadAttention.init(seed=1, D=8, H=2)
    x = jnp.asarray(RNG.standard_normal((1, 4, 8)), jnp.float32)
    causal = jnp.tril(jnp.ones((4, 4), bool))
    np.testing.assert_allclose(m(x, mask=causal), reference(m, x, True, "none"), atol=1e-5)
    y16 = m(x.astype(jnp.bfloat16))
    assert y16.dtype == jnp.float32  # float32 weights promote
    np.testing.assert_allclose(y16, reference(m, x, False, "none"), atol=0.05)
    with pytest.raises(sm.ShapemlError, match="E1001"):
        m(jnp.zeros((1, 4, 6)))  # D is 8
    with pytest.raises(sm.ShapemlError, match="E1801"):
        nn.MultiHeadAttention.init(seed=0, D=10, H=4)  # heads do not divide the width
    with pytest.raises(sm.ShapemlError, match="E1801"):
        nn.MultiHeadAttention.init(seed=0, D=6, H=2, positions="rotary")  # odd Dh
    with pytest.raises(sm.ShapemlError, match="E1802"):
        nn.MultiHeadAttention.of(positions="absolute")
    with pytest.raises(sm.ShapemlError, match="E1802"):
        nn.MultiHeadAttention.init(seed=0, causal=1)
    learned = nn.MultiHeadAttention.of(positions="learned").init(seed=0, D=8, H=2, T=4)
    with pytest.raises(sm.ShapemlError, match="E1803"):
        learned(jnp.zeros((1, 5, 8)))  # longer than the table
    with pytest.raises(sm.ShapemlError, match="E1803"):
        m.step(jnp.zeros((1, 1, 8)), KVCache(1, 8, 4, 2), 0, 0)  # other heads
    with pytest.raises(sm.ShapemlError, match="E1401"):
        m.step(jnp.zeros((1, 1, 8)), m.new_cache(ctx=4), 0, 4)  # past the cache


def test_attention_in_a_decoder_block_by_dim_names():
    class Block(sm.Model):
        dims = sm.Dims(D=8, H=2, T=6)
        ln: nn.RMSNorm = sm.submodel(nn.RMSNorm)
        attn: nn.MultiHeadAttention = sm.submodel(
            nn.MultiHeadAttention, causal=True, positions="rotary"
        )

    m = Block.init(seed=0, D=16, H=4)
    assert (m.attn.dims.D, m.attn.dims.H, m.attn.dims.Dh, m.attn.dims.T) == (16, 4, 4, 6)
    assert set(sm.params(m)) == {"ln.scale", "attn.q.w", "attn.k.w", "attn.v.w", "attn.o.w"}
    assert m.attn.pos is None and (m.attn.q.dims.In, m.attn.q.dims.Out) == (16, 16)


def test_learned_positions_are_an_optional_field_of_the_same_class(tmp_path):
    class Learned(sm.Model):
        dims = sm.Dims(D=8, H=2, T=6)
        attn: nn.MultiHeadAttention = sm.submodel(nn.MultiHeadAttention, positions="learned")

    class Plain(sm.Model):
        dims = sm.Dims(D=8, H=2, T=6)
        attn: nn.MultiHeadAttention = sm.submodel(nn.MultiHeadAttention)

    learned, plain = Learned.init(seed=0), Plain.init(seed=0)
    assert type(learned.attn) is type(plain.attn) is nn.MultiHeadAttention
    assert learned.attn.pos.shape == (6, 8) and plain.attn.pos is None
    assert sm.count_params(learned) - sm.count_params(plain) == 6 * 8
    # the rest draws the same: adding the table changes no other field
    np.testing.assert_array_equal(learned.attn.q.w, plain.attn.q.w)
    sm.save(tmp_path / "l.safetensors", learned.attn)
    back = sm.load(tmp_path / "l.safetensors", nn.MultiHeadAttention)  # the file's options
    assert back.positions == "learned" and back.pos.shape == (6, 8)
    with pytest.raises(sm.ShapemlError, match="E1303") as e:
        sm.load(tmp_path / "l.safetensors", like=plain.attn)
    assert "positions: file 'learned', model 'none'" in str(e.value)
