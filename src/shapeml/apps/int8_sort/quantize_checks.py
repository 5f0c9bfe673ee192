"""What the int8 exporter (`quantize`) refuses, in the order docs/int8.md states: its inputs before
any work, then the scales and requant ratios they lead to, each with a coded error naming the
tensor and the cause (an all-zero weight, a ReLU dead on the calibration data, ...).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from ... import _jax_internals as jxi
from ..._errors import ArgumentError, ArgumentTypeError
from ..._validate import instance, shorten
from ...int8 import Int8Model, Int8ScaleError, Int8SizeError, Int8TokenError
from ...int8._numerics import EXP_TABLE_MAX, REQUANT_POINTS
from ...int8._schema import check_dims, check_sizes, check_tokens, meta_json, model_dims
from ...zoo import transformer as tfm

__all__ = [
    "ACTIVATIONS",
    "EXP_LENGTH",
    "MAX_SCORES",
    "WEIGHTS",
    "check_calib",
    "check_inputs",
    "check_ratios",
    "check_scales",
]

WEIGHTS = ("wq", "wk", "wv", "wo", "w1", "w2")
# In the order the float pass computes them: the first zero one is the root cause.
ACTIVATIONS = ("x0", "q", "k", "v", "attn", "x1", "h", "x2")
EXP_LENGTH = 128  # the exported exp table's length
# The float pass holds the attention scores of the whole calibration set, n * H * t * t float64s
# (4M for the shipped model); the cap keeps that, and the few temporaries like it, near 1 GiB.
MAX_SCORES = 2**27

_ZERO = {
    "x0": "the embedding rows of the calibration ids plus the positional rows 0..t-1 are zero",
    "q": "x0 @ wq is zero at every calibration position",
    "k": "x0 @ wk is zero at every calibration position",
    "v": "x0 @ wv is zero at every calibration position",
    "attn": "the attention output (softmax-weighted rows of v) is zero at every position",
    "x1": "x0 + attn @ wo is zero at every calibration position",
    "h": "the ReLU is dead on the calibration data: x1 @ w1 <= 0 at every position and unit",
    "x2": "x1 + h @ w2 is zero at every calibration position",
}


def _fields(m: tfm.Transformer) -> dict[str, np.ndarray]:
    """The float weights as float64 numpy (layer 0 of the stacked ones), after checking each is
    a concrete array (not a `jax.ShapeDtypeStruct` or a tracer)."""
    out = {}
    for name in ("embed", "pos", *WEIGHTS):
        x = getattr(m, name)
        if jxi.is_tracer(x) or not isinstance(x, (jax.Array, np.ndarray)):
            raise ArgumentTypeError(
                f"`m.{name}` is a {type(x).__name__}, not a concrete array",
                fix="quantize a trained model outside jax.jit / jax.eval_shape",
            )
        x = np.asarray(x, np.float64)
        out[name] = x if name in ("embed", "pos") else x[0]
    return out


def _check_model(m: Any) -> dict[str, np.ndarray]:
    instance("m", m, tfm.Transformer, "a float `Transformer` of shapeml.zoo.transformer")
    d = m.dims
    if d.L != 1:
        raise Int8SizeError(
            f"the float model has L = {d.L} layers; the int8 format holds exactly one",
            fix="train the float model with one layer: Transformer.init(seed=..., L=1)",
        )
    dims = check_dims({"d": d.D, "heads": d.H, "d_ff": d.F, "vocab": d.V, "ctx": d.T})
    check_sizes(Int8Model, model_dims(Int8Model, dims, EXP_LENGTH), EXP_TABLE_MAX)
    return _fields(m)


def check_calib(calib: Any, vocab: int, ctx: int, heads: int) -> np.ndarray:
    """The calibration ids as int64 `[n t]`, after their type, shape and values.

    Raises:
        ArgumentTypeError (E0003): not a numpy/JAX array or nested list of integers.
        ArgumentError (E0002): not 2-D, empty, longer than the context, or above MAX_SCORES.
        Int8TokenError (E1608): an id outside 0..vocab-1 (-1 included: never wrapped).
    """
    fix = f"pass token ids as an integer array [n t] with 1 <= t <= {ctx}"
    if isinstance(calib, (list, tuple)):
        try:
            arr = np.asarray(calib)
        except (ValueError, TypeError, OverflowError):
            raise ArgumentTypeError(
                f"`calib` is a ragged or mixed nested sequence: {shorten(calib)}", fix=fix
            ) from None
    elif isinstance(calib, (np.ndarray, jax.Array)) and not jxi.is_tracer(calib):
        arr = np.asarray(calib)
    else:
        raise ArgumentTypeError(
            f"`calib` must be an integer array [n t], got {shorten(calib)} "
            f"({type(calib).__name__})",
            fix=fix,
        )
    if arr.dtype.kind not in "iu":
        raise ArgumentTypeError(
            f"`calib` must hold integer token ids, got dtype {arr.dtype}", fix=fix
        )
    if arr.ndim != 2 or 0 in arr.shape:
        raise ArgumentError(
            f"`calib` has shape {arr.shape}; it must be [n t] with n >= 1 and t >= 1", fix=fix
        )
    n, t = arr.shape
    if t > ctx:
        raise ArgumentError(
            f"`calib` holds sequences of t = {t} tokens, longer than the context T = {ctx}",
            fix=fix,
        )
    if n * heads * t * t > MAX_SCORES:
        raise ArgumentError(
            f"`calib` [n t] = {list(arr.shape)} needs n * H * t * t = {n * heads * t * t:,} "
            f"attention scores in the float pass, above the cap {MAX_SCORES:,}",
            fix="calibrate on fewer or shorter sequences (256 x 64 suffices for the shipped model)",
        )
    bad = (arr < 0) | (arr >= vocab)
    if bad.any():
        i, j = (int(k) for k in np.argwhere(bad)[0])
        raise Int8TokenError(
            f"`calib[{i}, {j}]` = {int(arr[i, j])} is outside the vocabulary 0..{vocab - 1} "
            f"({int(bad.sum())} ids out of range)",
            fix=f"calibrate on token ids in 0..{vocab - 1}",
        )
    return arr.astype(np.int64)


def _check_meta(meta: Any) -> dict[str, Any]:
    if meta is None:
        return {}
    meta_json(meta)  # a mapping (E1601) of JSON values (E1601)
    if "scales" in meta:
        raise ArgumentError(
            "`meta` holds the key `scales`, which quantize writes (every scale it used)",
            fix="rename that key, or leave it out",
        )
    return dict(meta)


def check_inputs(
    m: Any, calib: Any, tokens: Any, meta: Any
) -> tuple[dict[str, np.ndarray], np.ndarray, tuple[str, ...], dict[str, Any]]:
    """Every input of `quantize`, in the order of docs/int8.md, before any work: the model (type,
    dims, concrete weights), the tokens, the calibration ids, `meta`, the weights' values.

    Returns:
        `(weights, calib, tokens, meta)`: float64 weights by name (`embed`, `pos`, layer 0 of
        `wq ... w2`), int64 calib `[n t]`, the tokens as a tuple, meta as a dict.
    """
    w = _check_model(m)
    d = m.dims
    tokens = check_tokens(tokens, d.V)
    calib = check_calib(calib, d.V, d.T, d.H)
    meta = _check_meta(meta)
    for name, x in w.items():
        finite = np.isfinite(x)
        if not finite.all():
            raise Int8ScaleError(
                f"`m.{name}` holds {int(x.size - finite.sum())} NaN or infinite values",
                fix="quantize a model with finite weights (train from a good checkpoint)",
            )
    return w, calib, tokens, meta


def _cause(name: str, amax: float, scale: float, weight: bool) -> str | None:
    """Why `scale` (= amax / 127) cannot be used, or None when it is positive and finite."""
    if scale > 0 and math.isfinite(scale):
        return None
    if math.isnan(amax) or math.isinf(amax):
        return f"max|{name}| is {amax} (the float64 pass overflowed)"
    if amax == 0:
        return f"`{name}` is all zero" if weight else _ZERO[name]
    return f"max|{name}| = {amax!r} divided by 127 underflows float64 to 0"


def check_scales(amax: Mapping[str, float], scales: Mapping[str, float]) -> None:
    """Every scale positive and finite: the weights `wq ... w2` and `embed` (the tied head's
    `eq`), then the activations in `ACTIVATIONS` order; the first that is not raises.

    Args:
        amax: name -> largest magnitude (weights by their names, activations by theirs).
        scales: the same names -> `amax / 127`.

    Raises:
        Int8ScaleError (E1615): naming the tensor, its scale and the cause.
    """
    for name in (*WEIGHTS, "embed", *ACTIVATIONS):
        weight = name in WEIGHTS or name == "embed"
        cause = _cause(name, amax[name], scales[name], weight)
        if cause is not None:
            what = f"weight `{name}`" if weight else f"activation `{name}`"
            raise Int8ScaleError(
                f"the scale of {what} is {scales[name]!r}: {cause}; every requant ratio that "
                "reads it would divide by it or be zero",
                fix=(
                    "train the model (an all-zero weight cannot be quantized)"
                    if weight
                    else "calibrate on sequences that exercise it (more or more varied data), "
                    "or fix the model"
                ),
            )


def check_ratios(ratios: Mapping[str, float], formulas: Mapping[str, str]) -> None:
    """Every requant ratio, in `REQUANT_POINTS` order, a positive finite float64.

    Raises:
        Int8ScaleError (E1615): naming the point, its formula and value.
    """
    for name in REQUANT_POINTS:
        r = ratios[name]
        if not (r > 0 and math.isfinite(r)):
            raise Int8ScaleError(
                f"the requant ratio of `{name}`, {formulas[name]} = {r!r}, is not a positive "
                "finite float64 (the scales are too far apart)",
                fix="check the float model's weights: their magnitudes differ by hundreds of "
                "orders",
            )
