"""The transformer fast path against independent references: stacked blocks vs a tuple (forward,
gradients, checkpoint names), `nn.scan` vs a Python loop, `nn.remat` vs no remat (numbers and
memory), `nn.cross_entropy` vs numpy/optax/PyTorch, `dense`'s gradient vs `jax.grad` of a plain
matmul, and the f32 statistics of the norms."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jaxtyping import Array, Float

import shapeml as sm
from shapeml import nn
from shapeml.nn._dense import dense

DIMS = dict(V=11, D=8, H=2, T=6, L=3)


class Block(sm.Model):
    dims = sm.Dims(D=8, H=2, T=6)
    ln1: nn.LayerNorm = sm.submodel(nn.LayerNorm)
    attn: nn.MultiHeadAttention = sm.submodel(nn.MultiHeadAttention, causal=True)
    ln2: nn.LayerNorm = sm.submodel(nn.LayerNorm)
    mlp: nn.MLP = sm.submodel(nn.MLP, F="2 * D")


class Net(sm.Model):
    dims = sm.Dims(V=11, D=8, H=2, T=6, L=3)
    emb: nn.Embedding = sm.submodel(nn.Embedding)
    blocks: Block | tuple[Block, ...] = sm.submodels(Block, "L", stacked="scan")
    scan: bool = sm.static(default=True)


def block(blk: Block, x: Float[Array, "b t D"]) -> Float[Array, "b t D"]:
    x = x + blk.attn(blk.ln1(x))
    return x + blk.mlp(blk.ln2(x))


def loss(m: Net, tokens, remat=None):
    x = nn.scan(block, m.blocks, m.emb(tokens[:, :-1]), remat=remat)
    return nn.cross_entropy(m.emb.logits(x), tokens[:, 1:])


def loop_loss(m: Net, tokens):
    """The reference: a plain Python loop over the layers, no scan, no remat."""
    x = m.emb(tokens[:, :-1])
    for blk in nn.unstack(m.blocks):
        x = block(blk, x)
    logits = m.emb.logits(x)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))


TOKENS = np.random.default_rng(0).integers(0, 11, (4, 7)).astype(np.int32)


@pytest.fixture(scope="module")
def pair():
    return Net.init(seed=3, scan=True, **DIMS), Net.init(seed=3, scan=False, **DIMS)


def _close(a, b, tol=1e-5):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


def test_stacked_and_tuple_blocks_hold_the_same_values_under_the_same_names(pair):
    stacked, tup = pair
    assert isinstance(stacked.blocks, Block) and isinstance(tup.blocks, tuple)
    assert stacked.blocks.attn.q.w.shape[0] == 3
    ps, pt = sm.params(stacked), sm.params(tup)
    assert sorted(ps) == sorted(pt) and "blocks.2.mlp.up.w" in ps
    for k in ps:
        _close(ps[k], pt[k], 0)


def test_stacked_scan_gives_the_loop_forward_and_gradients(pair):
    stacked, tup = pair
    ref_v, ref_g = jax.jit(jax.value_and_grad(loop_loss))(tup, TOKENS)
    for m in (stacked, tup):
        v, g = jax.jit(jax.value_and_grad(loss))(m, TOKENS)
        _close(v, ref_v)
        gs, gr = sm.params(g), sm.params(ref_g)
        for k in gr:
            _close(gs[k], gr[k], 2e-5)


def test_stacked_and_tuple_checkpoints_hold_the_same_tensors_and_convert(pair, tmp_path):
    from safetensors.numpy import load_file

    stacked, tup = pair
    sm.save(tmp_path / "s.safetensors", stacked)
    sm.save(tmp_path / "t.safetensors", tup)
    fs, ft = load_file(tmp_path / "s.safetensors"), load_file(tmp_path / "t.safetensors")
    assert sorted(fs) == sorted(ft) and "blocks.1.attn.q.w" in fs
    for k in fs:
        np.testing.assert_array_equal(fs[k], ft[k])
    # each file loads in its own layout; `replace` converts between the two
    back = sm.load(tmp_path / "s.safetensors", Net)
    assert isinstance(back.blocks, Block)
    as_tuple = back.replace(scan=False, blocks=nn.unstack(back.blocks))
    as_stacked = sm.load(tmp_path / "t.safetensors", Net)
    as_stacked = as_stacked.replace(scan=True, blocks=as_stacked.blocks)
    assert isinstance(as_tuple.blocks, tuple) and isinstance(as_stacked.blocks, Block)
    for k, v in sm.params(tup).items():
        _close(sm.params(as_tuple)[k], v, 0)
        _close(sm.params(as_stacked)[k], v, 0)


def test_remat_keeps_the_numbers_and_lowers_the_temporary_memory():
    m = Net.init(seed=1, **{**DIMS, "L": 4, "D": 16, "T": 32})
    tokens = np.random.default_rng(1).integers(0, 11, (4, 33)).astype(np.int32)
    policies = ("none", "full", "dots")
    grads = {  # compiled once each: run, and asked for its memory
        p: jax.jit(jax.grad(lambda m, t, p=p: loss(m, t, p))).lower(m, tokens).compile()
        for p in policies
    }
    ref = sm.params(grads["none"](m, tokens))
    for fn in grads.values():
        got = sm.params(fn(m, tokens))
        for k in ref:
            _close(got[k], ref[k], 1e-5)
    temp = {p: fn.memory_analysis().temp_size_in_bytes for p, fn in grads.items()}
    assert temp["full"] < 0.6 * temp["none"], temp


def test_scan_and_remat_reject_what_they_cannot_run(pair):
    with pytest.raises(sm.ArgumentError) as e:
        nn.remat(lambda x: x, "everything")
    assert e.value.code == "E0002" and "'full'" in str(e.value)
    with pytest.raises(sm.ArgumentTypeError):
        nn.scan(block, [1, 2], jnp.zeros((1, 6, 8)))


def test_cross_entropy_matches_numpy_optax_and_pytorch():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(3, 5, 7)).astype(np.float32) * 4
    labels = rng.integers(0, 7, (3, 5)).astype(np.int32)
    z = logits - logits.max(-1, keepdims=True)
    ref = np.log(np.exp(z).sum(-1)) - np.take_along_axis(z, labels[..., None], -1)[..., 0]
    _close(nn.cross_entropy(jnp.asarray(logits), labels, reduction="none"), ref)
    _close(nn.cross_entropy(jnp.asarray(logits), labels, reduction="sum"), ref.sum(), 1e-4)
    opt = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    _close(nn.cross_entropy(jnp.asarray(logits), labels), opt)
    g = jax.grad(lambda x: nn.cross_entropy(x, labels))(jnp.asarray(logits))
    g_ref = jax.grad(lambda x: optax.softmax_cross_entropy_with_integer_labels(x, labels).mean())
    _close(g, g_ref(jnp.asarray(logits)))
    half = nn.cross_entropy(jnp.asarray(logits, jnp.bfloat16), labels)
    assert half.dtype == jnp.float32
    bad = labels.copy()
    bad[0, 0] = 7  # outside 0..V-1: NaN, not a clamped class
    assert np.isnan(nn.cross_entropy(jnp.asarray(logits), bad))
    torch = pytest.importorskip("torch")
    t = torch.nn.functional.cross_entropy(
        torch.tensor(logits).reshape(-1, 7), torch.tensor(labels, dtype=torch.long).reshape(-1)
    )
    _close(nn.cross_entropy(jnp.asarray(logits), labels), t.item())


@pytest.mark.parametrize("shape", [(5, 3), (2, 4, 3)])
def test_dense_gradients_are_those_of_a_plain_matmul(shape):
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.normal(size=shape), jnp.float32)
    w = jnp.asarray(rng.normal(size=(3, 6)), jnp.float32)
    c = jnp.asarray(rng.normal(size=(*shape[:-1], 6)), jnp.float32)

    def f(fn):
        return jax.grad(lambda x, w: jnp.sum(jnp.sin(fn(x, w)) * c), argnums=(0, 1))(x, w)

    for got, ref in zip(f(dense), f(lambda x, w: x @ w)):
        _close(got, ref)
    _close(dense(x, w), x @ w)
    # forward mode and second derivatives still work (a custom_jvp)
    t = jax.jvp(lambda w: dense(x, w), (w,), (jnp.ones_like(w),))[1]
    _close(t, x @ jnp.ones_like(w))
    h = jax.hessian(lambda w: jnp.sum(dense(x, w) ** 2))(w)
    h_ref = jax.hessian(lambda w: jnp.sum((x @ w) ** 2))(w)
    _close(h, h_ref, 1e-4)


@pytest.mark.parametrize("cls", ["LayerNorm", "RMSNorm"])
def test_norms_keep_float32_statistics_for_half_inputs(cls):
    layer = getattr(nn, cls).init(seed=0, D=16)
    half_layer = sm.Precision("bfloat16").cast(layer)
    x = np.random.default_rng(5).normal(3.0, 2.0, size=(4, 16)).astype(np.float32)
    mean = x.mean(-1, keepdims=True) if cls == "LayerNorm" else 0.0
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    ref = (x - mean) / np.sqrt(var + layer.eps)
    _close(layer(jnp.asarray(x)), ref, 1e-4)
    half = half_layer(jnp.asarray(x, jnp.bfloat16))
    assert half.dtype == jnp.bfloat16
    _close(half.astype(jnp.float32), ref, 5e-2)
