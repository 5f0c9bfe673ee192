"""The file layer's errors and warnings, and the spelling of a path in them.

Every reader and writer of `shapeml._io` raises these; every message names its path, cut to a
readable length.
"""

from __future__ import annotations

import os
import typing
from pathlib import Path
from typing import Any

from .._errors import ArgumentError, ShapemlError, ShapemlWarning
from .._validate import instance, shorten

__all__ = [
    "FileAccessError",
    "FileFormatError",
    "FileMissingError",
    "FileTooLargeError",
    "FolderMissingError",
    "NonFiniteError",
    "NonFiniteWarning",
    "access_error",
    "as_path",
    "cut",
    "format_error",
    "too_large",
]


class FileFormatError(
    ShapemlError,
    ValueError,
    code="E1302",
    title="not a readable checkpoint",
    explanation="""
The file is not a valid safetensors file: it is truncated, corrupted, empty, or in another
format (a pickle, a zip, text), or its header or shapeml metadata is malformed (a dtype or shape
that disagrees with the bytes it claims, tensors that overlap, dims that are not a JSON map of
whole numbers). shapeml never unpickles files. Nothing was changed.

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


class FileAccessError(
    ShapemlError,
    OSError,
    code="E1306",
    title="the file cannot be read or written",
    explanation="""
The operating system refused to read or write the file: no permission, the target of a save is a
folder, the disk is full, the name is too long. The message gives the path and the system's
reason. A failed save leaves any old file at the path intact and no temp file behind.

Check the path and its permissions (`ls -l`), and the free space of the disk.
""",
):
    pass


class NonFiniteError(
    ShapemlError,
    ValueError,
    code="E1307",
    title="refusing to write NaN or infinite values",
    explanation="""
A save (`sm.save`, `sm.save_checkpoint`, `sm.export`) was given tensors holding NaN or an
infinity. A model with such weights is almost always the result of a diverged run, and saving it
would silently replace a good file with a broken one, so nothing was written; the message names
the tensors.

Lower the learning rate or clip the gradients and train again from the last good checkpoint. To
write such values on purpose (a mask of -inf), pass `allow_nonfinite=True`, or the names of the
tensors that may hold them: `sm.save(path, m, allow_nonfinite=("mask",))`.
""",
):
    pass


class FileTooLargeError(
    ShapemlError,
    ValueError,
    code="E1308",
    title="file larger than the limit",
    explanation="""
A loader found, from the file's header and before reading its tensors, that they hold more bytes
than the loader's limit (`max_bytes`). Nothing was read. If the file is what you expect, pass a
larger limit: `sm.load(path, Cls, max_bytes=64 * 2**30)`.
""",
):
    pass


class NonFiniteWarning(
    ShapemlWarning,
    code="W1301",
    title="loaded tensors hold NaN or infinite values",
    explanation="""
A file that was read holds NaN or infinite values in the tensors the warning names: it was saved
from a diverged run (with `allow_nonfinite=True`) or written by another tool. Computing with it
gives NaN. Load an earlier checkpoint, or pass `allow_nonfinite=True` to the loader when the values
are meant to be there.
""",
):
    pass


@typing.no_type_check  # validates its arguments itself, with coded errors
def as_path(path: Any, name: str = "path") -> Path:
    """`path` as a `Path`, after checking it is a str or os.PathLike without a NUL byte."""
    instance(name, path, (str, os.PathLike), "a file path (a str or a pathlib.Path)")
    text = os.fspath(path)
    if not isinstance(text, str) or "\x00" in text:
        raise ArgumentError(
            f"`{name}` is {shorten(text)}, which is not a usable file path",
            fix="pass a str or pathlib.Path without NUL bytes",
        )
    return Path(text)


def cut(text: Any) -> str:
    """A path or name for a message, its middle cut when it is very long."""
    text = str(text)
    return text if len(text) <= 200 else f"{text[:120]}...{text[-60:]}"


def access_error(path: Path, doing: str, e: OSError) -> FileAccessError:
    return FileAccessError(
        f"cannot {doing} `{cut(path)}`: {e.strerror or e}",
        fix="check the path, its permissions and the free space of the disk",
    )


def too_large(path: Path, size: int, max_bytes: int) -> FileTooLargeError:
    return FileTooLargeError(
        f"`{cut(path)}` holds {size:,} bytes, more than max_bytes={max_bytes:,}",
        fix=f"if the file is what you expect, pass a larger limit: max_bytes={size}",
    )


def format_error(path: Path, size: int, fix: str, why: str) -> FileFormatError:
    return FileFormatError(
        f"`{cut(path)}` is not a valid safetensors checkpoint: {why} ({size} bytes)", fix=fix
    )
