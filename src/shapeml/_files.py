"""The one file layer: every file shapeml writes or reads goes through here.

`atomic_write` writes bytes atomically (a temp file in the same folder, fsync, rename, fsync the
folder), so a crash mid-write leaves any old file intact and no temp file behind.
`write_safetensors` / `read_safetensors` are the one safetensors writer and reader, used by model
checkpoints, optimizer checkpoints, exported artifacts and int8 models. The reader checks the file's
size and header before it reads any tensor, so a corrupt file never allocates what it claims.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import safetensors
import safetensors.numpy

from ._errors import ShapemlError

__all__ = [
    "FileFormatError",
    "FileMissingError",
    "FolderMissingError",
    "atomic_write",
    "read_safetensors",
    "read_text",
    "write_safetensors",
]


class FileFormatError(
    ShapemlError,
    ValueError,
    code="E1302",
    title="not a readable checkpoint",
    explanation="""
The file is not a valid safetensors file: it is truncated, corrupted, empty, or in another
format (a pickle, a zip, text). shapeml never unpickles files. Nothing was changed.

Re-save it (`sm.save(path, m)`, `sm.save_checkpoint(...)`, `sm.export(...)`); if the file was
copied, check that the copy finished.
""",
):
    pass


class FileMissingError(
    ShapemlError,
    FileNotFoundError,
    code="E1304",
    title="checkpoint file not found",
    explanation="""
The path given to a loader (`sm.load`, `sm.load_checkpoint`, `sm.load_exported`) does not exist or
is not a file. Check the path, and that the save that should have written it ran.
""",
):
    pass


class FolderMissingError(
    ShapemlError,
    FileNotFoundError,
    code="E1305",
    title="the folder to save into does not exist",
    explanation="""
A save was asked to write a file into a folder that does not exist. shapeml does not create
folders implicitly, so a typo in a path cannot scatter files: create it first
(`Path(folder).mkdir(parents=True, exist_ok=True)`) or fix the path.
""",
):
    pass


# safetensors dtype names -> numpy dtypes (bfloat16 and float8 come from ml_dtypes, via JAX).
_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": jnp.bfloat16,
    "F8_E4M3": jnp.float8_e4m3fn,
    "F8_E5M2": jnp.float8_e5m2,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U64": np.uint64,
    "U32": np.uint32,
    "U16": np.uint16,
    "U8": np.uint8,
    "BOOL": np.bool_,
}
# A safetensors header is JSON naming each tensor; a larger one is a corrupt or hostile file.
_MAX_HEADER = 100 * 2**20


def atomic_write(path: str | os.PathLike, data: bytes) -> Path:
    """Writes `data` to `path` atomically; the file is readable by others (mode 0644).

    Raises:
        FolderMissingError: (E1305) if the folder of `path` does not exist.
    """
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise FolderMissingError(
            f"cannot save `{path}`: the folder `{folder}` does not exist",
            fix=f"create it first: Path({str(folder)!r}).mkdir(parents=True)",
        )
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; saved files are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def write_safetensors(
    path: str | os.PathLike, arrays: Mapping[str, Any], metadata: Mapping[str, str]
) -> Path:
    """Writes arrays (by name) and string metadata as one safetensors file, atomically.

    Raises:
        FolderMissingError: (E1305) if the folder of `path` does not exist.
    """
    data = safetensors.numpy.save(
        {k: np.asarray(v, order="C") for k, v in arrays.items()}, metadata=dict(metadata)
    )
    return atomic_write(path, data)


def _existing_file(path: Path) -> int:
    """The size of the file at `path`; E1304 when there is none."""
    if not path.is_file():
        why = "it is a folder" if path.is_dir() else "there is no such file"
        raise FileMissingError(f"cannot read `{path}`: {why}", fix="check the path")
    return path.stat().st_size


def read_text(path: str | os.PathLike, *, fix: str = "re-save it") -> str:
    """Reads a UTF-8 text file (e.g. an int8 model's JSON).

    Raises:
        FileMissingError: (E1304) if there is no such file.
        FileFormatError: (E1302) if it is not UTF-8 text.
    """
    path = Path(path)
    size = _existing_file(path)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise FileFormatError(
            f"`{path}` is not UTF-8 text ({size} bytes; byte {e.start} is {e.object[e.start]:#x})",
            fix=fix,
        ) from None


def read_safetensors(
    path: str | os.PathLike, *, fix: str = "re-save it; if it was copied, check the copy finished"
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Reads a safetensors file: `(arrays by name, metadata)`; the arrays are read-only numpy.

    Args:
        path: the file.
        fix: how to fix a bad file, in the caller's terms (e.g. "re-save it with sm.save").

    Raises:
        FileMissingError: (E1304) if there is no such file.
        FileFormatError: (E1302) if it is not a valid safetensors file.
    """
    path = Path(path)
    size = _existing_file(path)

    def bad(why: str) -> FileFormatError:
        return FileFormatError(
            f"`{path}` is not a valid safetensors checkpoint: {why} ({size} bytes)", fix=fix
        )

    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise bad("it is too short to hold a header")
        (n,) = struct.unpack("<Q", head)
        if n == 0 or n > size - 8 or n > _MAX_HEADER:
            raise bad(f"its header claims {n} bytes, which the file cannot hold")
        f.seek(0)
        raw = f.read()
    try:
        header = json.loads(raw[8 : 8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise bad("its header is not JSON") from None
    if not isinstance(header, dict):
        raise bad("its header is not a JSON object")
    metadata = header.get("__metadata__") or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise bad("its metadata is not a map of strings")
    try:
        entries = safetensors.deserialize(raw)  # validated by safetensors itself
    except Exception as e:  # safetensors reports corruption with several exception types
        raise bad(str(e).strip() or type(e).__name__) from None
    arrays = {}
    for name, entry in entries:
        if entry["dtype"] not in _DTYPES:
            raise bad(f"entry `{name}` has dtype {entry['dtype']}, which shapeml does not read")
        dtype = np.dtype(_DTYPES[entry["dtype"]])
        arrays[name] = np.frombuffer(entry["data"], dtype).reshape(entry["shape"])
    return arrays, dict(metadata)
