"""GPT-2 generation compiled once per shape: the whole token loop is one program, traced once
(not once per token), and later calls of the same shapes compile nothing, greedy or sampled; the
next-token pick (the first maximum, or the Gumbel-max draw) equals `jnp.argmax` and
`jax.random.categorical`; batched greedy tokens equal `transformers`' `generate`."""

from __future__ import annotations

import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shapeml.zoo import gpt2
from shapeml.zoo._sampling import first_argmax, pick
from shapeml.zoo.gpt2 import _decode

os.environ.setdefault("HF_HUB_OFFLINE", "1")
if os.environ.get("SHAPEML_CI") or os.environ.get("CI"):
    import torch
    import transformers
else:
    torch = pytest.importorskip("torch", reason="torch is not installed: pip install -e '.[hf]'")
    transformers = pytest.importorskip("transformers", reason="pip install -e '.[hf]'")


def _logits():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((7, 300)).astype(np.float32)
    x[1, [5, 77, 200]] = 9.0  # a tie: the first wins
    x[2, 40], x[2, 10] = np.nan, np.nan  # NaN counts as the maximum, the first one
    x[3] = -np.inf
    x[4] = 0.0
    x[5, :150] = -np.inf
    x[6, 299] = np.inf
    return jnp.asarray(x)


def test_the_fast_argmax_is_jnp_argmax():
    x = _logits()
    want = jnp.argmax(x, axis=-1)
    np.testing.assert_array_equal(jax.jit(first_argmax)(x), want)
    np.testing.assert_array_equal(first_argmax(x), want)
    assert first_argmax(x).dtype == jnp.int32
    big = jax.random.normal(jax.random.key(0), (8, 50257))
    np.testing.assert_array_equal(jax.jit(first_argmax)(big), jnp.argmax(big, axis=-1))


@pytest.mark.parametrize("temperature", [0.7, 1.0, 2.5])
def test_a_sampled_pick_is_jax_random_categorical(temperature):
    x = jax.random.normal(jax.random.key(1), (8, 50257)) * 3
    key = jax.random.key(5)
    for i in (0, 1, 17):
        want = jax.random.categorical(jax.random.fold_in(key, i), x / temperature, axis=-1)
        np.testing.assert_array_equal(pick(x, key, i, temperature), want)
    np.testing.assert_array_equal(pick(x, None, 3, temperature), jnp.argmax(x, axis=-1))


@pytest.fixture(scope="module")
def model():
    return gpt2.GPT2.init(seed=0, V=61, T=40, D=16, H=2, L=2)


def _compiles(caplog):
    return [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()]


def test_the_token_loop_is_traced_once_not_once_per_token(model, monkeypatch):
    traced = []
    hidden = _decode._hidden

    def counting(m, cache, tokens, pos):
        traced.append(tokens.shape)
        return hidden(m, cache, tokens, pos)

    monkeypatch.setattr(_decode, "_hidden", counting)
    prompt = jnp.asarray(np.random.default_rng(3).integers(0, 61, (3, 5)), jnp.int32)
    out = gpt2.generate(model, prompt, 23)  # a shape no other test uses: traced here
    assert out.shape == (3, 28)
    assert traced == [(3, 5), (3, 1)]  # the prefill, and the loop's body: once for 23 tokens


@pytest.mark.parametrize("sampled", [False, True])
def test_a_second_call_of_the_same_shapes_compiles_nothing(model, caplog, sampled):
    rng = np.random.default_rng(4)
    prompts = [jnp.asarray(rng.integers(0, 61, (2, 6 + sampled)), jnp.int32) for _ in range(3)]
    opts = [{"key": jax.random.key(i), "temperature": 0.5 + i} if sampled else {} for i in range(3)]
    with caplog.at_level(logging.WARNING, logger="jax"), jax.log_compiles():
        first = gpt2.generate(model, prompts[0], 9, **opts[0])
        jax.block_until_ready(first)
        # a shape no other test uses: this call compiles the loop (and the log shows it)
        assert any("jit(_generate)" in c for c in _compiles(caplog))
        caplog.clear()
        later = [gpt2.generate(model, p, 9, **o) for p, o in zip(prompts[1:], opts[1:])]
        jax.block_until_ready(later)
        assert _compiles(caplog) == []  # other prompts, keys and temperatures: no compile
    assert not np.array_equal(later[0], later[1])


def test_batched_greedy_tokens_equal_transformers_generate(tmp_path):
    torch.manual_seed(2)
    cfg = transformers.GPT2Config(
        vocab_size=96,
        n_positions=48,
        n_embd=32,
        n_head=4,
        n_layer=2,
        initializer_range=0.1,
        bos_token_id=None,
        eos_token_id=None,
    )
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(tmp_path)
    m = gpt2.from_hf(tmp_path)
    prompt = np.random.default_rng(5).integers(0, 96, (4, 8))
    with torch.no_grad():
        want = hf.generate(
            torch.from_numpy(prompt),
            attention_mask=torch.ones(4, 8, dtype=torch.long),
            max_new_tokens=30,
            min_new_tokens=30,
            do_sample=False,
            pad_token_id=0,
        ).numpy()
    got = np.asarray(gpt2.generate(m, jnp.asarray(prompt), 30))
    np.testing.assert_array_equal(got, want)
    assert all(len(set(row[8:].tolist())) > 3 for row in got)  # wandering: the test can fail
