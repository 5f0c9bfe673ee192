"""The Llama family against `transformers` (PyTorch, CPU) on checkpoints it writes itself: four
random configs (multi-head with a tied head, grouped-query with an untied head and its own rotary
base and eps, Qwen2 with query/key/value biases, Mistral with a sliding window shorter than the
sequence): logits within 1e-4, 20 greedy tokens equal `generate(do_sample=False)`, `to_hf` files
equal to transformers' own bit for bit; sharded and half-precision checkpoints, a tokenizer, a
partial load, and one coded report for a corrupted or mismatched checkpoint.

`transformers` and `torch` come with the `test` extra; without them these tests skip on a
workstation, and fail in CI (`SHAPEML_CI`, set by `.ci/run`), where they must run."""

from __future__ import annotations

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

import shapeml as sm
from shapeml.zoo import llama

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is local: never ask the hub
if os.environ.get("SHAPEML_CI") or os.environ.get("CI"):
    import torch
    import transformers
else:
    torch = pytest.importorskip("torch", reason="torch is not installed: pip install -e '.[hf]'")
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed: pip install -e '.[hf]'"
    )

V = 96
BASE = dict(
    vocab_size=V,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=64,
    initializer_range=0.3,  # wide enough that greedy decoding wanders
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
# name -> (config class, causal-LM class name, options)
CONFIGS = {
    "llama_mha_tied": ("LlamaConfig", dict(num_key_value_heads=4, tie_word_embeddings=True)),
    "llama_gqa": (
        "LlamaConfig",
        dict(num_key_value_heads=2, rope_theta=500000.0, rms_norm_eps=1e-5, head_dim=16),
    ),
    "qwen2_bias": ("Qwen2Config", dict(num_key_value_heads=2)),
    "mistral_window": ("MistralConfig", dict(num_key_value_heads=1, sliding_window=5)),
}
CLASSES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
}
forward = jax.jit(llama.forward)


def hf_model(name: str, seed: int = 1):
    """A transformers model of config `name` with random weights (Qwen2's biases random too)."""
    config_class, options = CONFIGS[name]
    config = getattr(transformers, config_class)(**BASE, **options)
    torch.manual_seed(seed)
    model = getattr(transformers, CLASSES[config.model_type])(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                if proj.bias is not None:
                    proj.bias.normal_(std=0.5)
    return model


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def saved(request, tmp_path_factory):
    """(name, transformers model, its save_pretrained folder, the model from_hf read there)."""
    model = hf_model(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    return request.param, model, folder, llama.from_hf(folder)


@pytest.fixture(scope="module")
def gqa(tmp_path_factory):
    """(its save_pretrained folder, the model from_hf read there) of the GQA config, for the
    checks that need one checkpoint, not every config."""
    folder = tmp_path_factory.mktemp("gqa")
    hf_model("llama_gqa").save_pretrained(folder)
    return folder, llama.from_hf(folder)


def logits_of(model, tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(tokens)).logits.numpy()


def test_logits_equal_transformers(saved):
    name, model, _, m = saved
    cfg = model.config
    assert cfg.num_key_value_heads == m.dims.K and cfg.num_hidden_layers == m.dims.L
    assert (m.head is None) == cfg.tie_word_embeddings
    assert m.family == cfg.model_type
    tokens = np.random.default_rng(0).integers(0, V, (2, 24))
    ours = np.asarray(forward(m, jnp.asarray(tokens)))
    np.testing.assert_allclose(ours, logits_of(model, tokens), rtol=0, atol=1e-4)


def test_options_read_from_the_config(saved):
    name, model, _, m = saved
    opts = llama.options(m)
    assert opts["qkv_bias"] == (name == "qwen2_bias")
    assert opts["window"] == (5 if name == "mistral_window" else 0)
    assert opts["theta"] == (500000.0 if name == "llama_gqa" else 10000.0)
    assert opts["eps"] == model.config.rms_norm_eps
    assert m.dims.Dh == (16 if name == "llama_gqa" else 8)


def test_20_greedy_tokens_equal_transformers_generate(saved):
    name, model, _, m = saved
    prompt = np.random.default_rng(1).integers(0, V, (2, 7))
    with torch.no_grad():
        want = model.generate(
            torch.from_numpy(prompt), max_new_tokens=20, min_new_tokens=20, do_sample=False
        ).numpy()
    got = np.asarray(llama.generate(m, jnp.asarray(prompt), 20))
    assert got.shape == (2, 27)
    np.testing.assert_array_equal(got, want)
    assert len(set(got[:, 7:].ravel().tolist())) > 6  # not one token repeated: the test can fail


def test_decode_steps_equal_the_full_forward(saved):
    """A prefill then single-token steps through the cache give the full forward's logits
    (the sliding window included: 12 positions, window 5)."""
    _, _, _, m = saved
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, V, (1, 12)))
    full = np.asarray(forward(m, tokens))
    cache = llama.new_cache(m, batch=1, ctx=12)
    step = jax.jit(llama.step)  # `pos` traced: one program for every decode position
    first, cache = step(m, cache, tokens[:, :5], 0)
    rest = []
    for i in range(5, 12):
        out, cache = step(m, cache, tokens[:, i : i + 1], jnp.int32(i))
        rest.append(np.asarray(out))
    np.testing.assert_allclose(np.asarray(first), full[:, :5], atol=1e-5)
    np.testing.assert_allclose(np.concatenate(rest, axis=1), full[:, 5:], atol=1e-5)


