"""The checks of a path before a file is read or written: `existing_file` before a read, and
`check_writable`, which `atomic_write` makes before writing and every job makes for each of its
outputs before any work, so a typo in a path never costs a training run."""

from __future__ import annotations

import os
import typing
from pathlib import Path

from ._errors import (
    FileAccessError,
    FileMissingError,
    FolderMissingError,
    access_error,
    as_path,
    cut,
)

__all__ = ["check_writable", "existing_file", "same_file", "unwritable"]


def unwritable(path: Path) -> tuple[bool, str] | None:
    """Why a file cannot be saved at `path` (`(folder_missing, what is wrong)`), or None when it
    can: its folder must exist and be a writable folder, and `path` must not be a folder."""
    folder = path.parent
    try:
        if folder.is_dir():
            if path.is_dir():
                return False, "is a folder"
            if not os.access(folder, os.W_OK | os.X_OK):
                return False, f"is in the folder `{cut(folder)}`, which is not writable"
            return None
        if folder.exists():
            return False, f"is in `{cut(folder)}`, which is a file, not a folder"
    except OSError as e:  # a name too long, a loop of links
        return False, f"cannot be looked up ({e.strerror or e})"
    return True, f"is in the folder `{cut(folder)}`, which does not exist"


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths name the same file (after resolving `.`, `..` and links)."""
    try:
        return Path(a).resolve() == Path(b).resolve()
    except (OSError, RuntimeError):  # a loop of links: compare the spellings
        return os.path.abspath(a) == os.path.abspath(b)


@typing.no_type_check  # validates its arguments itself, with coded errors
def check_writable(path: str | os.PathLike) -> Path:
    """Checks that a file can be saved at `path`, as `atomic_write` will need: its folder exists
    and is a writable folder, and `path` is not itself a folder. Jobs call it for every output
    before any work, so a typo in a path never costs a training run.

    Returns:
        `path` as a `Path`.

    Raises:
        ArgumentTypeError: (E0003) if `path` is not a str or `os.PathLike`.
        FolderMissingError: (E1305) if the folder of `path` does not exist.
        FileAccessError: (E1306) if `path` is a folder, its folder is a file or is not writable,
            or the system refuses to look (a name too long, a loop of links).
    """
    path = as_path(path)
    problem = unwritable(path)
    if problem is not None:
        missing, what = problem
        if missing:
            raise FolderMissingError(
                f"cannot save `{cut(path)}`: it {what}",
                fix=f"create it first: Path({cut(path.parent)!r}).mkdir(parents=True)",
            )
        raise FileAccessError(
            f"cannot save `{cut(path)}`: it {what}",
            fix="give the path of a file inside a folder you can write to",
        )
    return path


def existing_file(path: Path) -> int:
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
