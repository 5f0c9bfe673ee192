"""The `shapeml` command checks every flag and output path before any work, answers a mistake with
one coded line (exit 2 for usage, 1 for a failed run) and never replaces a good model file with a
worse one."""

from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import shapeml as sm
from shapeml import cli
from shapeml.apps import spotter_job
from shapeml.apps.int8_sort import shipped
from shapeml.apps.int8_sort import train as int8_train


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["train", "--steps", "-5"], "--steps: the value is -5"),
        (["train", "--steps", "0"], "--steps: the value is 0"),
        (["train", "--steps", "3.5"], "'3.5' is not a whole number"),
        (["train", "--devices", "0"], "--devices: the value is 0"),
        (["train", "--devices", "-1"], "--devices: the value is -1"),
        (["train", "--batch-size", "0"], "--batch-size: the value is 0"),
        (["train", "--train-size", "100000"], "--train-size: the value is 100000"),
        (["train", "--lr", "nan"], "--lr: the value is nan"),
        (["train", "--lr=-1e-3"], "--lr: the value is -0.001"),
        (["train", "--lr", "inf"], "--lr: the value is inf"),
        (["train", "--clip", "0"], "--clip: the value is 0.0"),
        (["train", "--warmup", "-1"], "--warmup: the value is -1"),
        (["train", "--checkpoint-every", "0"], "--checkpoint-every: the value is 0"),
        (["train", "--resume"], "--resume was given without --checkpoint"),
        (["train", "--batch-size", "64", "--train-size", "10"], "larger than --train-size 10"),
        (["train", "--bogus"], "unrecognized arguments: --bogus"),
        (["train", "--accumulate", "0"], "--accumulate: the value is 0"),
        (["train", "--out", "a.st", "--checkpoint", "./a.st"], "are the same file"),
        (["train", "--ema", "1.0"], "--ema: the value is 1.0"),
        (["train", "--ema", "nan"], "--ema: the value is nan"),
        (["train", "--mesh", "data=0"], "mesh axis `data` has size '0'"),
        (["train", "--mesh", "data"], "is not NAME=VALUE"),
        (["train", "--shard", "D"], "is not NAME=VALUE"),
        (["train", "--shard", "D=model"], "--shard was given without --mesh"),
        (["train", "--mesh", "data=1", "--devices", "1"], "--mesh and --devices were both given"),
        (["train", "--mesh", "data=1", "--shard", "Q=data"], "the rules name `Q`"),
        (["train", "--mesh", "data=1", "--shard", "D=model"], "mesh axis `model`"),
        (["eval", "x.safetensors", "--test-size", "0"], "--test-size: the value is 0"),
        (["explain", "E4242"], "no shapeml error or warning has the code `E4242`"),
    ],
)
def test_usage_mistakes_exit_2_with_one_coded_line(argv, needle, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default --out must stay untouched
    code = _main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert needle in err
    assert err.startswith("error: [E") and err.count("\n") == 1 and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_output_paths_are_checked_before_the_run(tmp_path, capsys):
    for flag in ("--out", "--checkpoint"):
        for path, why in (
            (tmp_path / "no" / "m.safetensors", "which does not exist"),
            (tmp_path, "is a folder"),
        ):
            assert _main(["train", flag, str(path)]) == 2
            err = capsys.readouterr().err
            assert "[E2102]" in err and why in err and "nothing was run" in err


def _no_work(*args, **kwargs):
    raise AssertionError("work started before the output paths were checked")


def test_no_training_starts_for_an_output_that_cannot_be_written(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(spotter_job, "train_spotter", _no_work)
    monkeypatch.setattr(int8_train, "train_int8", _no_work)
    afile = tmp_path / "a.txt"
    afile.write_text("x")
    for argv, why in [
        (["train", "--out", str(tmp_path / "missing_folder" / "m.safetensors")], "does not exist"),
        (["train", "--out", str(afile / "m.safetensors")], "which is a file, not a folder"),
        (["train", "--checkpoint", str(tmp_path / "none" / "c")], "does not exist"),
        (["int8", "train", "--out", str(tmp_path / "none" / "m.json")], "does not exist"),
        (["int8", "train", "--out", str(tmp_path), "--steps", "1"], "is a folder"),
        (["int8", "train", "--float-out", str(afile / "f")], "which is a file"),
    ]:
        assert _main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "[E2102]" in err and why in err and err.count("\n") == 1, err


def test_the_int8_defaults_are_checked_too(tmp_path, capsys, monkeypatch):
    # without --out, `shapeml int8 train` writes the shipped files inside the installed package,
    # which may be read-only: those paths are checked before the run like any other
    monkeypatch.setattr(int8_train, "train_int8", _no_work)
    monkeypatch.setattr(shipped, "TINY_MODEL_PATH", tmp_path / "ro" / "tiny.json")
    assert _main(["int8", "train", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "[E2102] --out (default: the shipped model)" in err and "does not exist" in err
    monkeypatch.setattr(shipped, "TINY_MODEL_PATH", tmp_path / "tiny.json")
    monkeypatch.setattr(shipped, "TINY_FLOAT_PATH", tmp_path / "ro" / "tiny.safetensors")
    assert _main(["int8", "train", "--steps", "1"]) == 2
    assert "[E2102] --float-out (default)" in capsys.readouterr().err


def test_the_jobs_check_their_outputs_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setattr(spotter_job.shapes, "draw", _no_work)
    monkeypatch.setattr(int8_train, "train_float", _no_work)
    missing = tmp_path / "missing_folder" / "m.safetensors"
    with pytest.raises(sm.ShapemlError, match=r"E1305.*missing_folder"):
        spotter_job.train_spotter(steps=1, out=missing)
    with pytest.raises(sm.ShapemlError, match=r"E1306.*is a folder"):
        spotter_job.train_spotter(steps=1, out=None, checkpoint=tmp_path)
    with pytest.raises(sm.ShapemlError, match=r"E0002.*the same file"):
        spotter_job.train_spotter(out=tmp_path / "a", checkpoint=tmp_path / "." / "a")
    with pytest.raises(sm.ShapemlError, match=r"E1305"):
        int8_train.train_int8(int8_train.TrainConfig(steps=1), out=missing)
    with pytest.raises(sm.ShapemlError, match=r"E1305"):
        int8_train.train_int8(int8_train.TrainConfig(steps=1), float_out=missing)
    assert list(tmp_path.iterdir()) == []


def test_a_batch_the_devices_do_not_divide_is_refused_before_the_run(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "shapeml.cli", "train", "--devices", "3", "--batch-size", "64"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert run.returncode == 2 and "[E2101]" in run.stderr
    assert "does not split over 3 devices" in run.stderr and "Traceback" not in run.stderr
    assert list(tmp_path.iterdir()) == []


def test_eval_of_a_missing_or_folder_path(tmp_path, capsys):
    assert _main(["eval", str(tmp_path / "none.safetensors")]) == 2
    assert "[E1304]" in capsys.readouterr().err
    assert _main(["eval", str(tmp_path)]) == 2
    assert "is a folder, not a file" in capsys.readouterr().err


def test_a_run_that_trained_nothing_keeps_the_existing_model(tmp_path, capsys, monkeypatch):
    out = tmp_path / "spotter.safetensors"
    out.write_bytes(b"a trained model")

    @jax.custom_jvp
    def poison(x):  # value 0, gradient NaN: every step is skipped, the loss stays finite
        return jnp.zeros_like(x)

    @poison.defjvp
    def _(primals, tangents):
        return poison(primals[0]), tangents[0] * jnp.nan

    def loss(m, img, y):
        value, aux = spotter_job_loss(m, img, y)
        return value + jnp.sum(poison(m.w_h)), aux

    spotter_job_loss = spotter_job.spotter_loss
    monkeypatch.setattr(spotter_job, "spotter_loss", loss)
    argv = ["train", "--steps", "2", "--train-size", "32", "--batch-size", "16"]
    code = _main([*argv, "--test-size", "8", "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1 and "[E2103]" in err and "left as it was" in err
    assert out.read_bytes() == b"a trained model"
    assert not [p for p in tmp_path.iterdir() if p != out]  # no temp file left behind


def _main(argv: list[str]) -> int:
    """`cli.main`, with argparse's exit for usage mistakes turned into its status."""
    try:
        return cli.main(argv)
    except SystemExit as e:
        return int(e.code)
