"""The JSON model file of an int8 transformer (its import/export format): validation, export and
the overflow bounds.

The file's tensors are the model's int8 fields (`Int8Model`'s declarations, passed in as `cls`):
their names, order and shapes come from there. Validation runs in an order that never allocates
what it has not sized (docs/int8.md, "Validation order"): the keys, the format, the dims (each
under its cap), the exp table, the total weight cap, the int32 bounds, the tokens, the requant
pairs, and only then the tensors (their lengths before their values). Every failure names the
field and shows values shortened, so a huge or deeply nested value never floods a message.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from .._errors import similar
from .._validate import shorten
from ._errors import (
    Int8AccumulatorError,
    Int8ExpTableError,
    Int8FileError,
    Int8FormatError,
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
from ._tokenizer import check_vocabulary

__all__ = [
    "CAPS",
    "check_dims",
    "FILE_DIMS",
    "MAX_WEIGHTS",
    "FORMAT",
    "check_exp_table",
    "check_requant",
    "check_sizes",
    "check_tokens",
    "model_dims",
    "meta_json",
    "show",
    "validate",
    "weight_names",
]

FORMAT = "shapeml.int8.v1"
"""The `format` value of an int8 model file (the JSON that `Int8Model.from_json` reads)."""
# The file's `dims` keys, in the file's order, and the model dim each one sets.
FILE_DIMS = {"d": "D", "heads": "H", "d_ff": "F", "vocab": "V", "ctx": "T"}
_REQUIRED = ("format", "dims", "tokens", "requant", "exp_table", "tensors")
_OPTIONAL = ("meta",)
# Caps on sizes, so that a corrupt file is refused before anything of its size is allocated.
CAPS = {"d": 8192, "heads": 8192, "d_ff": 8192, "vocab": 65536, "ctx": 8192}
MAX_WEIGHTS = 2**26


def show(value: Any) -> str:
    """`shorten(value)`, also for a value nested too deep for `repr`."""
    try:
        return shorten(value)
    except RecursionError:
        return f"a {type(value).__name__} nested too deep to show"


def weight_names(cls) -> tuple[str, ...]:
    """The file's `tensors`: every int8 field of the model class, in declaration order."""
    return tuple(n for n, s in cls.__shapeml_fields__.items() if s.dtype == np.int8)


