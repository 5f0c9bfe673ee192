"""The JSON model file of an int8 transformer (its import/export format): validation, export and
the overflow bounds.

The file's tensors are the model's int8 fields (`Int8Model`'s declarations, passed in as `cls`):
their names, order and shapes come from there. Validation runs in an order that never allocates
what it has not sized: the keys, then the dims, then the exp table, then the int32 accumulator
bounds the dims imply, then the size caps, and only then the tensors (their lengths before their
values). Every failure names the field.
"""

from __future__ import annotations

import json
import math
import re
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
from ._numerics import (
    EXP_TABLE_MAX,
    INT32_MAX,
    MAX_MULTIPLIER,
    MAX_SHIFT,
    REQUANT_POINTS,
    accumulator_bounds,
)

__all__ = [
    "FILE_DIMS",
    "FORMAT",
    "check_exp_table",
    "check_requant",
    "check_sizes",
    "check_tokens",
    "model_dims",
    "to_dict",
    "validate",
    "weight_names",
]

FORMAT = "shapeml.int8.v1"
# The file's `dims` keys, in the file's order, and the model dim each one sets.
FILE_DIMS = {"d": "D", "heads": "H", "d_ff": "F", "vocab": "V", "ctx": "T"}
_REQUIRED = ("format", "dims", "tokens", "requant", "exp_table", "tensors")
_OPTIONAL = ("meta",)
# Caps on sizes, so that a corrupt file is refused before anything of its size is allocated.
_CAPS = {"d": 8192, "heads": 8192, "d_ff": 8192, "vocab": 65536, "ctx": 8192}
_MAX_WEIGHTS = 2**26


def weight_names(cls) -> tuple[str, ...]:
    """The file's `tensors`: every int8 field of the model class, in declaration order."""
    return tuple(n for n, s in cls.__shapeml_fields__.items() if s.dtype == np.int8)


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
    _keys(obj, "dims", tuple(FILE_DIMS))
    dims = {}
    for k in FILE_DIMS:
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


def check_exp_table(obj: Any) -> np.ndarray:
    """The exp table as int32 [L], or the E1601/E1604 error naming the bad entry."""
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


def check_sizes(cls, dims: Mapping[str, int], table0: int) -> None:
    """The int32 accumulator bounds (E1606), then the size caps (E1607), of model dims `dims`
    (an `Int8Model`'s `sm.Dims`) and exp-table head `table0`; `cls` declares the weights. Run by
    `validate` before any tensor is read and by `Int8Model`'s `__check_init__` on every build."""
    named = {
        k: int(dims[d]) for k, d in FILE_DIMS.items()
    }  # as the file (and its author) names them
    for name, (bound, formula) in accumulator_bounds(dims, table0).items():
        if bound > INT32_MAX:
            raise Int8AccumulatorError(
                f"the {name} accumulator can reach {formula} = {bound}, above int32's {INT32_MAX}"
                f" (dims {named})",
                fix="reduce the dimension in the formula so that the bound stays below 2**31",
            )
    for k, cap in _CAPS.items():
        if named[k] > cap:
            raise Int8SizeError(
                f"`dims.{k}` = {named[k]} exceeds the limit {cap}",
                fix=f"int8 models are small: keep {k} <= {cap}",
            )
    specs = cls.__shapeml_fields__
    total = sum(math.prod(specs[n].shape_in(dims)) for n in weight_names(cls))
    if total > _MAX_WEIGHTS:
        raise Int8SizeError(
            f"the dims {named} imply {total} weights, above the limit {_MAX_WEIGHTS}",
            fix="shrink vocab, ctx, d or d_ff",
        )


def check_tokens(obj: Any, vocab: int) -> tuple[str, ...]:
    """The tokens as a tuple: `vocab` distinct non-empty strings, or E1601/E1602."""
    if not isinstance(obj, (list, tuple)) or not all(isinstance(t, str) and t for t in obj):
        raise Int8FileError(
            "`tokens` must be a list of non-empty strings (one per vocab entry)",
            fix="write `tokens` as the string each token id spells",
        )
    if len(obj) != vocab:
        raise Int8ShapeError(
            f"`tokens` holds {len(obj)} strings, but the vocabulary dims.vocab = V = {vocab}",
            fix="write exactly one string per token id",
        )
    if len(set(obj)) != len(obj):
        dup = next(t for i, t in enumerate(obj) if t in obj[:i])
        raise Int8FileError(
            f"`tokens` spells two ids the same way: {dup!r}",
            fix="give every token a distinct string",
        )
    return tuple(obj)


