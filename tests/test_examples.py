"""The example scripts on real data, in their quick forms: the digits CNN trains and plots its
confusion matrix; the char-level GPT trains, samples with the KV-cache decode, and resumes from
its checkpoint exactly where an uninterrupted run would be."""

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
    result = digits.main(["--epochs", "2", "--out", str(out)])
    assert result["accuracy"] > 0.8  # two epochs; the full run reaches >= 97%
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
