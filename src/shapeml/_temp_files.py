"""Temp files of atomic writes: recognizable names, and the cleanup of those a crash left behind.

A save to `run/m.safetensors` writes `run/.m.safetensors.<host>-<pid>.<random>.shapeml-tmp`, then
renames it over the target. A process killed between the two leaves its temp behind; the next save
to the same target removes every temp of that target whose writer (same host, that pid) is no
longer running. Temps of a live writer, or written from another host on a shared folder, are left
alone, so two processes saving side by side never delete each other's work.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import time
from pathlib import Path

__all__ = ["SUFFIX", "remove_stale", "temp_prefix", "track"]

SUFFIX = ".shapeml-tmp"
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]
_TAIL = re.compile(r"([0-9a-f]{6})-(\d+)\.[a-z0-9_]{8}")
# Temps of this process's writes in flight: its own pid is alive, but these must stay.
_IN_FLIGHT: set[str] = set()
# Before the recognizable names, temps were `.<name>.<random>.tmp`; one this old is abandoned.
_LEGACY_AGE_S = 3600


def _stem(name: str) -> str:
    # Folder entries are limited to 255 bytes: a long target name is cut, with a hash to keep it
    # unique, so the temp's name always fits.
    if len(name.encode()) <= 150:
        return name
    cut = name.encode()[:100].decode("utf-8", "ignore")  # bytes, not characters, are limited
    return cut + "~" + hashlib.sha256(name.encode()).hexdigest()[:16]


def temp_prefix(path: Path) -> str:
    """The `prefix` to give `tempfile.mkstemp` (with `suffix=SUFFIX`) for a write to `path`."""
    return f".{_stem(path.name)}.{_HOST}-{os.getpid()}."


def track(tmp: str, writing: bool) -> None:
    """Marks a temp of this process as being written (or no longer)."""
    key = os.path.abspath(tmp)  # mkstemp's name may be absolute where the target's is relative
    if writing:
        _IN_FLIGHT.add(key)
    else:
        _IN_FLIGHT.discard(key)


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's process, or no pid: keep its temp
        return True
    return True


def _stale(entry: str, stem: str, legacy: re.Pattern[str], folder: Path) -> bool:
    if entry.startswith(f".{stem}.") and entry.endswith(SUFFIX):
        tail = _TAIL.fullmatch(entry[len(stem) + 2 : -len(SUFFIX)])
        if tail is None or tail[1] != _HOST:
            return False
        if int(tail[2]) == os.getpid():
            return os.path.abspath(folder / entry) not in _IN_FLIGHT
        return not _running(int(tail[2]))
    if legacy.fullmatch(entry):
        try:
            return time.time() - (folder / entry).stat().st_mtime > _LEGACY_AGE_S
        except OSError:
            return False
    return False


def remove_stale(path: Path) -> list[str]:
    """Removes the temps earlier crashed writes to `path` left in its folder; their names.

    Best effort: a temp that cannot be removed (permissions, a race with another cleanup) is
    skipped, since it never stops the write it precedes.
    """
    folder = path.parent
    stem = _stem(path.name)
    legacy = re.compile(rf"\.{re.escape(path.name)}\.[a-z0-9_]{{8}}\.tmp")
    removed = []
    try:
        entries = os.listdir(folder)
    except OSError:
        return removed
    for entry in entries:
        if _stale(entry, stem, legacy, folder):
            try:
                (folder / entry).unlink()
                removed.append(entry)
            except OSError:
                pass
    return removed
