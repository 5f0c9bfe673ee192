"""Temps of atomic writes: recognizable names, and the cleanup of those a crash left behind.

A save to `run/m.safetensors` writes into the temp folder
`run/.m.safetensors.<host>-<pid>.<random>.shapeml-tmp/` (the safetensors library makes a temp of
its own beside the file it is given, so the file is given a folder of ours to make it in), then
renames the finished file over the target and removes the folder. A process killed in between
(`kill -9`, an out-of-memory kill, a power cut) leaves its temp behind. Every later save into the
same folder removes the temps there that are provably abandoned, and only those:

- the name matches this pattern exactly (nothing else in the folder is touched);
- and either its writer is provably gone: written from this host by a pid that no longer runs,
  that is a zombie (killed, not yet reaped by its parent), or that belongs to a process started
  after the temp was last written (the pid was reused);
- or it was last written more than `STALE_AGE_S` ago, from any host: a running save writes its
  temp from start to finish without pausing, so one untouched that long is no running save's.

Temps of this process's saves in flight are never removed, nor those of a live writer on this host
that are younger than `STALE_AGE_S`, nor young temps written from another host on a shared folder:
two processes saving side by side never delete each other's work.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import time
from pathlib import Path
from stat import S_ISDIR

__all__ = ["STALE_AGE_S", "SUFFIX", "remove_stale", "temp_prefix", "track"]

SUFFIX = ".shapeml-tmp"
STALE_AGE_S = 3600  # an hour without a write: no running save's temp (see the module docstring)
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]
# `.<stem>.<host>-<pid>.<random>.shapeml-tmp`: the stem may hold dots, the rest never does.
_NAME = re.compile(r"\.(.+)\.([0-9a-f]{6})-(\d+)\.[a-z0-9_]{8}" + re.escape(SUFFIX))
# Temps of this process's writes in flight: its own pid is alive, but these must stay.
_IN_FLIGHT: set[str] = set()
# The clock's granularity and the boot time's rounding (whole seconds) when comparing a process's
# start with a file's time.
_SLACK_S = 2.0


def _stem(name: str) -> str:
    # Folder entries are limited to 255 bytes: a long target name is cut, with a hash to keep it
    # unique, so the temp's name always fits.
    if len(name.encode()) <= 150:
        return name
    cut = name.encode()[:100].decode("utf-8", "ignore")  # bytes, not characters, are limited
    return cut + "~" + hashlib.sha256(name.encode()).hexdigest()[:16]


def temp_prefix(path: Path) -> str:
    """The `prefix` to give `tempfile.mkdtemp` (with `suffix=SUFFIX`) for a write to `path`."""
    return f".{_stem(path.name)}.{_HOST}-{os.getpid()}."


def track(tmp: str, writing: bool) -> None:
    """Marks a temp of this process as being written (or no longer)."""
    key = os.path.abspath(tmp)  # mkdtemp's name may be absolute where the target's is relative
    if writing:
        _IN_FLIGHT.add(key)
    else:
        _IN_FLIGHT.discard(key)


def _boot_time() -> float | None:
    try:
        with open("/proc/stat") as f:
            return next(float(line.split()[1]) for line in f if line.startswith("btime "))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def _process(pid: int) -> tuple[str, float | None] | None:
    """`(state, start time in seconds since the epoch)` of a process from Linux's /proc, or None
    where /proc cannot say (another system, a pid namespace that hides it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # the command name may hold spaces and parens
    boot = _boot_time()
    try:
        start = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK") if boot is not None else None
        return fields[0], start
    except (IndexError, ValueError, OSError):
        return (fields[0], None) if fields else None


def _writer_gone(pid: int, written: float) -> bool:
    """Whether the process `pid` of this host, which last wrote a temp at `written`, is provably
    no longer running: no such pid, a zombie, or a process started after that write."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # no such pid (or none a system could have)
        return True
    except PermissionError:  # another user's process: /proc may still say it is a zombie
        pass
    proc = _process(pid)
    if proc is None:
        return False
    state, start = proc
    return state in ("Z", "X") or (start is not None and start > written + _SLACK_S)


def _last_written(full: Path) -> float:
    """When a temp (a file, or a folder and the files in it) was last written."""
    stat = full.lstat()
    if not S_ISDIR(stat.st_mode):
        return stat.st_mtime
    return max([stat.st_mtime] + [(full / e).lstat().st_mtime for e in os.listdir(full)])


def _remove(full: Path) -> None:
    """Removes a temp file, or a temp folder with the files in it (never a link's target)."""
    if not S_ISDIR(full.lstat().st_mode):
        full.unlink()
        return
    for entry in os.listdir(full):
        (full / entry).unlink()
    full.rmdir()


def _stale(folder: Path, entry: str, legacy: re.Pattern[str], now: float) -> bool:
    match = _NAME.fullmatch(entry)
    if match is None and not legacy.fullmatch(entry):
        return False
    full = folder / entry
    if os.path.abspath(full) in _IN_FLIGHT:
        return False
    try:
        written = _last_written(full)
    except OSError:  # removed meanwhile (another cleanup, the writer's own rename)
        return False
    if now - written > STALE_AGE_S:
        return True
    if match is None or match[2] != _HOST:  # a young legacy temp, or another host's
        return False
    pid = int(match[3])
    return pid == os.getpid() or _writer_gone(pid, written)


def remove_stale(path: Path) -> list[str]:
    """Removes the temps crashed writes left in the folder of `path` (any target's); their names.

    Best effort: a temp that cannot be removed (permissions, a race with another cleanup) is
    skipped, since it never stops the write it precedes.
    """
    folder = path.parent
    # Before the recognizable names, temps were `.<name>.<random>.tmp`: only the target's own.
    legacy = re.compile(rf"\.{re.escape(path.name)}\.[a-z0-9_]{{8}}\.tmp")
    removed = []
    try:
        entries = os.listdir(folder)
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        if _stale(folder, entry, legacy, now):
            try:
                _remove(folder / entry)
                removed.append(entry)
            except OSError:
                pass
    return removed
