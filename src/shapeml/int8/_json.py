"""Reading and writing the int8 model file's JSON text: the file checks that come before any
parse (size), the parse errors as coded errors (E1614), and the export object.

A file is read only after its size is known to be under `MAX_FILE_BYTES`, and every way the parse
can fail (bad UTF-8, truncated or invalid JSON, nesting past the recursion limit, an integer too
long for Python's int parser, a key repeated in one object) is a coded error naming the file, never
a raw exception.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .._io import read_text
from .._validate import instance, shorten
from ._errors import Int8JsonError
from ._numerics import REQUANT_POINTS
from ._schema import FILE_DIMS, FORMAT, weight_names

__all__ = ["MAX_FILE_BYTES", "read_json", "to_dict"]

# 2**26 weights of at most 5 characters ("-128,") are 320 MiB; tokens and notes get the rest.
MAX_FILE_BYTES = 2**29
_FIX = "re-export it with `Int8Model.to_json(path)`; if it was copied, check the copy finished"


class _DuplicateKeyError(Exception):
    """Raised by the parser's object hook; `read_json` turns it into an E1614 naming the key."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Python keeps the last of two equal keys, other parsers the first: refuse to pick one.
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        raise _DuplicateKeyError(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return obj


def read_json(src: Any) -> Any:
    """The parsed model file of `src`: a path (read and parsed) or an already parsed mapping.

    Raises:
        ArgumentTypeError (E0003): `src` is neither a path nor a mapping.
        FileMissingError (E1304), FileFormatError (E1302): no such file, not UTF-8 text.
        Int8JsonError (E1614): larger than MAX_FILE_BYTES, not parseable JSON, or an object
            repeating a key.
    """
    if isinstance(src, Mapping):
        return src
    instance("src", src, (str, os.PathLike), "a path or a parsed JSON object (a dict)")
    path = Path(src)
    size = path.stat().st_size if path.is_file() else 0  # a missing file: read_text says so
    if size > MAX_FILE_BYTES:
        raise Int8JsonError(
            f"`{shorten(str(src))}` is {size:,} bytes, above the {MAX_FILE_BYTES:,}-byte cap of "
            "an int8 model file (checked before reading it)",
            fix="an int8 model holds at most 2**26 weights; check that this is a model file",
        )
    text = read_text(src, fix=_FIX)
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKeyError as e:
        raise Int8JsonError(
            f"`{shorten(str(src))}` repeats the key {shorten(e.args[0])} in one object; JSON "
            "parsers disagree on which value wins, so the file does not say one thing",
            fix="keep one of the two entries; " + _FIX,
        ) from None
    except json.JSONDecodeError as e:
        why = f"{e.msg} at line {e.lineno}, column {e.colno}"
    except RecursionError:
        why = "arrays or objects nested deeper than the parser allows"
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        why = shorten(str(e))
    raise Int8JsonError(f"`{shorten(str(src))}` is not valid JSON: {why}", fix=_FIX)


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
