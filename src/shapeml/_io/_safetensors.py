"""Safetensors files, on the `safetensors` library: `write_safetensors` and `read_safetensors`, the
one writer and reader of tensors (model and optimizer checkpoints, exported artifacts, HF folders).

The library serializes, parses and validates the format: it checks a header whole against the
file's real size (dtypes, shapes and byte ranges that tile the body exactly) before a tensor byte
is read, so a lying header never makes the reader allocate more than the file holds; shapeml then
reads each tensor's bytes straight into its array. shapeml adds atomic writes (`_atomic`), the
dtypes it holds, the NaN policy, a size limit, and coded errors that name the file.
"""

from __future__ import annotations

import contextlib
import math
import os
import typing
import warnings
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError, TensorSpec, safe_open, serialize_file

from .._errors import ArgumentTypeError, ShapemlError
from .._traceback import user_stacklevel
from .._validate import instance, integer, shorten
from ._atomic import atomic_path
from ._errors import (
    FileAccessError,
    FileMissingError,
    NonFiniteError,
    NonFiniteWarning,
    access_error,
    as_path,
    cut,
    format_error,
    too_large,
)
from ._nonfinite import allowed_nonfinite, names_text, nonfinite
from ._paths import existing_file

__all__ = ["MAX_ENTRIES", "read_safetensors", "write_safetensors"]

