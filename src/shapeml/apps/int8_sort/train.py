"""Training the float model that `shapeml int8` quantizes: `zoo.transformer.Transformer`, L = 1.

The float model is the shared decoder of `shapeml.zoo.transformer` with one layer. It is trained
with `shapeml.optim.adamw` on the sorting corpus (`corpus.py`), then quantized (`quantize.py`).
Everything is seeded, so the same call reproduces the shipped model file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from ... import optim
from ..._io import check_writable
from ...int8 import Int8Model
from ...models import save as save_model
from ...training import TrainStep
from ...zoo import transformer as tfm
from . import corpus as _corpus
from .quantize import quantize

__all__ = ["TrainConfig", "evaluate", "float_accuracy", "train_float", "train_int8"]


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Sizes and schedule of the shipped model (defaults reproduce `tiny_transformer.json`)."""

    d: int = 32
    heads: int = 4
    d_ff: int = 64
    ctx: int = 64
    steps: int = 1500
    batch: int = 64
    lr: float = 3e-3
    warmup: int = 100
    weight_decay: float = 0.01
    train_sequences: int = 20000
    calib_sequences: int = 256
    eval_sequences: int = 300
    seed: int = 0


def float_accuracy(m: tfm.Transformer, seqs: np.ndarray) -> float:
    """Greedy next-token accuracy of the float model on the answer positions of `seqs` [n T]."""
    logits = np.asarray(jax.jit(tfm.forward)(m, jnp.asarray(seqs)))
    pred = logits[:, :-1].argmax(-1)
    mask = _corpus.answer_mask(seqs)
    return float((pred == seqs[:, 1:])[mask].mean())


def train_float(cfg: TrainConfig = TrainConfig(), *, log=None) -> tuple[tfm.Transformer, dict]:
    """Trains the one-layer float transformer on the sorting corpus.

    Returns:
        `(model, stats)`: stats holds the final loss, the held-out answer accuracy and seconds.
    """
    t0 = time.perf_counter()
    V = len(_corpus.TOKENS)
    m = tfm.Transformer.init(seed=cfg.seed, V=V, T=cfg.ctx, D=cfg.d, H=cfg.heads, F=cfg.d_ff, L=1)
    warm = min(cfg.warmup, max(1, cfg.steps // 10))  # short runs (demos, tests) warm up less
    sched = optim.warmup(warm, optim.cosine(cfg.lr, cfg.steps - warm))
    opt = optim.adamw(m, lr=sched, weight_decay=cfg.weight_decay)
    data = _corpus.make_sequences(cfg.train_sequences, cfg.ctx, seed=cfg.seed + 1)
    rng = np.random.default_rng(cfg.seed + 2)
    step = TrainStep(tfm.loss, m, opt)
    loss = jnp.nan
    for i in range(cfg.steps):
        idx = rng.integers(0, len(data), size=cfg.batch)
        loss = step(jnp.asarray(data[idx]))
        if log is not None and (i % 500 == 0 or i == cfg.steps - 1):
            log(f"step {i:5d}  loss {float(loss):.4f}")
    m = step.model
    held_out = _corpus.make_sequences(2000, cfg.ctx, seed=cfg.seed + 1000)
    stats = {
        "final_loss": float(loss),
        "float_answer_accuracy": float_accuracy(m, held_out),
        "train_seconds": time.perf_counter() - t0,
    }
    return m, stats


def evaluate(q: Int8Model, m: tfm.Transformer, seqs: np.ndarray) -> dict[str, float]:
    """Greedy next tokens of the int8 model (`prompt_next_tokens`) and of the float model on
    held-out sequences [n T]: accuracies on the answer positions, and how often the two agree
    (on the answer positions, and on every position)."""
    fl = np.asarray(jax.jit(tfm.forward)(m, jnp.asarray(seqs)))[:, :-1].argmax(-1)
    iq = np.array([q.prompt_next_tokens(row.tolist())[:-1] for row in seqs])
    mask = _corpus.answer_mask(seqs)
    truth = seqs[:, 1:]
    return {
        "int8_answer_accuracy": float((iq == truth)[mask].mean()),
        "float_answer_accuracy": float((fl == truth)[mask].mean()),
        "agreement_answer_positions": float((iq == fl)[mask].mean()),
        "agreement_all_positions": float((iq == fl).mean()),
        "answer_positions": int(mask.sum()),
    }


def train_int8(
    cfg: TrainConfig = TrainConfig(),
    *,
    out: str | os.PathLike | None = None,
    float_out: str | os.PathLike | None = None,
    log=None,
) -> tuple[Int8Model, tfm.Transformer]:
    """Trains the float model, quantizes it (calibrated on corpus samples), evaluates both on
    held-out sequences and, with `out`, writes the int8 model file (and, with `float_out`, the
    float weights as safetensors via `sm.save`).

    Returns:
        `(int8_model, float_model)`; the evaluation is in `int8_model.meta["eval"]`.

    Raises:
        FolderMissingError, FileAccessError: (E1305, E1306) for an `out` or `float_out` that
            cannot be written (a missing folder, a folder), before any work.
    """
    for path in (out, float_out):  # every output, before any work
        if path is not None:
            check_writable(path)
    m, stats = train_float(cfg, log=log)
    calib = _corpus.make_sequences(cfg.calib_sequences, cfg.ctx, seed=cfg.seed + 500)
    meta = {
        "description": "one-layer int8 transformer sorting sets of letters (shapeml.apps.int8_sort.corpus)",
        "example": "fcak>acfk|",
        "train": dataclasses.asdict(cfg),
        "final_loss": stats["final_loss"],
    }
    q = Int8Model.from_json(quantize(m, calib, _corpus.TOKENS, meta))
    held_out = _corpus.make_sequences(cfg.eval_sequences, cfg.ctx, seed=cfg.seed + 1000)
    report = evaluate(q, m, held_out)
    q = q.replace(meta_json=json.dumps(dict(q.meta, eval=report)))  # a static: no re-validation
    if log is not None:
        log(
            ", ".join(
                f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in report.items()
            )
        )
    if out is not None:
        q.to_json(out)
    if float_out is not None:
        save_model(float_out, m)
    return q, m
