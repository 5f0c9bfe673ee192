"""GPT-2 without a reference framework: the cached decode equals the full forward, the Hugging
Face files round trip bit for bit, and a corrupted checkpoint (a missing tensor, a wrong shape,
a wrong config, a broken shard index) gets one coded report naming every problem.
(`tests/test_gpt2_hf.py` compares against `transformers` itself.)"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

import shapeml as sm
from shapeml import nn
from shapeml.state import StateIndexError
from shapeml.zoo import gpt2
from shapeml.zoo.transformer import GenerateError

HF_PACKAGES = ("torch", "transformers", "huggingface_hub", "peft")
DIMS = dict(V=61, T=24, D=32, H=4, L=2)
forward = jax.jit(gpt2.forward)
step = jax.jit(gpt2.step)  # `pos` traced: one compile per number of new tokens


@pytest.fixture(scope="module")
def model():
    return gpt2.GPT2.init(seed=0, **DIMS)


@pytest.fixture
def folder(model, tmp_path):
    return gpt2.to_hf(model, tmp_path / "ckpt")


def test_dims_fields_and_the_hf_names(model):
    assert model.dims.F == 128 and model.h[0].attn.dims.Dh == 8
    assert model.h[1].attn.c_attn.w.shape == (32, 96) and model.h[0].mlp.up.b.shape == (128,)
    assert sm.count_params(model) == (
        61 * 32
        + 24 * 32
        + 2 * (4 * 32 + 32 * 96 + 96 + 32 * 32 + 32 + 2 * 32 * 128 + 128 + 32)
        + 2 * 32
    )


def test_attention_is_causal_and_the_cached_decode_equals_the_full_forward(model):
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 61, (2, 10)))
    full = forward(model, tokens)
    changed = forward(model, tokens.at[:, 6:].set(0))
    np.testing.assert_array_equal(full[:, :6], changed[:, :6])  # no position sees the future
    cache = gpt2.new_cache(model, batch=2)
    first, cache = step(model, cache, tokens[:, :4], 0)  # a prefill of 4
    rest = []
    for i in range(4, 10):  # then one token at a time
        logits, cache = step(model, cache, tokens[:, i : i + 1], i)
        rest.append(logits)
    np.testing.assert_allclose(jnp.concatenate([first, *rest], axis=1), full, rtol=1e-5, atol=1e-5)


def test_generate_is_greedy_over_the_full_forward(model):
    prompt = jnp.asarray([[3, 14, 15, 9]])
    out = gpt2.generate(model, prompt, 8)
    assert out.shape == (1, 12) and out.dtype == jnp.int32
    np.testing.assert_array_equal(out[:, :4], prompt)
    logits = forward(model, out[:, :-1])
    np.testing.assert_array_equal(jnp.argmax(logits[:, 3:], axis=-1), out[:, 4:])
    sampled = gpt2.generate(model, prompt, 8, key=jax.random.key(1), temperature=0.7)
    again = gpt2.generate(model, prompt, 8, key=jax.random.key(1), temperature=0.7)
    np.testing.assert_array_equal(sampled, again)


def test_bad_requests_raise_coded_errors(model):
    with pytest.raises(StateIndexError, match="context T=24"):
        gpt2.forward(model, jnp.zeros((1, 25), jnp.int32))
    with pytest.raises(StateIndexError, match="context T=24"):
        gpt2.generate(model, jnp.zeros((1, 20), jnp.int32), 5)
    with pytest.raises(nn.LayerInputError, match="token id 61"):
        gpt2.generate(model, jnp.asarray([[1, 61]]), 2)
    with pytest.raises(GenerateError):
        gpt2.generate(model, jnp.zeros((1, 3)), 2)
    with pytest.raises(sm.ShapemlError, match="E2001"):
        gpt2.GPT2.init(seed=0, D=30, H=4, V=8, T=8, L=1)


def test_loss_is_the_next_token_cross_entropy(model):
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 61, (2, 9)))
    logp = jax.nn.log_softmax(forward(model, tokens[:, :-1]), axis=-1)
    want = -np.mean(np.take_along_axis(np.asarray(logp), np.asarray(tokens)[:, 1:, None], -1))
    np.testing.assert_allclose(jax.jit(gpt2.loss)(model, tokens), want, rtol=1e-5)


def test_hf_files_round_trip_bit_for_bit(model, folder, tmp_path):
    names = sorted(safetensors.numpy.load_file(folder / "model.safetensors"))
    assert names[0] == "transformer.h.0.attn.c_attn.bias" and "lm_head.weight" not in names
    config = json.loads((folder / "config.json").read_text())
    assert (config["model_type"], config["n_embd"], config["n_inner"]) == ("gpt2", 32, None)
    back = gpt2.from_hf(folder / "model.safetensors")  # a file in the folder is the folder
    for (k, a), (_, b) in zip(sm.params(model).items(), sm.params(back).items()):
        assert a.dtype == b.dtype and np.asarray(a).tobytes() == np.asarray(b).tobytes(), k
    again = gpt2.to_hf(back, tmp_path / "again")
    for file in ("model.safetensors", "config.json"):
        assert (again / file).read_bytes() == (folder / file).read_bytes()


def rewrite(folder, change):
    """The checkpoint's tensors, changed by `change(arrays)`, written back in place."""
    arrays = safetensors.numpy.load_file(folder / "model.safetensors")
    change(arrays)
    safetensors.numpy.save_file(arrays, folder / "model.safetensors", metadata={"format": "pt"})