def test_to_hf_round_trips_bit_for_bit_and_loads_in_transformers(saved, tmp_path):
    name, model, folder, m = saved
    out = llama.to_hf(m, tmp_path / "out")
    theirs = safetensors.numpy.load_file(folder / "model.safetensors")
    ours = safetensors.numpy.load_file(out / "model.safetensors")
    assert sorted(ours) == sorted(theirs)
    for k, a in theirs.items():
        assert ours[k].dtype == a.dtype and ours[k].tobytes() == a.tobytes(), k
    cls = getattr(transformers, CLASSES[model.config.model_type])
    loaded, info = cls.from_pretrained(out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    tokens = np.random.default_rng(2).integers(0, V, (1, 9))
    np.testing.assert_array_equal(logits_of(loaded.eval(), tokens), logits_of(model, tokens))
    again = llama.from_hf(out)
    assert all(
        np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(m), strict=True)
    )
    assert sm.models.buffers(again) == {} and llama.options(again) == llama.options(m)


def test_sharded_and_bfloat16_checkpoints_load(tmp_path):
    model = hf_model("llama_gqa", seed=4)
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    m = llama.from_hf(tmp_path / "sharded")
    tokens = np.random.default_rng(5).integers(0, V, (1, 10))
    np.testing.assert_allclose(
        np.asarray(forward(m, jnp.asarray(tokens))), logits_of(model, tokens), atol=1e-4
    )
    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    half = llama.from_hf(tmp_path / "bf16")
    assert half.embed.w.dtype == jnp.float32
    np.testing.assert_array_equal(
        np.asarray(half.embed.w), model.model.embed_tokens.weight.detach().float().numpy()
    )


def test_the_tokenizer_comes_from_tokenizer_json(gqa, tmp_path):
    import tokenizers

    folder, m = gqa
    words = {w: i for i, w in enumerate(["[UNK]", "once", "upon", "a", "time"])}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    shutil.copytree(folder, tmp_path / "ckpt")
    tok.save(str(tmp_path / "ckpt" / "tokenizer.json"))
    loaded = llama.load_tokenizer(tmp_path / "ckpt")
    ids = loaded.encode("once upon a time").ids
    assert ids == [1, 2, 3, 4]
    out = llama.generate(m, jnp.asarray([ids]), 3)
    assert out.shape == (1, 7)
    with pytest.raises(sm.ShapemlError, match="tokenizer.json") as e:
        llama.load_tokenizer(folder)
    assert e.value.code == "E1304"


def _copy(folder, tmp_path):
    shutil.copytree(folder, tmp_path / "bad")
    return tmp_path / "bad"


