"""The example scripts on real data, in their quick forms: the digits CNN trains and plots its
confusion matrix; the char-level GPT trains, samples with the KV-cache decode, and resumes from
its checkpoint exactly where an uninterrupted run would be; GPT-2 is fine-tuned from a Hugging
Face checkpoint loaded in part (another vocabulary and context) and written back; a Llama saved by
`transformers` is fine-tuned with LoRA adapters, merged and exported."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

import shapeml as sm

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # the scripts' dataclass-based models look their module up
    spec.loader.exec_module(module)
    return module


def test_digits_cnn_learns_and_saves_its_confusion_matrix(tmp_path, capsys):
    digits = _example("digits")
    out = tmp_path / "confusion.png"
    result = digits.main(["--epochs", "1", "--out", str(out)])
    assert result["accuracy"] > 0.8  # one epoch reaches 92%; the full run >= 97%
    c = result["confusion"]
    assert c.shape == (10, 10) and c.sum() == 360 and np.trace(c) / 360 == result["accuracy"]
    assert out.read_bytes().startswith(b"\x89PNG")
    assert "test accuracy" in capsys.readouterr().out


def test_char_gpt_trains_samples_and_resumes_exactly(tmp_path):
    gpt = _example("char_gpt")
    small = ["--width", "32", "--heads", "2", "--layers", "1", "--ctx", "16", "--batch-size", "4"]
    small += ["--no-progress", "--checkpoint-every", "2"]
    ckpt = str(tmp_path / "gpt.safetensors")
    first = gpt.main(
        [*small, "--steps", "4", "--until", "2", "--checkpoint", ckpt, "--sample", "12"]
    )
    assert [s for s, _, _ in first["history"]] == [0, 1]
    assert first["sample"].startswith("The ") and len(first["sample"]) == 16
    resumed = gpt.main([*small, "--steps", "4", "--checkpoint", ckpt, "--resume", "--sample", "0"])
    assert [s for s, _, _ in resumed["history"]] == [2, 3]
    other = str(tmp_path / "other.safetensors")
    whole = gpt.main([*small, "--steps", "4", "--checkpoint", other, "--sample", "0"])
    np.testing.assert_allclose(
        [v for _, _, v in resumed["history"]], [v for _, _, v in whole["history"][2:]], rtol=1e-5
    )
    for name, value in sm.params(whole["model"]).items():
        np.testing.assert_allclose(sm.params(resumed["model"])[name], value, rtol=1e-5, atol=1e-6)


def test_char_gpt_in_bfloat16_reaches_the_float32_validation_loss(tmp_path):
    # 60 steps of a tiny GPT (the 200-step figures of the example's own size are in
    # docs/performance.md): the mixed-precision run's validation loss, averaged over its last 20
    # steps, is within 2% of float32
    gpt = _example("char_gpt")
    small = ["--width", "32", "--heads", "2", "--layers", "1", "--ctx", "16", "--batch-size", "8"]
    small += ["--steps", "60", "--lr", "1e-2", "--no-progress", "--sample", "0", "--devices", "1"]
    small += ["--checkpoint-every", "1000"]
    val = {}
    for precision in ("float32", "bfloat16"):
        ckpt = str(tmp_path / f"{precision}.safetensors")
        run = gpt.main([*small, "--precision", precision, "--checkpoint", ckpt])
        val[precision] = float(np.mean([v for _, _, v in run["history"][-20:]]))
        dtypes = {np.dtype(a.dtype) for a in sm.params(run["model"]).values()}
        assert dtypes == {np.dtype("float32")}
    assert val["float32"] < 3.4  # it learned (chance is ln(V) = 4.5)
    assert abs(val["bfloat16"] - val["float32"]) / val["float32"] < 0.02, val


def test_gpt2_fine_tunes_from_a_hugging_face_checkpoint_with_partial_loading(tmp_path):
    ft = _example("gpt2_finetune")
    from shapeml.zoo import gpt2

    pretrained = gpt2.to_hf(gpt2.GPT2.init(seed=1, D=32, H=2, L=1), tmp_path / "pretrained")
    out = tmp_path / "finetuned"
    args = ["--pretrained", str(pretrained), "--steps", "4", "--ctx", "32", "--batch-size", "4"]
    args += ["--lr", "3e-3", "--eval-batches", "2", "--sample", "8", "--no-progress"]
    result = ft.main([*args, "--out", str(out)])
    report = result["report"]
    assert sorted(report.overlapped) == ["wpe.w", "wte.w"] and not report.missing
    assert "`wte.w`: file [50257 32], model [256 32]: loaded the file's [:256, :32]" in str(report)
    assert [s for s, _ in result["history"]] == [0, 1, 2, 3]
    assert result["val_after"] < result["val_before"]
    assert result["sample"].startswith("The ")
    back = gpt2.from_hf(out)
    assert (back.dims.V, back.dims.T) == (256, 32)
    np.testing.assert_array_equal(back.h[0].mlp.up.w, result["model"].h[0].mlp.up.w)
    assert ft.decode(ft.encode("héllo, wörld")) == "héllo, wörld"
    assert list(ft.encode(" a\n")) == [220, 64, 198]  # the ids GPT-2 itself gives these bytes


def test_llama_lora_fine_tunes_the_adapters_only_and_exports_the_merged_model(tmp_path):
    ex = _example("llama_lora")
    from shapeml import lora
    from shapeml.zoo import llama

    out = tmp_path / "merged"
    args = ["--steps", "8", "--ctx", "32", "--batch-size", "4", "--width", "32", "--layers", "1"]
    args += ["--lr", "1e-2", "--eval-batches", "2", "--sample", "8", "--out", str(out)]
    result = ex.main(args)
    assert [s for s, _ in result["history"]] == list(range(8))
    assert result["val_after"] < result["val_before"]
    assert result["sample"].startswith("The ")
    m, merged = result["model"], result["merged"]
    assert set(sm.params(m)) == {f"{k}.lora_{ab}" for k in lora.adapters(m) for ab in "ab"}
    back = llama.from_hf(out)
    np.testing.assert_array_equal(back.layers[0].attn.q.w, merged.layers[0].attn.q.w)