def test_hub_style_names_without_prefix_with_mask_buffers_and_a_tied_head_load(model, folder):
    def hub(arrays):
        for k in list(arrays):
            arrays[k.removeprefix("transformer.")] = arrays.pop(k)
        arrays["h.0.attn.bias"] = np.tril(np.ones((1, 1, 24, 24), np.float32))
        arrays["h.1.attn.masked_bias"] = np.asarray(-1e4, np.float32)
        arrays["lm_head.weight"] = arrays["wte.weight"]

    rewrite(folder, hub)
    back = gpt2.from_hf(folder)
    np.testing.assert_array_equal(back.h[1].mlp.down.w, model.h[1].mlp.down.w)


def test_a_checkpoint_missing_a_tensor_with_a_wrong_shape_and_an_untied_head_is_one_report(
    folder,
):
    def corrupt(arrays):
        del arrays["transformer.h.1.mlp.c_fc.weight"]
        arrays["transformer.h.0.attn.c_attn.weight"] = np.zeros((32, 90), np.float32)
        arrays["transformer.h.0.ln_1.weigth"] = arrays.pop("transformer.h.0.ln_1.weight")
        arrays["transformer.wpe.weight"] = arrays["transformer.wpe.weight"].astype(np.int32)
        arrays["lm_head.weight"] = np.ones((61, 32), np.float32)

    rewrite(folder, corrupt)
    with pytest.raises(gpt2.HFCheckpointError) as e:
        gpt2.from_hf(folder)
    text = str(e.value)
    assert "[E2005]" in text and "6 problem(s)" in text and "n_embd=32" in text
    for part in (
        "missing: `transformer.h.1.mlp.c_fc.weight` [32 128] float32",
        "wrong shape: `transformer.h.0.attn.c_attn.weight` expected [32 96] float32, file has "
        "[32 90] float32",
        "unexpected: `transformer.h.0.ln_1.weigth` [32] float32 (a missing entry with a "
        "similar name exists: `transformer.h.0.ln_1.weight`)",
        "wrong dtype: `transformer.wpe.weight` expected float32, file has int32",
        "missing: `transformer.h.0.ln_1.weight` [32] float32",
        "unexpected: `lm_head.weight` [61 32] float32: it differs from `transformer.wte.weight`",
    ):
        assert part in text, part


