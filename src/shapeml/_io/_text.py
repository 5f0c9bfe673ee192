"""Reading a UTF-8 text file (a JSON config, an int8 model) with the file layer's coded errors."""

from __future__ import annotations

import os
import typing

from .._validate import integer
from ._errors import FileFormatError, access_error, as_path, cut, too_large
from ._paths import existing_file

__all__ = ["read_text"]


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
    size = existing_file(path)
    if max_bytes is not None and size > integer("max_bytes", max_bytes, low=0):
        raise too_large(path, size, max_bytes)
    try:
        with open(path, "rb") as f:
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
