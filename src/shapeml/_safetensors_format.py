"""The safetensors format, byte for byte: the header shapeml writes, and every check of one it reads.

A file is an 8-byte little-endian header length `n`, `n` bytes of JSON naming each tensor's dtype,
shape and byte range in the body, then the body. `parse_header` checks everything the header claims
against the body's real size before a single tensor byte is read, so a lying file can never make
the reader allocate more than the file holds. Problems raise `HeaderError` with a short reason; the
file layer (`shapeml._files`) turns it into its coded error naming the file.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from ._errors import ArgumentTypeError
from ._validate import shorten

__all__ = [
    "DTYPES",
    "HeaderError",
    "Entry",
    "allowed_nonfinite",
    "dtype_name",
    "encode_header",
    "names_text",
    "nonfinite",
    "parse_header",
]

# safetensors dtype names -> numpy dtypes (bfloat16 and float8 come from ml_dtypes, via JAX).
DTYPES = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(jnp.bfloat16),
    "F8_E4M3": np.dtype(jnp.float8_e4m3fn),
    "F8_E5M2": np.dtype(jnp.float8_e5m2),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U64": np.dtype(np.uint64),
    "U32": np.dtype(np.uint32),
    "U16": np.dtype(np.uint16),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}
_MAX_RANK = 64  # numpy's own limit on dimensions
_KEYS = {"dtype", "shape", "data_offsets"}
# Scanned for NaN/inf this many elements at a time, so the check never allocates a copy's worth.
_CHUNK = 1 << 22


class HeaderError(ValueError):
    """What is wrong with a header, in a few words (the caller names the file)."""


class Entry(NamedTuple):
    """One tensor the header declares: its dtype, shape and byte range `[begin, end)` in the body."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    begin: int
    end: int


def dtype_name(dtype: Any) -> str | None:
    """The safetensors name of a numpy dtype, or None when safetensors has none."""
    return _NAMES.get(np.dtype(dtype).newbyteorder("="))


def encode_header(arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> bytes:
    """The length-prefixed JSON header for these arrays laid out in the body in this order.

    The JSON is padded with spaces to a multiple of 8 bytes, so every tensor starts aligned.
    """
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, a in arrays.items():
        header[name] = {
            "dtype": dtype_name(a.dtype),
            "shape": list(a.shape),
            "data_offsets": [offset, offset + a.nbytes],
        }
        offset += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise HeaderError(f"its header names {shorten(dup)} twice")
    return out


def _whole(value: Any) -> bool:
    return type(value) is int and value >= 0


def _entry(name: str, raw: Any, body: int) -> Entry:
    where = f"entry {shorten(name)}"
    if not isinstance(raw, dict) or set(raw) != _KEYS:
        got = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
        raise HeaderError(f"{where} is {shorten(got)}, not a map of dtype, shape and data_offsets")
    dtype, shape, offsets = raw["dtype"], raw["shape"], raw["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise HeaderError(f"{where} has dtype {shorten(dtype)}, which shapeml does not read")
    if not (isinstance(shape, list) and len(shape) <= _MAX_RANK and all(map(_whole, shape))):
        raise HeaderError(
            f"{where} has shape {shorten(shape)}; a shape is a list of at most {_MAX_RANK} "
            "whole numbers"
        )
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_whole, offsets))):
        raise HeaderError(f"{where} has data_offsets {shorten(offsets)}, not [begin, end]")
    begin, end = offsets
    if not begin <= end <= body:
        raise HeaderError(f"{where} claims bytes {begin}..{end} of a {body}-byte body")
    size = DTYPES[dtype].itemsize
    for d in shape:  # stops as soon as the claim outgrows the body: no huge products
        size *= d
        if size > body:
            break
    if size != end - begin:
        raise HeaderError(
            f"{where} is {dtype} {shorten(shape)}, which needs "
            f"{'more than ' + str(body) if size > body else size} bytes, but claims {end - begin}"
        )
    return Entry(name, DTYPES[dtype], tuple(shape), begin, end)


# As many tensors as a model may hold (models/_limits.py counts fields with the same cap): a
# header listing more is refused before its entries are built.
MAX_ENTRIES = 2**17


def parse_header(raw: bytes, body: int) -> tuple[list[Entry], dict[str, str]]:
    """Checks a header's JSON against a body of `body` bytes: `(entries by offset, metadata)`.

    Raises:
        HeaderError: for JSON that is not UTF-8 or not an object, a duplicate name, a dtype shapeml
            does not read, a bad shape, a byte range outside the body, a dtype and shape that
            disagree with their byte length, overlapping tensors or gaps between them, or metadata
            that is not a map of strings.
    """
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except HeaderError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError):  # JSONDecodeError is a ValueError
        raise HeaderError("its header is not JSON") from None
    if not isinstance(header, dict):
        raise HeaderError("its header is not a JSON object")
    if len(header) > MAX_ENTRIES + 1:  # checked before any entry is built or compared
        raise HeaderError(f"its header lists {len(header):,} tensors, more than {MAX_ENTRIES:,}")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise HeaderError("its metadata is not a map of strings")
    entries = sorted(
        (_entry(name, value, body) for name, value in header.items()),
        key=lambda e: (e.begin, e.end),
    )
    at = 0
    for e in entries:  # the format's rule: tensors tile the body, no overlap, no gap
        if e.begin != at:
            what = (
                "overlaps the one before it"
                if e.begin < at
                else f"leaves bytes {at}..{e.begin} unused"
            )
            raise HeaderError(f"entry {shorten(e.name)} {what}")
        at = e.end
    if at != body:
        raise HeaderError(f"its tensors end at byte {at} of a {body}-byte body")
    return entries, metadata


def allowed_nonfinite(allow_nonfinite: Any) -> bool | frozenset[str]:
    """`allow_nonfinite` checked: a bool, or the frozenset of names that may hold NaN/inf."""
    if isinstance(allow_nonfinite, bool):
        return allow_nonfinite
    if (
        isinstance(allow_nonfinite, Collection)
        and not isinstance(allow_nonfinite, (str, bytes))
        and all(isinstance(n, str) for n in allow_nonfinite)
    ):
        return frozenset(allow_nonfinite)
    raise ArgumentTypeError(
        f"`allow_nonfinite` must be True, False or a collection of tensor names, got "
        f"{shorten(allow_nonfinite)}",
        fix="pass allow_nonfinite=True, or e.g. allow_nonfinite=('mask',)",
    )


def nonfinite(arrays: Mapping[str, np.ndarray], skip: Iterable[str] | bool = ()) -> list[str]:
    """The names of floating arrays holding a NaN or an infinity (`skip`: names not checked)."""
    if skip is True:
        return []
    skip = set(skip or ())
    bad = []
    for name, a in arrays.items():
        if name in skip or not jnp.issubdtype(a.dtype, jnp.inexact) or a.size == 0:
            continue
        flat = a.reshape(-1)
        if any(not np.isfinite(flat[i : i + _CHUNK]).all() for i in range(0, flat.size, _CHUNK)):
            bad.append(name)
    return bad


def names_text(names: list[str], limit: int = 5) -> str:
    """`a`, `b` and 3 more: a list of names cut for a message (each name cut too)."""
    cut = [n if len(n) <= 60 else n[:57] + "..." for n in names[:limit]]
    shown = ", ".join(f"`{n}`" for n in cut)
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
