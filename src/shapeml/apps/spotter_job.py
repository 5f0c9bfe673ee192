"""The main job: train the Spotter on the shapes data set, evaluate it, save it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import optim, sharding
from .._errors import ArgumentError
from .._io import check_writable, same_file
from .._validate import integer, real
from ..data import batches, shapes
from ..models import load, save
from ..training import TrainResult, train
from ..training._loop import predict_in_batches
from ..zoo.spotter import (
    Spotter,
    confusion,
    cross_entropy,
    forward,
    per_class_accuracy,
    predict,
)
from ._flags import NothingTrainedError

__all__ = ["TEST_SEED", "evaluate_spotter", "format_report", "spotter_loss", "train_spotter"]

TEST_SEED = 1_000_003  # held-out images come from a seed no training run uses


def spotter_loss(m: Spotter, img: jax.Array, y: jax.Array):
    """Mean cross-entropy, with the batch accuracy as an aux metric for the progress bar."""
    logits = forward(m, img)
    return cross_entropy(logits, y), {"acc": jnp.mean(jnp.argmax(logits, axis=-1) == y)}


def evaluate_spotter(m: Spotter, n: int = 2000, seed: int = TEST_SEED) -> dict[str, Any]:
    """Accuracy, per-class accuracy and confusion matrix on `n` held-out images."""
    img, y = shapes.draw(n, seed=seed)
    pred = predict_in_batches(predict, m, img)
    classes = m.dims.C
    return {
        "accuracy": float(np.mean(pred == y)),
        "per_class": np.asarray(per_class_accuracy(jnp.asarray(pred), jnp.asarray(y), classes)),
        "confusion": np.asarray(confusion(jnp.asarray(pred), jnp.asarray(y), classes)),
    }


def format_report(report: dict[str, Any]) -> str:
    """The evaluation as text: accuracy, per-class accuracy, confusion matrix."""
    names = shapes.CLASSES
    lines = [f"held-out accuracy: {report['accuracy']:.4f}", "per-class accuracy:"]
    lines += [f"  {name:>6}: {acc:.4f}" for name, acc in zip(names, report["per_class"])]
    lines.append("confusion (rows: true, columns: predicted):")
    lines.append("         " + " ".join(f"{n:>6}" for n in names))
    for name, row in zip(names, report["confusion"]):
        lines.append(f"  {name:>6} " + " ".join(f"{int(v):>6}" for v in row))
    return "\n".join(lines)


def train_spotter(
    *,
    steps: int = 1500,
    batch_size: int = 64,
    lr: float = 3e-3,
    warmup: int = 50,
    clip: float = 1.0,
    seed: int = 0,
    train_size: int = 20_000,
    test_size: int = 2_000,
    devices: int | None = None,
    out: str | os.PathLike | None = "spotter.safetensors",
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int = 500,
    resume: bool = False,
    progress: bool = True,
    accumulate: int = 1,
    ema: float | None = None,
    mesh: str | None = None,
    rules: Mapping[str, Any] | None = None,
) -> tuple[TrainResult, dict[str, Any]]:
    """Trains a Spotter on generated shapes with AdamW (warmup + cosine, clipping, NaN skipping).

    Returns the training result and the held-out evaluation; saves the model to `out`. With
    `accumulate=N` each update averages N batches; with `ema=DECAY` the moving average of the
    weights is what is evaluated and saved; `devices=N` splits each batch over N devices (default:
    one, the fastest for this model on CPU); with `mesh="data=2,model=2"` the batch is split over
    `data` and the fields are placed by `rules` (e.g. `{"Dc": "model"}`).

    Raises:
        ArgumentError, ArgumentTypeError: (E0002, E0003) for a bad argument, before any work.
        FolderMissingError, FileAccessError: (E1305, E1306) for an `out` or `checkpoint` that
            cannot be written (a missing folder, a folder), before any work.
        NothingTrainedError: (E2103) when no step was applied; `out` is then left as it was.
    """
    steps = integer("steps", steps, low=1)
    train_size = integer("train_size", train_size, low=1)
    test_size = integer("test_size", test_size, low=1)
    batch_size = integer("batch_size", batch_size, low=1, high=train_size)
    warmup = integer("warmup", warmup, low=0)
    lr = real("lr", lr, low=0.0, low_open=True)
    clip = real("clip", clip, low=0.0, low_open=True)
    seed = integer("seed", seed, low=0)
    # Every output is checked before any work: a typo in a path must not cost the run.
    for path in (out, checkpoint):
        if path is not None:
            check_writable(path)
    if out is not None and checkpoint is not None and same_file(out, checkpoint):
        raise ArgumentError(
            f"`out` and `checkpoint` are the same file {str(out)!r}: the model would overwrite "
            "the checkpoint and its optimizer state",
            fix="pass two different paths",
        )
    if mesh is not None:
        mesh = sharding.make_mesh(mesh)
        sharding.partition_specs(Spotter.init(seed=seed), rules or {})  # rules checked first
    img, y = shapes.draw(train_size, seed=seed)
    m = Spotter.init(seed=seed)
    schedule = optim.warmup(warmup, optim.cosine(lr, max(steps - warmup, 1)))
    opt = optim.adamw(m, lr=schedule, transforms=[optim.clip_norm(clip)], skip_nonfinite=True)
    result = train(
        spotter_loss,
        m,
        opt,
        batches(img, y, batch_size=batch_size, seed=seed),
        steps=steps,
        has_aux=True,
        checkpoint=checkpoint,
        checkpoint_every=checkpoint_every if checkpoint else 0,
        resume=resume,
        # One device unless asked: the Spotter's convolutions already spread over every core in
        # XLA's thread pool, and its batch split over core-devices measured slower
        # (docs/performance.md), unlike a transformer's step.
        devices=1 if devices is None and mesh is None else devices,
        progress=progress,
        accumulate=accumulate,
        ema=ema,
        mesh=mesh,
        rules=rules,
    )
    if int(result.opt.step) // result.opt.accumulate == 0:  # finite gradients -> updates
        raise NothingTrainedError(
            f"every one of the {steps} steps had non-finite gradients and was skipped; "
            + (f"{str(out)!r} was left as it was" if out is not None else "nothing was saved"),
            fix="lower the learning rate (--lr) or the clip (--clip) and run again",
        )
    final = result.model if ema is None else result.ema
    if out is not None:
        save(out, final)
    return result, evaluate_spotter(final, test_size)


def evaluate_file(path: str | os.PathLike, n: int = 2000) -> dict[str, Any]:
    """Loads a saved Spotter and evaluates it on `n` held-out images."""
    return evaluate_spotter(load(path, Spotter), n)