def check_requant(obj: Any) -> dict[str, tuple[int, int]]:
    """The requant pairs, point -> (M, S), or the E1601/E1605 error naming the bad pair."""
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


def _tensor(name: str, obj: Any, shape: tuple[int, ...], dims: str) -> np.ndarray:
    where = f"tensors.{name}"
    if not isinstance(obj, list):
        raise Int8FileError(
            f"`{where}` must be a flat list of integers, got {type(obj).__name__}",
            fix=f"write `{where}` row-major as a flat JSON list",
        )
    want = math.prod(shape)
    if len(obj) != want:
        raise Int8ShapeError(
            f"`{where}` holds {len(obj)} values, but its shape [{dims}] = {shape} needs {want}",
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


def _file_shape(shape: tuple[int | str, ...]) -> str:
    """A declared shape in the file's dim names (`T D` -> `ctx d`), as a file's author knows them."""
    names = {d: k for k, d in FILE_DIMS.items()} | {"Dh": "(d/heads)", "E": "len(exp_table)"}
    rename = lambda mo: names.get(mo[0], mo[0])
    return " ".join(re.sub(r"[A-Za-z_]\w*", rename, str(tok)) for tok in shape)


def model_dims(cls, dims: Mapping[str, int], table_len: int):
    """The model's `sm.Dims` for the file's dims and exp-table length."""
    return cls.dims.resolve(**{FILE_DIMS[k]: v for k, v in dims.items()}, E=table_len)


def validate(obj: Any, cls) -> dict[str, Any]:
    """Checks a parsed model file and returns the keyword arguments that build the model.

    Args:
        obj: the parsed JSON object.
        cls: the model class (`Int8Model`); its int8 fields are the file's tensors.

    Returns:
        `dims`, `tokens`, `meta_json` and every field's array (int8 weights of their declared
        shapes, the int32 exp table [E] and requant pairs [10 2]).

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
    table = check_exp_table(obj["exp_table"])
    mdims = model_dims(cls, dims, len(table))
    check_sizes(cls, mdims, int(table[0]))
    tokens = check_tokens(obj["tokens"], dims["vocab"])
    requant = check_requant(obj["requant"])
    names = weight_names(cls)
    _keys(obj["tensors"], "tensors", names)
    specs = cls.__shapeml_fields__
    tensors = {
        n: _tensor(n, obj["tensors"][n], specs[n].shape_in(mdims), _file_shape(specs[n].shape))
        for n in names
    }
    pairs = np.asarray([requant[n] for n in REQUANT_POINTS], np.int32)
    return dict(
        tensors,
        dims=mdims,
        tokens=tokens,
        meta_json=_meta_json(obj.get("meta", {})),
        exp_table=table,
        requant_pairs=pairs,
    )


def _meta_json(meta: Any) -> str:
    if not isinstance(meta, Mapping):
        raise Int8FileError(
            f"`meta` must be a JSON object, got {type(meta).__name__}",
            fix="write `meta` as an object (free-form notes) or leave it out",
        )
    try:
        return json.dumps(dict(meta))
    except (TypeError, ValueError) as e:
        raise Int8FileError(
            f"`meta` holds a value JSON cannot write ({e})",
            fix="keep `meta` to JSON values: objects, lists, strings, numbers, bools, null",
        ) from None


def to_dict(m) -> dict[str, Any]:
    """The model file of `m` as a JSON-ready object (`validate(to_dict(m), cls)` round-trips).

    Keys come in the file's order: format, dims (d, heads, d_ff, vocab, ctx), tokens, requant
    (in `REQUANT_POINTS` order), exp_table, tensors (in field order, flat row-major), meta.
    """
    pairs = np.asarray(m.requant_pairs)
    return {
        "format": FORMAT,
        "dims": {k: int(m.dims[d]) for k, d in FILE_DIMS.items()},
        "tokens": list(m.tokens),
        "requant": {n: [int(p[0]), int(p[1])] for n, p in zip(REQUANT_POINTS, pairs, strict=True)},
        "exp_table": np.asarray(m.exp_table).astype(int).tolist(),
        "tensors": {
            n: np.asarray(getattr(m, n)).reshape(-1).astype(int).tolist()
            for n in weight_names(type(m))
        },
        "meta": json.loads(m.meta_json),
    }
