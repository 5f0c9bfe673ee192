"""Post-training quantization of the one-layer float transformer into an int8 model file.

Calibration runs the float model on corpus sequences and records the largest magnitude of every
activation the integer step requantizes to. Each tensor gets one symmetric scale, `s = max|.| / 127`.
The requant pair of each point is the fixed-point form (`requant_pair`) of the ratio of its
accumulator's scale to its output's scale. The residual stream grows layer by layer (|x2| is about
ten times |x0| in the shipped model), so `x0`, `x1` and `x2` each get their own scale, and the
requants `res1` and `res2` carry the stream from one to the next.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...int8 import FORMAT, exp_table, requant_pair
from ...zoo import transformer as tfm

__all__ = ["SCORE_STEP", "calibrate", "float_intermediates", "quantize"]

SCORE_STEP = 0.1  # nats per exp-table entry: 128 entries cover distances up to 12.7


def _np(m: tfm.Transformer) -> dict[str, np.ndarray]:
    w = {k: np.asarray(getattr(m, k), np.float64) for k in ("embed", "pos")}
    w.update(
        {k: np.asarray(getattr(m, k)[0], np.float64) for k in ("wq", "wk", "wv", "wo", "w1", "w2")}
    )
    return w


def float_intermediates(m: tfm.Transformer, seqs: np.ndarray) -> dict[str, np.ndarray]:
    """The float model's activations on `seqs` [n t] (float64 numpy, the math of
    `transformer.forward` with L = 1), named like the integer step's."""
    w = _np(m)
    n, t = seqs.shape
    H = m.dims.H
    d = m.dims.D
    dh = d // H
    x0 = w["embed"][seqs] + w["pos"][None, :t]
    q, k, v = (x0 @ w[f"w{c}"] for c in "qkv")
    qh, kh, vh = (a.reshape(n, t, H, dh) for a in (q, k, v))
    s = np.einsum("bihd,bjhd->bhij", qh, kh) / math.sqrt(dh)
    s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    attn = np.einsum("bhij,bjhd->bihd", p, vh).reshape(n, t, d)
    x1 = x0 + attn @ w["wo"]
    h = np.maximum(x1 @ w["w1"], 0)
    x2 = x1 + h @ w["w2"]
    return {
        "x0": x0,
        "q": q,
        "k": k,
        "v": v,
        "attn": attn,
        "x1": x1,
        "h": h,
        "x2": x2,
        "logits": x2 @ w["embed"].T,
    }


def calibrate(m: tfm.Transformer, seqs: np.ndarray) -> dict[str, float]:
    """The scale (real value of one integer step) of every activation, from corpus samples."""
    a = float_intermediates(m, seqs)
    amax = lambda *xs: max(float(np.abs(x).max()) for x in xs)
    return {
        "x0": amax(a["x0"]) / 127,
        "x1": amax(a["x1"]) / 127,
        "x2": amax(a["x2"]) / 127,
        "q": amax(a["q"]) / 127,
        "k": amax(a["k"]) / 127,
        "v": amax(a["v"]) / 127,
        "attn": amax(a["attn"]) / 127,
        "h": amax(a["h"]) / 127,
    }


def _q8(x: np.ndarray, scale: float) -> np.ndarray:
    return np.clip(np.floor(x / scale + 0.5), -128, 127).astype(np.int64)


def quantize(
    m: tfm.Transformer,
    calib: np.ndarray,
    tokens: tuple[str, ...],
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The int8 model file (a dict, see docs/int8.md) of float model `m`, calibrated on `calib`.

    Args:
        m: a trained `Transformer` with L = 1.
        calib: int32 `[n t]` corpus sequences for the activation ranges.
        tokens: the string of each token id.
        meta: notes stored in the file.
    """
    if m.dims.L != 1:
        raise ValueError(f"shapeml.int8 quantizes one-layer models, got L={m.dims.L}")
    w = _np(m)
    s = calibrate(m, calib)
    sw = {k: float(np.abs(w[k]).max()) / 127 for k in ("wq", "wk", "wv", "wo", "w1", "w2")}
    s_e = float(np.abs(w["embed"]).max()) / 127
    dh = m.dims.D // m.dims.H
    ratios = {
        "q": s["x0"] * sw["wq"] / s["q"],
        "k": s["x0"] * sw["wk"] / s["k"],
        "v": s["x0"] * sw["wv"] / s["v"],
        "score": s["q"] * s["k"] / (math.sqrt(dh) * SCORE_STEP),
        "attn": s["v"] / (127 * s["attn"]),
        "wo": s["attn"] * sw["wo"] / s["x1"],
        "res1": s["x0"] / s["x1"],
        "w1": s["x1"] * sw["w1"] / s["h"],
        "w2": s["h"] * sw["w2"] / s["x2"],
        "res2": s["x1"] / s["x2"],
    }
    tensors = {
        "embed": _q8(w["embed"], s["x0"]),
        "positions": _q8(w["pos"], s["x0"]),
        **{k: _q8(w[k], sw[k]) for k in ("wq", "wk", "wv", "wo", "w1", "w2")},
        "eq": _q8(w["embed"], s_e),
    }
    d = m.dims
    return {
        "format": FORMAT,
        "dims": {"d": d.D, "heads": d.H, "d_ff": d.F, "vocab": d.V, "ctx": d.T},
        "tokens": list(tokens),
        "requant": {k: list(requant_pair(r)) for k, r in ratios.items()},
        "exp_table": exp_table(SCORE_STEP, length=128),
        "tensors": {k: v.reshape(-1).tolist() for k, v in tensors.items()},
        "meta": dict(meta or {}, scales={**s, **{f"w_{k}": v for k, v in sw.items()}, "eq": s_e}),
    }
