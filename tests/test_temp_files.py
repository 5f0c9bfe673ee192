"""The file layer removes the temp files of saves killed mid-write (`kill -9`), and only those: a
real process saving a 32 MiB model is killed with SIGKILL, and later saves into the folder clean
its temp, whether its parent has reaped it yet or not. Temps of live writers, young temps of other
hosts and files that merely look similar are left alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from jaxtyping import Array, Float

import shapeml as sm
from shapeml import _io
from shapeml._io import _temps

MIB = 2**20


class Small(sm.Model):
    dims = sm.Dims(N=3)
    w: Float[Array, " N"] = sm.param(sm.ones)


def _temps_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.endswith(_temps.SUFFIX))


def _state(pid: int) -> str:
    """A process's state letter from /proc (`Z`: dead, not yet reaped); "" once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rfind(")") + 2 :].split()[0]


def _start_a_save_and_kill_it(target: Path, when: str) -> subprocess.Popen:
    """Starts a process saving a 32 MiB model to `target`, waits until it is inside the save
    (`when`: "writing", 32 MiB written and more to come; "syncing", every byte written, before
    the rename), and kills it with SIGKILL. Returns the killed process, not yet reaped."""
    script = textwrap.dedent(
        f"""
        import os, time
        from jaxtyping import Array, Float
        import shapeml as sm
        from shapeml import _io

        class Big(sm.Model):
            dims = sm.Dims(N=2**21, K=4)  # 8 Mi float32s: 32 MiB
            w: Float[Array, "N K"] = sm.param(sm.zeros)

        def pause():
            print("inside the save", flush=True)
            time.sleep(600)

        if {when!r} == "syncing":
            os.fsync = lambda fd: pause()  # every byte is written; the rename never comes
            sm.save({str(target)!r}, Big.init(seed=0))
        else:
            def write(f):
                f.write(b"x" * 2**25)
                f.flush()
                pause()
                f.write(b"x" * 2**20)
            _io.atomic_write({str(target)!r}, write)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        line = proc.stdout.readline()
        assert line == b"inside the save\n", proc.stderr.read().decode()
        os.kill(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30  # SIGKILL is asynchronous: wait until it is dead
        while _state(proc.pid) not in ("Z", "") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _state(proc.pid) == "Z"
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    return proc


@pytest.mark.parametrize("when", ["writing", "syncing"])
def test_a_save_killed_by_sigkill_leaves_a_temp_that_later_saves_remove(tmp_path, when):
    target = tmp_path / "m.safetensors"
    sm.save(target, Small.init(seed=0))
    old = target.read_bytes()
    proc = _start_a_save_and_kill_it(target, when)
    try:
        (temp,) = _temps_in(tmp_path)  # a folder, holding the file being written
        assert sum(p.stat().st_size for p in temp.iterdir()) >= 32 * MIB
        assert temp.name.startswith(".m.safetensors.") and f"-{proc.pid}." in temp.name
        assert target.read_bytes() == old  # the kill changed nothing the user had
        # Not reaped yet (a zombie): a save of another file in the folder removes the temp.
        sm.save(tmp_path / "other.safetensors", Small.init(seed=1))
        assert _temps_in(tmp_path) == []
    finally:
        proc.communicate(timeout=60)  # reaps it and closes its pipes
    assert proc.returncode == -signal.SIGKILL
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors", "other.safetensors"]


def test_a_reaped_killed_writer_is_cleaned_by_the_next_save_of_the_same_file(tmp_path):
    target = tmp_path / "m.safetensors"
    proc = _start_a_save_and_kill_it(target, "syncing")
    proc.communicate(timeout=60)
    assert len(_temps_in(tmp_path)) == 1 and not target.exists()
    sm.save(target, Small.init(seed=0))
    assert [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]
    np.testing.assert_array_equal(sm.load(target, Small).w, np.ones(3))


def _temp(folder: Path, target: str, pid: int, host: str | None = None, age: float = 0) -> Path:
    path = folder / f".{target}.{host or _temps._HOST}-{pid}.abcd1234{_temps.SUFFIX}"
    path.write_bytes(b"partial")
    if age:
        os.utime(path, (time.time() - age, time.time() - age))
    return path


def test_which_temps_are_abandoned(tmp_path):
    hour = _temps.STALE_AGE_S
    live = 1  # a running process, started before any temp here was written
    keep = [
        _temp(tmp_path, "a.bin", live),  # a live writer on this host
        _temp(tmp_path, "a.bin", 99_999_999, host="ffffff"),  # young, from another host
        _temp(tmp_path, "b.bin", live, age=60),
    ]
    gone = [
        _temp(tmp_path, "a.bin", 99_999_999),  # no such process on this host
        _temp(tmp_path, "c.d.bin", 99_999_999),  # any target in the folder, dots and all
        _temp(tmp_path, "e.bin", 99_999_999, host="ffffff", age=hour + 60),  # untouched an hour
        _temp(tmp_path, "f.bin", live, age=hour + 60),  # even a live pid's, after an hour
    ]
    assert len(set(keep + gone)) == 7
    # look-alikes, however old, are never touched
    alike = [
        tmp_path / ".a.bin.zzzzzz-1.abcd1234.shapeml-tmp",  # not a host hash
        tmp_path / ".a.bin.ffffff-1.abcd1234.shapeml-tmpx",
        tmp_path / "a.bin.ffffff-1.abcd1234.shapeml-tmp",  # not hidden
        tmp_path / ".a.bin.ffffff-1.abc.shapeml-tmp",
        tmp_path / "notes.txt",
    ]
    sub = tmp_path / "sub"
    sub.mkdir()
    alike.append(_temp(sub, "a.bin", 99_999_999))  # another folder
    for p in alike:
        p.write_bytes(b"data")
        os.utime(p, (time.time() - 10 * hour, time.time() - 10 * hour))
    _io.atomic_write(tmp_path / "x.bin", b"new")
    assert all(p.exists() for p in keep + alike)
    assert not any(p.exists() for p in gone)


def test_a_reused_pid_does_not_keep_a_dead_writers_temp(tmp_path):
    # The temp was last written a minute ago; the process now holding its pid started after that,
    # so it cannot be the writer.
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        temp = _temp(tmp_path, "m.bin", proc.pid, age=60)
        young = _temp(tmp_path, "n.bin", proc.pid)  # written after it started: maybe its own
        _io.atomic_write(tmp_path / "m.bin", b"new")
        assert not temp.exists() and young.exists()
    finally:
        proc.kill()
        proc.wait()


def test_the_temps_of_saves_in_flight_here_are_never_removed(tmp_path):
    target = tmp_path / "m.bin"
    seen = []

    def write(f):
        (temp,) = _temps_in(tmp_path)  # this save's own temp, in flight
        # a second save into the folder meanwhile (another thread, a nested save) keeps it
        _io.atomic_write(tmp_path / "other.bin", b"x")
        seen.append(temp.exists())
        f.write(b"done")

    _io.atomic_write(target, write)
    assert seen == [True] and target.read_bytes() == b"done" and _temps_in(tmp_path) == []
