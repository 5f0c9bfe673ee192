"""Atomic writes: a file appears whole at its path or not at all, and a failed write leaves any old
file there intact and no temp behind.

The new file is written inside a recognizable temp folder next to the target (`_temps`), synced to
disk, made readable by others (0644), renamed over the target, and the folder is synced so the
rename survives a power cut. The next write into the folder removes what a killed write left.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from .._errors import ArgumentTypeError, ShapemlError
from .._validate import shorten
from ._errors import access_error, as_path
from ._paths import check_writable
from ._temps import SUFFIX, remove_stale, temp_prefix, track

__all__ = ["atomic_path", "atomic_write"]


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """The path to write the new file at, inside a temp folder of its own; when the block ends
    without an error, that file replaces `path` atomically (a missing file writes nothing).

    Raises:
        FolderMissingError: (E1305) if the folder of `path` does not exist.
        FileAccessError: (E1306) if the system refuses the write (permissions, `path` is a folder,
            a full disk); any old file at `path` is left intact, and no temp.
    """
    path = check_writable(path)
    remove_stale(path)
    try:
        temp = Path(tempfile.mkdtemp(prefix=temp_prefix(path), suffix=SUFFIX, dir=path.parent))
    except OSError as e:
        raise access_error(path, "write a temp folder next to", e) from e
    track(str(temp), True)
    new = temp / path.name
    try:
        yield new
        fd = os.open(new, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(new, 0o644)  # temps are private (0600); saved files are meant to be shared
        os.replace(new, path)
    except BaseException as e:
        if isinstance(e, OSError) and not isinstance(e, ShapemlError):
            raise access_error(path, "write", e) from e
        raise
    finally:
        with contextlib.suppress(OSError):  # what a failed write left: the file, a writer's temp
            for entry in os.listdir(temp):
                (temp / entry).unlink()
            temp.rmdir()
        track(str(temp), False)
    # The new file is in place: syncing the folder makes the rename durable, and a folder that
    # cannot be synced (some filesystems) must not report the finished save as failed.
    with contextlib.suppress(OSError):
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


@typing.no_type_check  # validates its arguments itself, with coded errors
def atomic_write(path: str | os.PathLike, data: bytes | Callable[[BinaryIO], None]) -> Path:
    """Writes `data` (bytes, or a function writing into a binary file) to `path` atomically.

    The file is readable by others (mode 0644). Temps earlier crashed writes to `path` left behind
    are removed first.

    Raises:
        FolderMissingError: (E1305) if the folder of `path` does not exist.
        FileAccessError: (E1306) if the system refuses the write (permissions, `path` is a folder,
            a full disk); any old file at `path` is left intact, and no temp.
    """
    path = as_path(path)
    if not (callable(data) or isinstance(data, (bytes, bytearray, memoryview))):
        raise ArgumentTypeError(
            f"atomic_write takes bytes or a function writing into a file, got {shorten(data)}",
            fix="encode text first: atomic_write(path, text.encode())",
        )
    with atomic_path(path) as new, open(new, "wb") as f:
        if callable(data):
            data(f)
        else:
            f.write(data)
    return path