# The safetensors dtypes shapeml reads and writes (bfloat16 and float8 are ml_dtypes', via JAX).
_DTYPES = {
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
_STORED = set(_DTYPES.values())
_MAX_RANK = 64  # numpy's own limit on dimensions
# As many tensors as a model may hold (models/_limits.py counts fields with the same cap): a
# header listing more is refused before its entries are looked at.
MAX_ENTRIES = 2**17
_DEFAULT_FIX = "re-save it; if it was copied, check the copy finished"
# What the library's reasons for refusing a header mean, in a user's words (prefix -> words).
_REASONS = {
    "header too small": "it is too short to hold a header",
    "header too large": "its header claims more than the 100 MB a header may hold",
    "invalid header length": "its header claims more bytes than the file holds",
    "invalid UTF-8 in header": "its header is not UTF-8 text",
    "invalid JSON in header": "its header is not JSON of the safetensors format",
    "invalid shape, data type, or offset for tensor": (
        "a tensor's dtype and shape disagree with the number of bytes its data_offsets claim"
    ),
    "incomplete metadata, file not fully covered": (
        "its tensors do not end where the file ends (cut short, or a header claiming other sizes)"
    ),
    "overflow computing buffer size from shape and/or element type": (
        "a tensor's shape claims more bytes than any file holds"
    ),
}


def _reason(e: Exception) -> str:
    """The library's reason for refusing a file, in a user's words, with its detail cut short."""
    text = str(e).removeprefix("Error while deserializing header: ")
    for prefix, words in _REASONS.items():
        if text.startswith(prefix):
            detail = text[len(prefix) :].lstrip(": ")
            return f"{words} ({cut(detail)})" if detail else words
    if text.startswith("invalid offset for tensor "):  # the tensors must tile the body
        name = text.removeprefix("invalid offset for tensor ").strip("`")
        return f"tensor `{cut(name)}` overlaps the one before it or leaves a gap before it"
    return cut(text)


@typing.no_type_check  # validates its arguments itself, with coded errors
def write_safetensors(
    path: str | os.PathLike,
    arrays: Mapping[str, Any],
    metadata: Mapping[str, str],
    *,
    allow_nonfinite: bool | Collection[str] = False,
) -> Path:
    """Writes arrays (by name) and string metadata as one safetensors file, atomically.

    The library streams the tensors into the temp file (never one whole copy of the file in
    memory) in its own fixed order, so the same arrays always give the same bytes.

    Args:
        path: the file.
        arrays: name -> array (numpy or JAX) of a dtype safetensors stores.
        metadata: str -> str.
        allow_nonfinite: True to write NaN/inf anywhere, or the names that may hold them.

    Raises:
        NonFiniteError: (E1307) naming every tensor holding NaN or an infinity, unless allowed.
        ArgumentTypeError: (E0003) for a name or metadata that is not a str, or an unstored dtype.
        FolderMissingError: (E1305) / FileAccessError: (E1306) as `atomic_write`.
    """
    path = as_path(path)
    allowed = allowed_nonfinite(allow_nonfinite)
    instance("metadata", metadata, Mapping, "a map of str to str")
    for k, v in metadata.items():
        if not (isinstance(k, str) and isinstance(v, str)):
            raise ArgumentTypeError(
                f"metadata entry {shorten(k)}: {shorten(v)} is not str: str",
                fix="pass metadata as strings (json.dumps other values)",
            )
    prepared: dict[str, np.ndarray] = {}
    for name in sorted(instance("arrays", arrays, Mapping, "a map of name to array")):
        if not isinstance(name, str) or name == "__metadata__":
            raise ArgumentTypeError(
                f"tensor name {shorten(name)} cannot be stored", fix="name tensors by str"
            )
        try:
            a = np.asarray(arrays[name])
        except Exception as e:  # a tracer (a save inside jax.jit), an object that is no array
            raise ArgumentTypeError(
                f"tensor `{cut(name)}` cannot be read as an array ({type(e).__name__}): "
                f"{shorten(arrays[name])}",
                fix="save concrete arrays, outside jax.jit / jax.vmap",
            ) from None
        if a.dtype.newbyteorder("=") not in _STORED:
            raise ArgumentTypeError(
                f"tensor `{cut(name)}` has dtype {a.dtype}, which safetensors cannot store",
                fix="convert it to a float, int, uint or bool dtype",
            )
        # The format is little-endian and dense; the library reads each tensor from its pointer.
        prepared[name] = np.asarray(a, a.dtype.newbyteorder("<"), order="C")
    bad = nonfinite(prepared, allowed)
    if bad:
        raise NonFiniteError(
            f"refusing to write `{cut(path)}`: {names_text(bad)} hold NaN or infinite values",
            fix="train from the last good checkpoint with a lower learning rate or clipped "
            "gradients; to write them on purpose pass allow_nonfinite=True (or the names)",
        )
    specs = {
        name: TensorSpec(
            dtype=a.dtype.name, shape=a.shape, data_ptr=a.ctypes.data, data_len=a.nbytes
        )
        for name, a in prepared.items()
    }
    with atomic_path(path) as new:
        try:
            serialize_file(specs, new, metadata=dict(metadata) or None)
        except SafetensorError as e:  # the system refused a write (a full disk, a quota)
            detail = str(e).removeprefix("Error while serializing: ").split(" at path ")[0]
            raise FileAccessError(
                f"cannot write `{cut(path)}`: {shorten(detail)}",
                fix="check the path, its permissions and the free space of the disk",
            ) from None
    return path


@contextlib.contextmanager
def _opened(path: Path, size: int, fix: str) -> Iterator[Any]:
    """The file opened by the library, its header parsed and checked against the file's size."""
    try:
        f = safe_open(path, framework="np")
    except SafetensorError as e:
        raise format_error(path, size, fix, _reason(e)) from None
    except FileNotFoundError:  # the library reports every failure to open as a missing file
        try:
            open(path, "rb").close()
        except OSError as e:
            raise access_error(path, "read", e) from e
        raise FileMissingError(
            f"cannot read `{cut(path)}`: it vanished", fix="check the path"
        ) from None
    except OSError as e:
        raise access_error(path, "read", e) from e
    with f:
        yield f


class _Entry(NamedTuple):
    """A tensor the checked header declares."""

    dtype: np.dtype
    shape: tuple[int, ...]
    nbytes: int


def _checked(f: Any, path: Path, size: int, fix: str) -> dict[str, _Entry]:
    """Every tensor the header declares, by name in file order, after checking shapeml holds it."""
    names = f.offset_keys()
    if len(names) > MAX_ENTRIES:
        raise format_error(
            path, size, fix, f"its header lists {len(names):,} tensors, more than {MAX_ENTRIES:,}"
        )
    out = {}
    for name in names:
        view = f.get_slice(name)
        dtype, shape = view.get_dtype(), view.get_shape()
        if dtype not in _DTYPES:
            why = f"tensor `{cut(name)}` has dtype {dtype}, which shapeml does not read"
            raise format_error(path, size, fix, why)
        if len(shape) > _MAX_RANK:
            why = f"tensor `{cut(name)}` has {len(shape)} dims, more than numpy's {_MAX_RANK}"
            raise format_error(path, size, fix, why)
        out[name] = _Entry(_DTYPES[dtype], tuple(shape), _DTYPES[dtype].itemsize * math.prod(shape))
    return out


def _read_tensors(
    path: Path, size: int, fix: str, entries: Mapping[str, _Entry]
) -> dict[str, np.ndarray]:
    """The tensors, read one by one into arrays of the sizes the checked header claims.

    The library has checked that the tensors, in file order, tile the body after the 8-byte
    header length and the header exactly, so each one's bytes follow the last one's. (Its own
    numpy reader cannot build float8 arrays in safetensors 0.8, and zero-fills each buffer before
    reading into it: 2-3x the CPU time of reading straight into the array, as here.)
    """
    changed = "it changed while being read"
    arrays = {}
    with open(path, "rb") as f:
        start = 8 + int.from_bytes(f.read(8), "little")
        if (
            start + sum(e.nbytes for e in entries.values()) != size
            or os.fstat(f.fileno()).st_size != size
        ):
            raise format_error(path, size, fix, changed)  # replaced since the library read it
        f.seek(start)
        for name, e in entries.items():
            buf = np.empty(e.nbytes, np.uint8)
            view, got = memoryview(buf), 0
            while got < buf.size:
                step = f.readinto(view[got:])
                if not step:
                    raise format_error(path, size, fix, changed)
                got += step
            arrays[name] = buf.view(e.dtype).reshape(e.shape)
    return arrays


@typing.no_type_check  # validates its arguments itself, with coded errors
def read_safetensors(
    path: str | os.PathLike,
    *,
    fix: str = _DEFAULT_FIX,
    max_bytes: int | None = None,
    allow_nonfinite: bool | Collection[str] = False,
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Reads a safetensors file: `(arrays by name, metadata)`; the arrays are read-only numpy.

    The library checks the header whole against the file's size before any tensor is read, and
    the tensors are read one by one into arrays of the size the header proved the file holds.

    Args:
        path: the file.
        fix: how to fix a bad file, in the caller's terms (e.g. "re-save it with sm.save").
        max_bytes: refuse (E1308) a file whose tensors hold more bytes, before reading them.
        allow_nonfinite: True (or the names) to read NaN/inf without warning W1301.

    Raises:
        FileMissingError: (E1304) if there is no such file.
        FileAccessError: (E1306) if it cannot be read.
        FileFormatError: (E1302) if it is not a valid safetensors file.
        FileTooLargeError: (E1308) if its tensors hold more than `max_bytes`.

    Warns:
        NonFiniteWarning: (W1301) naming the tensors holding NaN or an infinity.
    """
    path = as_path(path)
    allowed = allowed_nonfinite(allow_nonfinite)
    if max_bytes is not None:
        max_bytes = integer("max_bytes", max_bytes, low=0)
    size = existing_file(path)
    try:
        with _opened(path, size, fix) as f:
            metadata = f.metadata() or {}
            entries = _checked(f, path, size, fix)
        body = sum(e.nbytes for e in entries.values())
        if max_bytes is not None and body > max_bytes:
            raise too_large(path, body, max_bytes)
        arrays = _read_tensors(path, size, fix, entries)
    except OSError as e:
        if isinstance(e, ShapemlError):
            raise
        raise access_error(path, "read", e) from e
    for a in arrays.values():
        a.flags.writeable = False
    if names := nonfinite(arrays, allowed):
        warnings.warn(
            NonFiniteWarning(
                f"`{cut(path)}`: {names_text(names)} hold NaN or infinite values",
                fix="load an earlier checkpoint, or pass allow_nonfinite=True if they are meant "
                "to be there",
            ),
            stacklevel=user_stacklevel(),
        )
    return arrays, metadata
