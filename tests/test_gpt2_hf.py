"""GPT-2 against `transformers` (PyTorch, CPU) on checkpoints it writes itself: logits within 1e-4
and 20 greedy tokens equal for three configs, `to_hf` files that transformers loads and that equal
its own bit for bit, sharded and half-precision checkpoints, and a fine-tuning load.

`transformers` and `torch` come with the `test` extra; without them these tests skip on a
workstation, and fail in CI (`SHAPEML_CI`, set by `.ci/run`), where they must run."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

import shapeml as sm
from shapeml.zoo import gpt2

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is local: never ask the hub
if os.environ.get("SHAPEML_CI") or os.environ.get("CI"):
    import torch
    import transformers
else:
    torch = pytest.importorskip("torch", reason="torch is not installed: pip install -e '.[hf]'")
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed: pip install -e '.[hf]'"
    )

# tiny; 2 layers 128 wide with GPT-2's vocabulary and context; GPT-2 small's shape, 1 layer.
CONFIGS = {
    "tiny": {"vocab_size": 96, "n_positions": 48, "n_embd": 32, "n_head": 4, "n_layer": 2},
    "w128": {"vocab_size": 50257, "n_positions": 1024, "n_embd": 128, "n_head": 4, "n_layer": 2},
    "small": {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_head": 12, "n_layer": 1},
}
forward = jax.jit(gpt2.forward)


def hf_model(seed: int, **config):
    """A transformers GPT-2 with random weights, wide enough (std 0.1) that greedy decoding
    wanders instead of repeating one token, and without an end-of-text token to stop at."""
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(
        **config, initializer_range=0.1, bos_token_id=None, eos_token_id=None, pad_token_id=None
    )
    return transformers.GPT2LMHeadModel(cfg).eval()


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def saved(request, tmp_path_factory):
    """(name, transformers model, its save_pretrained folder, the model from_hf read there)."""
    model = hf_model(1, **CONFIGS[request.param])
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    return request.param, model, folder, gpt2.from_hf(folder)


def logits_of(model, tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(tokens)).logits.numpy()


def test_logits_equal_transformers(saved):
    name, model, folder, m = saved
    cfg = CONFIGS[name]
    v, t, d, h, layers = (
        cfg[k] for k in ("vocab_size", "n_positions", "n_embd", "n_head", "n_layer")
    )
    assert {k: m.dims[k] for k in "VTDHLF"} == dict(V=v, T=t, D=d, H=h, L=layers, F=4 * d)
    tokens = np.random.default_rng(0).integers(0, v, (2, 24))
    ours = np.asarray(forward(m, jnp.asarray(tokens)))
    np.testing.assert_allclose(ours, logits_of(model, tokens), rtol=0, atol=1e-4)


def test_20_greedy_tokens_equal_transformers_generate(saved):
    name, model, folder, m = saved
    prompt = np.random.default_rng(1).integers(0, CONFIGS[name]["vocab_size"], (1, 7))
    with torch.no_grad():
        want = model.generate(
            torch.from_numpy(prompt), max_new_tokens=20, min_new_tokens=20, do_sample=False
        ).numpy()
    got = np.asarray(gpt2.generate(m, jnp.asarray(prompt), 20))
    assert got.shape == (1, 27)
    np.testing.assert_array_equal(got, want)
    assert len(set(got[0, 7:].tolist())) > 3  # not one token repeated: the test can fail


def test_to_hf_round_trips_bit_for_bit_and_loads_in_transformers(saved, tmp_path):
    name, model, folder, m = saved
    out = gpt2.to_hf(m, tmp_path / "out")
    theirs = safetensors.numpy.load_file(folder / "model.safetensors")
    ours = safetensors.numpy.load_file(out / "model.safetensors")
    assert sorted(ours) == sorted(theirs)
    for k, a in theirs.items():
        assert ours[k].dtype == a.dtype and ours[k].tobytes() == a.tobytes(), k
    loaded, info = transformers.GPT2LMHeadModel.from_pretrained(out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    tokens = np.random.default_rng(2).integers(0, CONFIGS[name]["vocab_size"], (1, 9))
    np.testing.assert_array_equal(logits_of(loaded.eval(), tokens), logits_of(model, tokens))
    for k in ("n_embd", "n_head", "n_layer", "n_positions", "vocab_size"):
        assert getattr(loaded.config, k) == CONFIGS[name][k]


def test_a_shapeml_model_written_by_to_hf_runs_the_same_in_transformers(tmp_path):
    m = gpt2.GPT2.init(seed=3, V=80, T=40, D=48, H=6, L=2, F=96)
    gpt2.to_hf(m, tmp_path / "ours")
    loaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "ours").eval()
    assert loaded.config.n_inner == 96
    tokens = np.random.default_rng(3).integers(0, 80, (2, 17))
    want = logits_of(loaded, tokens)
    np.testing.assert_allclose(forward(m, jnp.asarray(tokens)), want, rtol=0, atol=1e-4)


def test_sharded_checkpoints_in_and_out(tmp_path):
    model = hf_model(4, **CONFIGS["tiny"])
    model.save_pretrained(tmp_path / "hf", max_shard_size="20KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    m = gpt2.from_hf(tmp_path / "hf")
    tokens = np.random.default_rng(4).integers(0, 96, (1, 12))
    want = logits_of(model, tokens)
    np.testing.assert_allclose(forward(m, jnp.asarray(tokens)), want, rtol=0, atol=1e-4)
    out = gpt2.to_hf(m, tmp_path / "ours", max_shard_bytes=20_000)
    assert len(list(out.glob("model-*-of-*.safetensors"))) > 1
    assert not (out / "model.safetensors").exists()
    loaded = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    np.testing.assert_array_equal(logits_of(loaded, tokens), want)
    gpt2.to_hf(m, out)  # one file again: the shards of the earlier save are removed
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_checkpoints_load_as_float32(tmp_path, dtype):
    model = hf_model(5, **CONFIGS["tiny"]).to(getattr(torch, dtype))
    model.save_pretrained(tmp_path / "half")
    m = gpt2.from_hf(tmp_path / "half")
    assert m.wte.w.dtype == jnp.float32
    want = model.transformer.h[1].mlp.c_fc.weight.detach().float().numpy()
    np.testing.assert_array_equal(m.h[1].mlp.up.w, want)


def test_fine_tuning_load_into_a_longer_context_and_a_smaller_vocabulary(tmp_path):
    model = hf_model(6, **CONFIGS["tiny"])
    model.save_pretrained(tmp_path / "hf")
    template = gpt2.GPT2.init(seed=7, V=64, T=96, D=32, H=4, L=2)
    m, report = gpt2.from_hf(
        tmp_path / "hf", like=template, missing="keep", mismatched="overlap", report=True
    )
    wte = model.transformer.wte.weight.detach().numpy()
    wpe = model.transformer.wpe.weight.detach().numpy()
    np.testing.assert_array_equal(m.wte.w, wte[:64])  # the first 64 tokens' rows
    np.testing.assert_array_equal(m.wpe.w[:48], wpe)  # the file's positions ...
    np.testing.assert_array_equal(m.wpe.w[48:], template.wpe.w[48:])  # ... and new ones kept
    assert sorted(report.overlapped) == ["wpe.w", "wte.w"] and not report.missing
    assert "wpe.w`: file [48 32], model [96 32]" in str(report)
    # On the file's positions and tokens, the model is the pretrained one.
    tokens = np.random.default_rng(8).integers(0, 64, (1, 20))
    want = logits_of(model, tokens)[..., :64]
    np.testing.assert_allclose(forward(m, jnp.asarray(tokens)), want, rtol=0, atol=1e-4)
    with pytest.warns(sm.models.PartialLoadWarning, match="wte.w`: file \\[96 32\\]"):
        gpt2.from_hf(tmp_path / "hf", like=template, missing="keep", mismatched="overlap")
