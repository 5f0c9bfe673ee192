"""shapeml.zoo.transformer: forward vs numpy, cached decoding vs full recomputation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shapeml as sm
from shapeml.state import StateIndexError
from shapeml.zoo import transformer as tr

DIMS = dict(V=13, T=12, D=16, H=4, F=24, L=2)


@pytest.fixture(scope="module")
def model():
    return tr.Transformer.init(seed=0, **DIMS)


@pytest.fixture(scope="module")
def tokens():
    return jnp.asarray(np.random.default_rng(0).integers(0, DIMS["V"], (3, 10)), jnp.int32)


def numpy_forward(m, tokens):
    """The decoder written out in float64 numpy, one head and one position at a time."""
    p = {k: np.asarray(v, np.float64) for k, v in sm.params(m).items()}
    tokens = np.asarray(tokens)
    b, t = tokens.shape
    d, h = DIMS["D"], DIMS["H"]
    hd = d // h
    out = np.zeros((b, t, DIMS["V"]))
    for i in range(b):
        x = p["embed"][tokens[i]] + p["pos"][:t]
        for layer in range(DIMS["L"]):
            q, k, v = (x @ p[w][layer] for w in ("wq", "wk", "wv"))
            att = np.zeros_like(x)
            for head in range(h):
                cols = slice(head * hd, (head + 1) * hd)
                for pos in range(t):
                    s = k[: pos + 1, cols] @ q[pos, cols] / np.sqrt(hd)
                    w = np.exp(s - s.max())
                    att[pos, cols] = (w / w.sum()) @ v[: pos + 1, cols]
            x = x + att @ p["wo"][layer]
            x = x + np.maximum(x @ p["w1"][layer], 0) @ p["w2"][layer]
        out[i] = x @ p["embed"].T
    return out


def test_params_follow_the_fixed_design(model):
    shapes = {k: tuple(v.shape) for k, v in sm.params(model).items()}
    d, f, layers = DIMS["D"], DIMS["F"], DIMS["L"]
    assert shapes == {
        "embed": (DIMS["V"], d),
        "pos": (DIMS["T"], d),
        "wq": (layers, d, d),
        "wk": (layers, d, d),
        "wv": (layers, d, d),
        "wo": (layers, d, d),
        "w1": (layers, d, f),
        "w2": (layers, f, d),
    }


def test_forward_matches_numpy(model, tokens):
    np.testing.assert_allclose(
        np.asarray(tr.forward(model, tokens)), numpy_forward(model, tokens), rtol=1e-4, atol=1e-5
    )


def test_loss_is_mean_next_token_cross_entropy(model, tokens):
    logits = numpy_forward(model, tokens)[:, :-1]
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    target = np.asarray(tokens)[:, 1:]
    expect = -np.take_along_axis(logp, target[..., None], axis=-1).mean()
    np.testing.assert_allclose(float(tr.loss(model, tokens)), expect, rtol=1e-5)


def test_cached_decode_matches_full_recomputation(model, tokens):
    full = np.asarray(tr.forward(model, tokens))
    cache = tr.new_cache(model, batch=3)
    logits, cache = tr.step(model, cache, tokens[:, :4], 0)  # prefill
    outs = [logits]
    decode = jax.jit(tr.step)
    for pos in range(4, 10):
        logits, cache = decode(model, cache, tokens[:, pos : pos + 1], jnp.int32(pos))
        outs.append(logits)
    np.testing.assert_allclose(np.concatenate(outs, axis=1), full, rtol=1e-4, atol=1e-5)


def test_graph_decoder_matches_full_recomputation_without_recompiling(model, tokens):
    full = np.asarray(tr.forward(model, tokens))
    dec = tr.CachedDecoder(model, batch=3)
    toks = np.asarray(tokens)
    cache_before = dec.cache.device.k
    pointer = cache_before.unsafe_buffer_pointer()
    for pos in range(10):
        logits = dec(toks[:, pos : pos + 1], pos=pos)
        np.testing.assert_allclose(np.asarray(logits)[:, 0], full[:, pos], rtol=1e-4, atol=1e-5)
    assert dec.compile_count == 1
    assert dec.cache.device.k.unsafe_buffer_pointer() == pointer  # the cache never moved
    cache = dec.read("kv_cache")
    for bad in (12, 10):  # outside the context; a 3-token prefill that would run past it
        with pytest.raises(StateIndexError, match=rf"(index|starting at) {bad} "):
            dec(toks[:, : 1 if bad == 12 else 3], pos=bad)
    after = dec.read("kv_cache")  # a bad position changed nothing
    np.testing.assert_array_equal(after.k, cache.k)
    np.testing.assert_array_equal(after.v, cache.v)
    assert dec.cache.device.k.unsafe_buffer_pointer() == pointer
    ref = dec.reference(toks[:, :5], pos=0)
    np.testing.assert_allclose(ref, full[:, :5], rtol=1e-4, atol=1e-5)


def test_graph_decoder_cache_saves_and_resumes_with_sm_save(model, tokens, tmp_path):
    full = np.asarray(tr.forward(model, tokens))
    toks = np.asarray(tokens)
    dec = tr.CachedDecoder(model, batch=3)
    dec(toks[:, :6], pos=0)  # prefill six positions
    path = sm.save(tmp_path / "cache.safetensors", dec.states)
    resumed = tr.CachedDecoder(model, batch=3)
    resumed.load_states(sm.load(path, like=resumed.states))
    logits = resumed(toks[:, 6:7], pos=6)
    np.testing.assert_allclose(np.asarray(logits)[:, 0], full[:, 6], rtol=1e-4, atol=1e-5)


def test_step_refuses_a_bad_traced_position_under_jit_and_vmap(model, tokens):
    cache = tr.new_cache(model, batch=1)
    decode = jax.jit(lambda p: tr.step(model, cache, tokens[:1, :1], p)[0])
    batched = jax.jit(jax.vmap(lambda p: tr.step(model, cache, tokens[:1, :1], p)[0]))
    jax.block_until_ready((decode(11), batched(jnp.arange(12))))
    errors = (jax.errors.JaxRuntimeError, ValueError)
    with pytest.raises(errors, match=r"\[E1401\] positions of the context T=12"):
        jax.block_until_ready(decode(12))
    with pytest.raises(errors, match=r"\[E1401\] positions of the context T=12"):
        jax.block_until_ready(batched(jnp.asarray([0, 12])))


def _recompute(m, prompt, steps, pick):
    """Generation without a cache: the whole sequence rerun for every new token. The sequence is
    padded to T, so one compile serves every length (causality: the padding is never seen)."""
    b, t = prompt.shape
    seq = np.zeros((b, DIMS["T"]), np.int32)
    seq[:, :t] = np.asarray(prompt)
    full = jax.jit(tr.forward)
    for i in range(steps):
        logits = full(m, jnp.asarray(seq))[:, t + i - 1]
        seq[:, t + i] = np.asarray(pick(logits, i))
    return seq[:, : t + steps]


def test_greedy_generation_matches_recomputation(model, tokens):
    prompt = tokens[:, :3]
    got = np.asarray(tr.generate(model, prompt, 8))
    expect = _recompute(model, prompt, 8, lambda logits, i: jnp.argmax(logits, axis=-1))
    np.testing.assert_array_equal(got, expect)


def test_sampled_generation_matches_recomputation_with_the_same_keys(model, tokens):
    prompt, key, temp = tokens[:, :2], jax.random.key(7), 0.8
    got = np.asarray(tr.generate(model, prompt, 9, key=key, temperature=temp))

    def sample(logits, i):
        return jax.random.categorical(jax.random.fold_in(key, i), logits / temp, axis=-1)

    np.testing.assert_array_equal(got, _recompute(model, prompt, 9, sample))
    again = np.asarray(tr.generate(model, prompt, 9, key=key, temperature=temp))
    np.testing.assert_array_equal(again, got)
    other = np.asarray(tr.generate(model, prompt, 9, key=jax.random.key(8), temperature=temp))
    assert not np.array_equal(other, got)


def test_context_and_vocabulary_limits_raise(model, tokens):
    with pytest.raises(StateIndexError, match="T=12"):
        tr.generate(model, tokens[:, :5], 8)
    with pytest.raises(sm.ArgumentError, match="temperature"):
        tr.generate(model, tokens[:, :5], 2, key=jax.random.key(0), temperature=0.0)
    with pytest.raises(StateIndexError, match="longer than the context T=12"):
        tr.forward(model, jnp.zeros((1, 13), jnp.int32))
    with pytest.raises(StateIndexError, match="V=13"):
        tr.forward(model, jnp.full((1, 3), 13, jnp.int32))
    with pytest.raises(StateIndexError, match="T=12"):
        tr.step(model, tr.new_cache(model), jnp.zeros((1, 2), jnp.int32), 11)


def test_loss_trains_down_with_plain_jax_grad(model, tokens):
    value_and_grad = jax.jit(jax.value_and_grad(tr.loss))
    m, first = model, None
    for _ in range(20):
        value, g = value_and_grad(m, tokens)
        first = value if first is None else first
        m = jax.tree.map(lambda w, dw: w - 0.5 * dw, m, g)
    assert float(value) < float(first) - 0.2
