"""The JSON model file of an int8 transformer: its schema, its validation, its overflow bounds.

Validation runs in an order that never allocates what it has not sized: the keys, then the dims,
then the exp table, then the int32 accumulator bounds the dims imply, then the size caps, and only
then the tensors (their lengths before their values). Every failure names the field.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

import numpy as np

from .._errors import similar
from ._errors import (
    Int8AccumulatorError,
    Int8ExpTableError,
    Int8FileError,
    Int8RequantError,
    Int8ShapeError,
    Int8SizeError,
    Int8ValueError,
)
from ._numerics import EXP_TABLE_MAX, MAX_MULTIPLIER, MAX_SHIFT

__all__ = [
    "DIMS",
    "FORMAT",
    "REQUANT_POINTS",
    "TENSORS",
    "accumulator_bounds",
    "tensor_shape",
    "validate",
]

FORMAT = "shapeml.int8.v1"
DIMS = ("d", "heads", "d_ff", "vocab", "ctx")
# In the order the decode step applies them (docs/int8.md).
REQUANT_POINTS = ("q", "k", "v", "score", "attn", "wo", "res1", "w1", "w2", "res2")
# name -> shape in dim names; every tensor is stored flat, row-major.
TENSORS = {
    "embed": ("vocab", "d"),
    "positions": ("ctx", "d"),
    "wq": ("d", "d"),
    "wk": ("d", "d"),
    "wv": ("d", "d"),
    "wo": ("d", "d"),
    "w1": ("d", "d_ff"),
    "w2": ("d_ff", "d"),
    "eq": ("vocab", "d"),
}
_REQUIRED = ("format", "dims", "tokens", "requant", "exp_table", "tensors")
_OPTIONAL = ("meta",)
INT32_MAX = 2**31 - 1
# Caps on sizes, so that a corrupt file is refused before anything of its size is allocated.
_CAPS = {"d": 8192, "heads": 8192, "d_ff": 8192, "vocab": 65536, "ctx": 8192}
_MAX_WEIGHTS = 2**26


def tensor_shape(name: str, dims: Mapping[str, int]) -> tuple[int, ...]:
    """The shape of tensor `name` for these dims, e.g. `("d", "d_ff") -> (32, 64)`."""
    return tuple(dims[n] for n in TENSORS[name])


def accumulator_bounds(dims: Mapping[str, int], table0: int) -> dict[str, tuple[int, str]]:
    """Worst-case magnitude of every int32 accumulator of the decode step, with its formula.

    Activations are int8 (|a| <= 128), attention weights and ReLU outputs lie in [0, 127].
    """
    d, dh, d_ff, ctx = dims["d"], dims["d"] // dims["heads"], dims["d_ff"], dims["ctx"]
    return {
        "q/k/v (x @ Wq|Wk|Wv)": (d * 128 * 128, "d * 128 * 128"),
        "score distance (max - score)": (2 * dh * 128 * 128, "2 * (d / heads) * 128 * 128"),
        "softmax (254 * e + sum e)": ((254 + ctx) * table0, "(254 + ctx) * exp_table[0]"),
        "attention (p @ V)": (ctx * 127 * 128, "ctx * 127 * 128"),
        "wo (a @ Wo)": (d * 128 * 128, "d * 128 * 128"),
        "w1 (x @ W1)": (d * 128 * 128, "d * 128 * 128"),
        "w2 (h @ W2)": (d_ff * 127 * 128, "d_ff * 127 * 128"),
        "logits (x @ Eq^T)": (d * 128 * 128, "d * 128 * 128"),
    }


def _keys(obj: Any, where: str, required, optional=()) -> None:
    if not isinstance(obj, Mapping):
        raise Int8FileError(
            f"`{where}` must be a JSON object, got {type(obj).__name__}",
            fix=f"write `{where}` as an object with keys {', '.join(required)}",
        )
    missing = [k for k in required if k not in obj]
    if missing:
        raise Int8FileError(
            f"`{where}` is missing the key `{missing[0]}`"
            + (
                f" (and {len(missing) - 1} more: {', '.join(missing[1:])})"
                if len(missing) > 1
                else ""
            ),
            fix=f"add `{where}.{missing[0]}` (the schema is in docs/int8.md)",
        )
    extra = [k for k in obj if k not in required and k not in optional]
    if extra:
        hint = similar(str(extra[0]), [*required, *optional], what="key")
        raise Int8FileError(
            f"`{where}` has a key the schema does not define: `{extra[0]}`",
            fix=hint
            or f"remove `{where}.{extra[0]}`; allowed keys: {', '.join([*required, *optional])}",
        )


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _dims(obj: Any) -> dict[str, int]:
    _keys(obj, "dims", DIMS)
    dims = {}
    for k in DIMS:
        v = obj[k]
        if not _is_int(v) or v < 1:
            raise Int8SizeError(
                f"`dims.{k}` must be a positive integer, got {v!r}",
                fix=f"set `dims.{k}` to a positive integer",
            )
        dims[k] = int(v)
    if dims["d"] % dims["heads"]:
        raise Int8SizeError(
            f"`dims.heads`={dims['heads']} does not divide `dims.d`={dims['d']}",
            fix="choose heads so that d / heads is an integer (the head width)",
        )
    return dims


def _exp_table(obj: Any) -> np.ndarray:
    if not isinstance(obj, list):
        raise Int8FileError(
            f"`exp_table` must be a list of integers, got {type(obj).__name__}",
            fix="write the exp table as a JSON list of integers",
        )
    if not 1 <= len(obj) <= 128:
        raise Int8ExpTableError(
            f"`exp_table` must hold 1..128 entries, it holds {len(obj)}",
            fix="export a table of 1 to 128 non-increasing entries",
        )
    for i, v in enumerate(obj):
        if not _is_int(v) or not 0 <= v <= EXP_TABLE_MAX:
            raise Int8ExpTableError(
                f"`exp_table[{i}]` = {v!r} is not an integer in [0, {EXP_TABLE_MAX}]",
                fix=f"scale the table so that every entry lies in [0, {EXP_TABLE_MAX}]",
            )
        if i and v > obj[i - 1]:
            raise Int8ExpTableError(
                f"`exp_table` increases at index {i}: {obj[i - 1]} then {v}",
                fix="the table must be non-increasing (table[i+1] <= table[i])",
            )
    if obj[0] < 1:
        raise Int8ExpTableError(
            "`exp_table[0]` is 0: the row maximum would weigh nothing",
            fix="start the table with a positive entry (e.g. 32767)",
        )
    return np.asarray(obj, dtype=np.int32)


def _check_sizes(dims: dict[str, int], table0: int) -> None:
    for name, (bound, formula) in accumulator_bounds(dims, table0).items():
        if bound > INT32_MAX:
            raise Int8AccumulatorError(
                f"the {name} accumulator can reach {formula} = {bound}, above int32's {INT32_MAX}"
                f" (dims {dims})",
                fix="reduce the dimension in the formula so that the bound stays below 2**31",
            )
    for k, cap in _CAPS.items():
        if dims[k] > cap:
            raise Int8SizeError(
                f"`dims.{k}` = {dims[k]} exceeds the limit {cap}",
                fix=f"int8 models are small: keep {k} <= {cap}",
            )
    total = sum(int(np.prod(tensor_shape(n, dims))) for n in TENSORS)
    if total > _MAX_WEIGHTS:
        raise Int8SizeError(
            f"the dims {dims} imply {total} weights, above the limit {_MAX_WEIGHTS}",
            fix="shrink vocab, ctx, d or d_ff",
        )


def _tokens(obj: Any, vocab: int) -> tuple[str, ...]:
    if not isinstance(obj, list) or not all(isinstance(t, str) and t for t in obj):
        raise Int8FileError(
            "`tokens` must be a list of non-empty strings (one per vocab entry)",
            fix="write `tokens` as the string each token id spells",
        )
    if len(obj) != vocab:
        raise Int8ShapeError(
            f"`tokens` holds {len(obj)} strings, but dims.vocab = {vocab}",
            fix="write exactly one string per token id",
        )
    if len(set(obj)) != len(obj):
        dup = next(t for i, t in enumerate(obj) if t in obj[:i])
        raise Int8FileError(
            f"`tokens` spells two ids the same way: {dup!r}",
            fix="give every token a distinct string",
        )
    return tuple(obj)


def _requant(obj: Any) -> dict[str, tuple[int, int]]:
    _keys(obj, "requant", REQUANT_POINTS)
    pairs = {}
    for name in REQUANT_POINTS:
        pair = obj[name]
        if not (isinstance(pair, list) and len(pair) == 2 and all(map(_is_int, pair))):
            raise Int8RequantError(
                f"`requant.{name}` must be a pair [M, S] of integers, got {pair!r}",
                fix=f"write `requant.{name}` as [multiplier, shift]",
            )
        m, s = int(pair[0]), int(pair[1])
        if not 1 <= m <= MAX_MULTIPLIER:
            raise Int8RequantError(
                f"`requant.{name}` multiplier M = {m} is outside [1, 2**31 - 1]",
                fix="M must be positive and below 2**31 (scale S instead)",
            )
        if not 1 <= s <= MAX_SHIFT:
            raise Int8RequantError(
                f"`requant.{name}` shift S = {s} is outside [1, {MAX_SHIFT}]",
                fix=f"use a shift in 1..{MAX_SHIFT}",
            )
        pairs[name] = (m, s)
    return pairs


def _tensor(name: str, obj: Any, shape: tuple[int, ...]) -> np.ndarray:
    where = f"tensors.{name}"
    if not isinstance(obj, list):
        raise Int8FileError(
            f"`{where}` must be a flat list of integers, got {type(obj).__name__}",
            fix=f"write `{where}` row-major as a flat JSON list",
        )
    want = int(np.prod(shape))
    if len(obj) != want:
        dims = " x ".join(TENSORS[name])
        raise Int8ShapeError(
            f"`{where}` holds {len(obj)} values, but its shape {dims} = {shape} needs {want}",
            fix=f"export `{name}` flattened row-major with {want} values",
        )
    arr = np.asarray(obj)
    if arr.dtype.kind != "i" or any(v is True or v is False for v in obj):
        bad = next(i for i, v in enumerate(obj) if not _is_int(v))
        raise Int8ValueError(
            f"`{where}[{bad}]` = {obj[bad]!r} is not an integer",
            fix="quantize to integers before export",
        )
    out = np.flatnonzero((arr < -128) | (arr > 127))
    if out.size:
        i = int(out[0])
        raise Int8ValueError(
            f"`{where}[{i}]` = {int(arr[i])} lies outside int8 [-128, 127]"
            f" ({out.size} values out of range)",
            fix="clip the quantized weights to [-128, 127]",
        )
    return arr.astype(np.int8).reshape(shape)


def validate(obj: Any) -> dict[str, Any]:
    """Checks a parsed model file and returns its parts as validated numpy arrays and ints.

    Returns:
        dict with `dims` (name -> int), `tokens`, `requant` (name -> (M, S)), `exp_table` (int32
        [L]), `tensors` (name -> int8 array of its shape) and `meta`.

    Raises:
        Int8FileError, Int8SizeError, Int8ExpTableError, Int8AccumulatorError, Int8ShapeError,
        Int8RequantError, Int8ValueError: naming the first bad field found.
    """
    _keys(obj, "model file", _REQUIRED, _OPTIONAL)
    if obj["format"] != FORMAT:
        raise Int8FileError(
            f"`format` is {obj['format']!r}, expected {FORMAT!r}",
            fix=f'set "format": "{FORMAT}" (or re-export the model)',
        )
    dims = _dims(obj["dims"])
    table = _exp_table(obj["exp_table"])
    _check_sizes(dims, int(table[0]))
    tokens = _tokens(obj["tokens"], dims["vocab"])
    requant = _requant(obj["requant"])
    _keys(obj["tensors"], "tensors", tuple(TENSORS))
    tensors = {n: _tensor(n, obj["tensors"][n], tensor_shape(n, dims)) for n in TENSORS}
    meta = obj.get("meta", {})
    if not isinstance(meta, Mapping):
        raise Int8FileError(
            f"`meta` must be a JSON object, got {type(meta).__name__}",
            fix="write `meta` as an object (free-form notes) or leave it out",
        )
    for arr in (table, *tensors.values()):
        arr.setflags(write=False)  # the compiled paths cache these: they must never change
    return {
        "dims": dims,
        "tokens": tokens,
        "requant": requant,
        "exp_table": table,
        "tensors": types.MappingProxyType(tensors),
        "meta": dict(meta),
    }
