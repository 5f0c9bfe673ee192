"""The one file layer: every file shapeml writes or reads goes through here.

`atomic_write` writes atomically (a recognizable temp file in the same folder, fsync, rename, fsync
the folder), so a crash mid-write leaves any old file intact, and the next write to the same place
removes the temp the crash left (`shapeml._temp_files`). `write_safetensors` / `read_safetensors`
are the one safetensors writer and reader, used by model checkpoints, optimizer checkpoints,
exported artifacts and int8 models. The writer refuses NaN and infinities unless asked; the reader
checks the whole header against the file's real size before it reads a tensor byte, reads tensor by
tensor, and warns (W1301) about non-finite values.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import typing
import warnings
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ._errors import ArgumentTypeError, ShapemlError
from ._file_errors import (
    FileAccessError,
    FileFormatError,
    FileMissingError,
    FileTooLargeError,
    FolderMissingError,
    NonFiniteError,
    NonFiniteWarning,
    access_error,
    as_path,
    cut,
    format_error,
    too_large,
)
from ._file_paths import check_writable
from ._safetensors_format import (
    HeaderError,
    allowed_nonfinite,
    dtype_name,
    encode_header,
    names_text,
    nonfinite,
)
from ._safetensors_format import parse_header as _parse_header
from ._temp_files import SUFFIX, remove_stale, temp_prefix, track
from ._validate import instance, integer, shorten

__all__ = [
    "FileAccessError",
    "FileFormatError",
    "FileMissingError",
    "FileTooLargeError",
    "FolderMissingError",
    "NonFiniteError",
    "NonFiniteWarning",
    "as_path",
    "atomic_write",
    "read_safetensors",
    "read_text",
    "write_safetensors",
]


# A header is JSON naming each tensor; a larger one is a corrupt or hostile file.
_MAX_HEADER = 100 * 2**20


@typing.no_type_check  # validates its arguments itself, with coded errors
def atomic_write(path: str | os.PathLike, data: bytes | Callable[[BinaryIO], None]) -> Path:
    """Writes `data` (bytes, or a function writing into a binary file) to `path` atomically.

    The file is readable by others (mode 0644). Temps earlier crashed writes to `path` left behind
    are removed first.

    Raises:
        FolderMissingError: (E1305) if the folder of `path` does not exist.
        FileAccessError: (E1306) if the system refuses the write (permissions, `path` is a folder,
            a full disk); any old file at `path` is left intact, and no temp file.
    """
    path = as_path(path)
    if not (callable(data) or isinstance(data, (bytes, bytearray, memoryview))):
        raise ArgumentTypeError(
            f"atomic_write takes bytes or a function writing into a file, got {shorten(data)}",
            fix="encode text first: atomic_write(path, text.encode())",
        )
    check_writable(path)
    folder = path.parent
    remove_stale(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=SUFFIX, dir=folder)
    except OSError as e:
        raise access_error(path, "write a temp file next to", e) from e
    track(tmp, True)
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; saved files are meant to be shared
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and not isinstance(e, ShapemlError):
            raise access_error(path, "write", e) from e
        raise
    finally:
        track(tmp, False)
    # The new file is in place: syncing the folder makes the rename durable, and a folder that
    # cannot be synced (some filesystems) must not report the finished save as failed.
    with contextlib.suppress(OSError):
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return path


@typing.no_type_check  # validates its arguments itself, with coded errors
def write_safetensors(
    path: str | os.PathLike,
    arrays: Mapping[str, Any],
    metadata: Mapping[str, str],
    *,
    allow_nonfinite: bool | Collection[str] = False,
) -> Path:
    """Writes arrays (by name) and string metadata as one safetensors file, atomically.

    Tensors are written one by one into the temp file (never one whole copy of the file in
    memory), sorted by name, so the same arrays always give the same bytes.

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
        if dtype_name(a.dtype) is None:
            raise ArgumentTypeError(
                f"tensor `{cut(name)}` has dtype {a.dtype}, which safetensors cannot store",
                fix="convert it to a float, int, uint or bool dtype",
            )
        prepared[name] = np.asarray(a, a.dtype.newbyteorder("<"), order="C")
    bad = nonfinite(prepared, allowed)
    if bad:
        raise NonFiniteError(
            f"refusing to write `{cut(path)}`: {names_text(bad)} hold NaN or infinite values",
            fix="train from the last good checkpoint with a lower learning rate or clipped "
            "gradients; to write them on purpose pass allow_nonfinite=True (or the names)",
        )
    header = encode_header(prepared, metadata)

    def write(f: BinaryIO) -> None:
        f.write(header)
        for a in prepared.values():
            f.write(a.reshape(-1).view(np.uint8).data)

    return atomic_write(path, write)


