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
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...int8 import FORMAT, exp_table, requant_pair
from ...zoo import transformer as tfm
from .quantize_checks import EXP_LENGTH, WEIGHTS, check_inputs, check_ratios, check_scales

__all__ = ["RATIOS", "SCORE_STEP", "calibrate", "float_intermediates", "quantize"]

SCORE_STEP = 0.1  # nats per exp-table entry: 128 entries cover distances up to 12.7


def _np(m: tfm.Transformer) -> dict[str, np.ndarray]:
    w = {k: np.asarray(getattr(m, k), np.float64) for k in ("embed", "pos")}
    w.update({k: np.asarray(getattr(m, k)[0], np.float64) for k in WEIGHTS})
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


def _amax(a: dict[str, np.ndarray]) -> dict[str, float]:
    return {k: float(np.abs(a[k]).max()) for k in ("x0", "x1", "x2", "q", "k", "v", "attn", "h")}


def calibrate(m: tfm.Transformer, seqs: np.ndarray) -> dict[str, float]:
    """The scale (real value of one integer step) of every activation, from corpus samples."""
    return {k: v / 127 for k, v in _amax(float_intermediates(m, seqs)).items()}


def _q8(x: np.ndarray, scale: float) -> np.ndarray:
    with np.errstate(over="ignore"):  # a huge x / scale is clipped to 127 like any other
        return np.clip(np.floor(x / scale + 0.5), -128, 127).astype(np.int64)


# Each point's ratio, accumulator scale over output scale, evaluated left to right in float64.
RATIOS = {
    "q": "s_x0 * s_wq / s_q",
    "k": "s_x0 * s_wk / s_k",
    "v": "s_x0 * s_wv / s_v",
    "score": "s_q * s_k / (sqrt(dh) * 0.1)",
    "attn": "s_v / (127 * s_attn)",
    "wo": "s_attn * s_wo / s_x1",
    "res1": "s_x0 / s_x1",
    "w1": "s_x1 * s_w1 / s_h",
    "w2": "s_h * s_w2 / s_x2",
    "res2": "s_x1 / s_x2",
}


@typing.no_type_check  # validates its arguments itself, with coded errors
def quantize(
    m: tfm.Transformer,
    calib: Any,
    tokens: Sequence[str],
    meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The int8 model file (a dict, see docs/int8.md) of float model `m`, calibrated on `calib`.

    Every input is checked first, in the order docs/int8.md states, before any work; then the
    scales and the requant ratios (a degenerate model is refused, never exported half-broken).

    Args:
        m: a `Transformer` with L = 1 whose dims fit the int8 file's caps.
        calib: integer token ids `[n t]` (numpy or JAX array, or nested lists), `1 <= t <= T`,
            every id in `0 .. V-1`: the sequences the activation ranges are measured on.
        tokens: the string of each token id (a list or tuple of V strings, the rules of "Text").
        meta: notes stored in the file's `meta` (JSON values, without a `scales` key), or None.

    Returns:
        The file's object: `format`, `dims`, `tokens`, `requant`, `exp_table`, `tensors`, `meta`
        (meta's own keys first, then `scales`, every scale used).

    Raises:
        ArgumentTypeError (E0003): `m` not a Transformer of concrete arrays; `calib` not integers.
        Int8SizeError (E1607): L != 1, or dims outside the int8 file's caps.
        Int8FileError (E1601), Int8ShapeError (E1602), Int8VocabularyError (E1613): `tokens`.
        ArgumentError (E0002): `calib` not `[n t]`, empty, longer than T, or too large.
        Int8TokenError (E1608): a calibration id outside `0 .. V-1`.
        Int8FileError (E1601) / ArgumentError (E0002): `meta` not JSON, or holding `scales`.
        Int8ScaleError (E1615): a non-finite weight, a zero or non-finite scale (an all-zero
            weight, a ReLU dead on the calibration data, ...), or a ratio out of float64's range.
    """
    w, calib, tokens, meta = check_inputs(m, calib, tokens, meta)
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is a non-finite scale below
        amax = _amax(float_intermediates(m, calib))
    amax |= {k: float(np.abs(w[k]).max()) for k in (*WEIGHTS, "embed")}
    scale = {k: v / 127 for k, v in amax.items()}
    check_scales(amax, scale)
    s = {k: scale[k] for k in ("x0", "x1", "x2", "q", "k", "v", "attn", "h")}
    sw = {k: scale[k] for k in WEIGHTS}
    s_e = scale["embed"]
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
    check_ratios(ratios, RATIOS)
    tensors = {
        "embed": _q8(w["embed"], s["x0"]),
        "positions": _q8(w["pos"], s["x0"]),
        **{k: _q8(w[k], sw[k]) for k in WEIGHTS},
        "eq": _q8(w["embed"], s_e),
    }
    d = m.dims
    return {
        "format": FORMAT,
        "dims": {"d": d.D, "heads": d.H, "d_ff": d.F, "vocab": d.V, "ctx": d.T},
        "tokens": list(tokens),
        "requant": {k: list(requant_pair(r)) for k, r in ratios.items()},
        "exp_table": exp_table(SCORE_STEP, length=EXP_LENGTH),
        "tensors": {k: v.reshape(-1).tolist() for k, v in tensors.items()},
        "meta": dict(meta, scales={**s, **{f"w_{k}": v for k, v in sw.items()}, "eq": s_e}),
    }