def _keys(obj: Any, where: str, required, optional=()) -> None:
    if not isinstance(obj, Mapping):
        raise Int8FileError(
            f"`{where}` must be a JSON object, got {show(obj)} ({type(obj).__name__})",
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
        key = show(extra[0]) if not isinstance(extra[0], str) else shorten(extra[0])[1:-1]
        hint = similar(key, [*required, *optional], what="key")
        raise Int8FileError(
            f"`{where}` has a key the schema does not define: `{key}`",
            fix=hint
            or f"remove `{where}.{key}`; allowed keys: {', '.join([*required, *optional])}",
        )


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def check_dims(obj: Any) -> dict[str, int]:
    """The file's dims: positive integers, each under its cap, heads dividing d (E1607)."""
    _keys(obj, "dims", tuple(FILE_DIMS))
    dims = {}
    for k in FILE_DIMS:
        v = obj[k]
        if not _is_int(v) or v < 1:
            raise Int8SizeError(
                f"`dims.{k}` must be a positive integer, got {show(v)}",
                fix=f"set `dims.{k}` to a positive integer",
            )
        dims[k] = int(v)
    _check_caps(dims)
    if dims["d"] % dims["heads"]:
        raise Int8SizeError(
            f"`dims.heads`={dims['heads']} does not divide `dims.d`={dims['d']}",
            fix="choose heads so that d / heads is an integer (the head width)",
        )
    return dims


def _check_caps(named: Mapping[str, int]) -> None:
    for k, cap in CAPS.items():
        if named[k] > cap:
            raise Int8SizeError(
                f"`dims.{k}` = {named[k]} exceeds the limit {cap}",
                fix=f"int8 models are small: keep {k} <= {cap}",
            )


def check_exp_table(obj: Any) -> np.ndarray:
    """The exp table as int32 [L], or the E1601/E1604 error naming the bad entry."""
    if not isinstance(obj, list):
        raise Int8FileError(
            f"`exp_table` must be a list of integers, got {show(obj)}",
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
                f"`exp_table[{i}]` = {show(v)} is not an integer in [0, {EXP_TABLE_MAX}]",
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
    """The size caps (E1607), then the int32 bounds (E1606), of model dims `dims` (an
    `Int8Model`'s `sm.Dims`) and exp-table head `table0`; `cls` declares the weights. Run by
    `validate` before any tensor is read and by `Int8Model`'s `__check_init__` on every build.

    The caps are the real guard: under them every bound is below 2**31 (the largest, the softmax
    divisor `2 * z`, is 2 * 8192 * 32767 < 2**29; tests/test_int8_spec.py derives the table), so the
    bounds check
    cannot fire for dims the caps allow. It stays as the executable form of the overflow proof,
    should a cap ever be raised."""
    named = {
        k: int(dims[d]) for k, d in FILE_DIMS.items()
    }  # as the file (and its author) names them
    _check_caps(named)
    specs = cls.__shapeml_fields__
    total = sum(math.prod(specs[n].shape_in(dims)) for n in weight_names(cls))
    if total > MAX_WEIGHTS:
        raise Int8SizeError(
            f"the dims {named} imply {total} weights, above the limit {MAX_WEIGHTS}",
            fix="shrink vocab, ctx, d or d_ff",
        )
    for name, (bound, formula) in accumulator_bounds(dims, table0).items():
        if bound > INT32_MAX:
            raise Int8AccumulatorError(
                f"the {name} accumulator can reach {formula} = {bound}, above int32's {INT32_MAX}"
                f" (dims {named})",
                fix="reduce the dimension in the formula so that the bound stays below 2**31",
            )


def check_tokens(obj: Any, vocab: int) -> tuple[str, ...]:
    """The tokens as a tuple: a list of `vocab` strings (E1601, E1602) that follow the vocabulary
    rules (E1613, `_tokenizer.check_vocabulary`)."""
    if not isinstance(obj, (list, tuple)):
        raise Int8FileError(
            f"`tokens` must be a list of strings (one per vocab entry), got {show(obj)}",
            fix="write `tokens` as the string each token id spells",
        )
    if len(obj) != vocab:
        raise Int8ShapeError(
            f"`tokens` holds {len(obj)} strings, but the vocabulary dims.vocab = V = {vocab}",
            fix="write exactly one string per token id",
        )
    return check_vocabulary(obj)


def check_requant(obj: Any) -> dict[str, tuple[int, int]]:
    """The requant pairs, point -> (M, S), or the E1601/E1605 error naming the bad pair."""
    _keys(obj, "requant", REQUANT_POINTS)
    pairs = {}
    for name in REQUANT_POINTS:
        pair = obj[name]
        if not (isinstance(pair, list) and len(pair) == 2 and all(map(_is_int, pair))):
            raise Int8RequantError(
                f"`requant.{name}` must be a pair [M, S] of integers, got {show(pair)}",
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
            f"`{where}` must be a flat list of integers, got {show(obj)}",
            fix=f"write `{where}` row-major as a flat JSON list",
        )
    want = math.prod(shape)
    if len(obj) != want:
        raise Int8ShapeError(
            f"`{where}` holds {len(obj)} values, but its shape [{dims}] = {shape} needs {want}",
            fix=f"export `{name}` flattened row-major with {want} values",
        )
    # On the Python values, before numpy sees them: a nested list, a float or 2**70 would
    # otherwise become a 2-D, float or object array (or an OverflowError).
    if not set(map(type, obj)) <= {int} and not all(map(_is_int, obj)):  # the first test: C speed
        bad = next(i for i, v in enumerate(obj) if not _is_int(v))
        raise Int8ValueError(
            f"`{where}[{bad}]` = {show(obj[bad])} is not an integer",
            fix="quantize to integers before export",
        )
    if obj and not -128 <= min(obj) <= max(obj) <= 127:
        out = [i for i, v in enumerate(obj) if not -128 <= v <= 127]
        raise Int8ValueError(
            f"`{where}[{out[0]}]` = {show(obj[out[0]])} lies outside int8 [-128, 127]"
            f" ({len(out)} values out of range)",
            fix="clip the quantized weights to [-128, 127]",
        )
    return np.asarray(obj, dtype=np.int8).reshape(shape)


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
    if not (isinstance(obj["format"], str) and obj["format"] == FORMAT):
        raise Int8FormatError(
            f"`format` is {show(obj['format'])}, expected {FORMAT!r}",
            fix=f'set "format": "{FORMAT}" (or re-export the model)',
        )
    dims = check_dims(obj["dims"])
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
        meta_json=meta_json(obj.get("meta", {})),
        exp_table=table,
        requant_pairs=pairs,
    )


def meta_json(meta: Any) -> str:
    if not isinstance(meta, Mapping):
        raise Int8FileError(
            f"`meta` must be a JSON object, got {show(meta)}",
            fix="write `meta` as an object (free-form notes) or leave it out",
        )
    try:
        return json.dumps(dict(meta))
    except (TypeError, ValueError, RecursionError) as e:
        raise Int8FileError(
            f"`meta` holds a value JSON cannot write ({shorten(str(e))})",
            fix="keep `meta` to JSON values: objects, lists, strings, numbers, bools, null",
        ) from None