def test_a_config_that_does_not_match_the_tensors_is_one_report(folder):
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "n_layer": 3, "n_positions": 30}))
    with pytest.raises(gpt2.HFCheckpointError) as e:
        gpt2.from_hf(folder)
    assert "13 problem(s)" in str(e.value)  # 12 tensors of h.2, and wpe
    assert "wrong shape: `transformer.wpe.weight` expected [30 32]" in str(e.value)


def test_a_config_shapeml_cannot_hold_lists_every_problem(folder):
    config = json.loads((folder / "config.json").read_text())
    bad = {**config, "n_head": 5, "activation_function": "relu", "n_layer": 0}
    del bad["vocab_size"]
    (folder / "config.json").write_text(json.dumps(bad))
    with pytest.raises(gpt2.HFConfigError) as e:
        gpt2.from_hf(folder)
    text = str(e.value)
    assert "[E2004]" in text and "4 problem(s)" in text
    for part in ("vocab_size (V) is missing", "n_layer (L) is 0", "n_head=5 does not divide"):
        assert part in text
    (folder / "config.json").write_text(json.dumps({**config, "n_layer": 10**9}))
    with pytest.raises(sm.ShapemlError, match="E0906"):  # refused before it sizes anything
        gpt2.from_hf(folder)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(gpt2.HFConfigError, match="is not JSON"):
        gpt2.from_hf(folder)
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    with pytest.raises(gpt2.HFConfigError, match="model_type is 'llama'"):
        gpt2.from_hf(folder)


def test_missing_files_and_a_broken_shard_index(model, folder, tmp_path):
    with pytest.raises(sm.ShapemlError, match="E1304"):
        gpt2.from_hf(tmp_path / "nowhere")
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(sm.ShapemlError, match="pickles, which shapeml never loads"):
        gpt2.from_hf(folder)
    sharded = gpt2.to_hf(model, tmp_path / "sharded", max_shard_bytes=30_000)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    np.testing.assert_array_equal(gpt2.from_hf(sharded).wte.w, model.wte.w)
    index["weight_map"]["transformer.wte.weight"] = "model-00001-of-00099.safetensors"
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(sm.ShapemlError, match="E1304"):  # the shard it names is not there
        gpt2.from_hf(sharded)
    index["weight_map"]["transformer.wte.weight"] = "../elsewhere.safetensors"
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(gpt2.HFCheckpointError, match="not a shard index"):
        gpt2.from_hf(sharded)


def test_to_hf_refuses_what_it_cannot_write(model, tmp_path):
    with pytest.raises(sm.ShapemlError, match="E1305"):
        gpt2.to_hf(model, tmp_path / "no" / "such" / "folder")
    bad = model.replace(ln_f=model.ln_f.replace(scale=model.ln_f.scale.at[0].set(jnp.nan)))
    with pytest.raises(sm.ShapemlError, match="E1307"):
        gpt2.to_hf(bad, tmp_path / "nan")
    assert not (tmp_path / "nan").exists()  # refused before anything was made
    with pytest.raises(sm.ArgumentTypeError):
        gpt2.to_hf(nn.Linear.init(seed=0), tmp_path / "linear")


def test_the_library_never_imports_torch_transformers_or_peft():
    # Every import statement of the package, those inside functions included.
    src = Path(sm.__file__).parent
    found = []
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            found += [f"{path.name}: {n}" for n in names if n.split(".")[0] in HF_PACKAGES]
        # `tokenizers` (optional) only inside the function that reads a tokenizer.json
        for n in ast.parse(path.read_text()).body:
            top = [a.name for a in n.names] if isinstance(n, ast.Import) else []
            top += [n.module or ""] if isinstance(n, ast.ImportFrom) and not n.level else []
            found += [f"{path.name}: {t} at module level" for t in top if t == "tokenizers"]
    assert not found
