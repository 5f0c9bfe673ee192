"""Atomic file writes: a temp file in the same folder, fsync, rename, fsync the folder.

Every file shapeml writes (checkpoints, exported artifacts, int8 model files) goes through here, so
a crash mid-write leaves any old file intact and no temp file behind.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ._errors import ShapemlError

__all__ = ["FolderMissingError", "atomic_write"]


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
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; saved models are meant to be shared
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