def _existing_file(path: Path) -> int:
    """The size of the file at `path`; E1304 when there is none, E1306 when it cannot be read."""
    try:
        if path.is_file():
            return path.stat().st_size
        exists = path.exists()
    except OSError as e:
        raise access_error(path, "read", e) from e
    why = "it is a folder" if path.is_dir() else "it is not a regular file"
    raise FileMissingError(
        f"cannot read `{cut(path)}`: {why if exists else 'there is no such file'}",
        fix="check the path",
    )


def _open(path: Path) -> BinaryIO:
    try:
        return open(path, "rb")
    except OSError as e:
        raise access_error(path, "read", e) from e


@typing.no_type_check  # validates its arguments itself, with coded errors
def read_text(
    path: str | os.PathLike, *, fix: str = "re-save it", max_bytes: int | None = None
) -> str:
    """Reads a UTF-8 text file (e.g. an int8 model's JSON).

    Args:
        max_bytes: refuse (E1308) a file larger than this, before reading it.

    Raises:
        FileMissingError: (E1304) if there is no such file.
        FileAccessError: (E1306) if it cannot be read.
        FileTooLargeError: (E1308) if it is larger than `max_bytes`.
        FileFormatError: (E1302) if it is not UTF-8 text.
    """
    path = as_path(path)
    size = _existing_file(path)
    if max_bytes is not None and size > integer("max_bytes", max_bytes, low=0):
        raise too_large(path, size, max_bytes)
    with _open(path) as f:
        try:
            raw = f.read()
        except OSError as e:
            raise access_error(path, "read", e) from e
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileFormatError(
            f"`{cut(path)}` is not UTF-8 text ({size} bytes; byte {e.start} is {raw[e.start]:#x})",
            fix=fix,
        ) from None


@typing.no_type_check  # validates its arguments itself, with coded errors
def read_safetensors(
    path: str | os.PathLike,
    *,
    fix: str = "re-save it; if it was copied, check the copy finished",
    max_bytes: int | None = None,
    allow_nonfinite: bool | Collection[str] = False,
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Reads a safetensors file: `(arrays by name, metadata)`; the arrays are read-only numpy.

    The header is checked whole against the file's size before any tensor is read, and the
    tensors are read one by one into arrays of the size the header proved the file holds.

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
    size = _existing_file(path)

    with _open(path) as f:
        try:
            head = f.read(8)
            if len(head) < 8:
                raise format_error(path, size, fix, "it is too short to hold a header")
            n = int.from_bytes(head, "little")
            if n == 0 or n > size - 8 or n > _MAX_HEADER:
                raise format_error(
                    path, size, fix, f"its header claims {n} bytes, which the file cannot hold"
                )
            raw = f.read(n)
            if len(raw) < n:
                raise format_error(path, size, fix, "it ended early (it changed while being read)")
            try:
                entries, metadata = _parse_header(raw, size - 8 - n)
            except HeaderError as e:
                raise format_error(path, size, fix, str(e)) from None
            if max_bytes is not None and size - 8 - n > max_bytes:
                raise too_large(path, size - 8 - n, max_bytes)
            arrays = {e.name: _read_exactly(f, e.end - e.begin) for e in entries}
            if any(a is None for a in arrays.values()):
                raise format_error(path, size, fix, "it ended early (it changed while being read)")
        except OSError as e:
            raise access_error(path, "read", e) from e
    for e in entries:
        arrays[e.name] = arrays[e.name].view(e.dtype).reshape(e.shape)
        arrays[e.name].flags.writeable = False
    if names := nonfinite(arrays, allowed):
        warnings.warn(
            NonFiniteWarning(
                f"`{cut(path)}`: {names_text(names)} hold NaN or infinite values",
                fix="load an earlier checkpoint, or pass allow_nonfinite=True if they are meant "
                "to be there",
            ),
            stacklevel=3,
        )
    return arrays, metadata


def _read_exactly(f: BinaryIO, count: int) -> np.ndarray | None:
    """The next `count` bytes of `f` as a uint8 array; None if the file ends first."""
    buf = np.empty(count, np.uint8)
    view, got = memoryview(buf), 0
    while got < count:
        step = f.readinto(view[got:])
        if not step:
            return None
        got += step
    return buf