def test_a_mismatched_checkpoint_gets_one_report_naming_every_problem(gqa, tmp_path):
    folder, _ = gqa
    bad = _copy(folder, tmp_path)
    arrays = safetensors.numpy.load_file(bad / "model.safetensors")
    arrays["model.layers.1.self_attn.k_proj.weight"] = np.zeros((3, 32), np.float32)
    del arrays["model.layers.0.mlp.up_proj.weight"]
    arrays["model.layers.0.mlp.extra.weight"] = np.zeros(2, np.float32)
    safetensors.numpy.save_file(arrays, bad / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(llama.LlamaCheckpointError) as e:
        llama.from_hf(bad)
    text = str(e.value)
    assert e.value.code == "E2007" and "3 problem(s)" in text
    for part in ("k_proj.weight", "mlp.up_proj.weight", "mlp.extra.weight", "hidden_size=32"):
        assert part in text


def test_a_config_edited_out_of_shape_gets_one_report(gqa, tmp_path):
    folder, _ = gqa
    bad = _copy(folder, tmp_path)
    config = json.loads((bad / "config.json").read_text())
    config.update(num_key_value_heads=3, hidden_act="gelu", rope_parameters={"rope_type": "yarn"})
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(llama.LlamaConfigError) as e:
        llama.from_hf(bad)
    text = str(e.value)
    assert e.value.code == "E2006" and "3 problem(s)" in text
    assert "num_key_value_heads=3" in text and "gelu" in text and "yarn" in text
    config = json.loads((folder / "config.json").read_text())
    config["hidden_size"] = 64
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(llama.LlamaCheckpointError, match="hidden_size=64"):
        llama.from_hf(bad)


def test_a_truncated_weights_file_is_a_coded_error(gqa, tmp_path):
    folder, _ = gqa
    bad = _copy(folder, tmp_path)
    data = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(sm.ShapemlError) as e:
        llama.from_hf(bad)
    assert e.value.code == "E1302"


def test_a_tied_head_that_differs_from_the_embeddings_is_reported(tmp_path):
    hf_model("llama_mha_tied").save_pretrained(tmp_path / "tied")
    bad = tmp_path / "tied"
    arrays = safetensors.numpy.load_file(bad / "model.safetensors")
    arrays["lm_head.weight"] = arrays["model.embed_tokens.weight"] + 1
    safetensors.numpy.save_file(arrays, bad / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(llama.LlamaCheckpointError, match="lm_head.weight` differs"):
        llama.from_hf(bad)


def test_partial_load_into_another_vocabulary(gqa):
    folder, m = gqa
    like = llama.Llama.init(
        seed=3,
        V=V + 8,
        T=64,
        D=32,
        H=4,
        K=m.dims.K,
        Dh=m.dims.Dh,
        F=48,
        L=2,
        tied=m.tied,
        family=m.family,
        **llama.options(m),
    )
    got, report = llama.from_hf(
        folder, like=like, missing="keep", mismatched="overlap", report=True
    )
    assert got.dims.V == V + 8
    np.testing.assert_array_equal(np.asarray(got.embed.w[:V]), np.asarray(m.embed.w))
    np.testing.assert_array_equal(np.asarray(got.embed.w[V:]), np.asarray(like.embed.w[V:]))
    assert "embed.w" in report.overlapped


def test_sampled_generation_is_reproducible_and_follows_the_temperature(gqa):
    _, m = gqa
    prompt = jnp.asarray(np.random.default_rng(6).integers(0, V, (2, 4)), jnp.int32)
    key = jax.random.key(7)
    a = np.asarray(llama.generate(m, prompt, 12, key=key, temperature=0.8))
    b = np.asarray(llama.generate(m, prompt, 12, key=key, temperature=0.8))
    np.testing.assert_array_equal(a, b)
    assert a.shape == (2, 16) and a.min() >= 0 and a.max() < V
    greedy = np.asarray(llama.generate(m, prompt, 12))
    cold = np.asarray(llama.generate(m, prompt, 12, key=key, temperature=1e-4))
    np.testing.assert_array_equal(cold, greedy)  # a near-zero temperature is the argmax
    assert not np.array_equal(a, greedy)
