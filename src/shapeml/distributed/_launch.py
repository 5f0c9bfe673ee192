"""The launcher: N local processes of one job, in the spirit of `torchrun`, watched until they end.

Each process gets the job's settings in its environment (`SHAPEML_COORDINATOR` = 127.0.0.1 and a
free port, `SHAPEML_PROCESSES`, `SHAPEML_PROCESS_ID`), which `distributed.initialize()` reads, and
its number of CPU devices, decided here whatever the launcher's own environment holds. Their
output lines are tagged `[i] `. When one fails, the others get a grace period to stop on their own
(their collectives fail once a peer is gone), then are killed: a job never hangs on a dead process.
JAX catches SIGTERM in a process that has joined a job (it takes it for a preemption notice), so
stopping means SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from .._errors import ArgumentError
from .._traceback import api_boundary
from .._validate import integer, real
from ._errors import LaunchError
from ._init import ENV_COORDINATOR, ENV_PROCESS_ID, ENV_PROCESSES

__all__ = ["free_port", "launch", "process_env"]

# JAX's own setting of the CPU device count (`jax_num_cpu_devices`), read when `jax` is imported;
# it wins over XLA_FLAGS' `--xla_force_host_platform_device_count`, which is removed too so that
# the child's environment says one thing.
ENV_CPU_DEVICES = "JAX_NUM_CPU_DEVICES"
_XLA_COUNT_FLAG = "--xla_force_host_platform_device_count"

_POLL = 0.05  # seconds between checks of the processes


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_env(
    index: int, processes: int, port: int, devices_per_process: int, base: Mapping[str, str]
) -> dict[str, str]:
    """The environment of process `index`: `base` with the job's settings and
    `devices_per_process` CPU devices (`JAX_NUM_CPU_DEVICES`; any device count in `base`'s
    XLA_FLAGS removed). Devices of an accelerator are not affected."""
    env = dict(base)
    env[ENV_COORDINATOR] = f"127.0.0.1:{port}"
    env[ENV_PROCESSES] = str(processes)
    env[ENV_PROCESS_ID] = str(index)
    env["PYTHONUNBUFFERED"] = "1"  # lines arrive as they are printed, tagged by process
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(_XLA_COUNT_FLAG)]
    if flags:
        env["XLA_FLAGS"] = " ".join(flags)
    else:
        env.pop("XLA_FLAGS", None)
    env[ENV_CPU_DEVICES] = str(devices_per_process)
    return env


def _tag(stream: Any, index: int, out: Any) -> None:
    """Copies a process's output lines (`stream`, bytes) to `out` (text), tagged `[index] `."""
    for raw in iter(stream.readline, b""):
        out.write(f"[{index}] {raw.decode(errors='replace')}")
        out.flush()


def _status(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _failed(codes: list[int | None]) -> tuple[int, int] | None:
    """`(index, code)` of the process to blame among those that failed: one killed by a signal
    before one that exited with an error (which is often its peers' reaction to it)."""
    bad = [(c >= 0, i, c) for i, c in enumerate(codes) if c not in (None, 0)]
    return min(bad)[1:] if bad else None


def _listed(indices: list[int]) -> str:
    return ", ".join(map(str, indices))


def _exit_code(code: int) -> int:
    return 128 - code if code < 0 else code  # a shell's convention for a signal


# Run in front of the command: asks Linux to kill the process when the launcher dies (the death
# signal survives exec), then becomes the command. A small interpreter of its own rather than
# `preexec_fn`, which forks the launcher's own (possibly multithreaded JAX) process.
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    "    ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG\n"
    "except (OSError, AttributeError):\n"
    "    pass\n"
    "os.execvp(sys.argv[1], sys.argv[1:])\n"
)


def _dying_with_parent(command: list[str]) -> list[str]:
    """`command`, killed when the launcher dies (on Linux; elsewhere as it is)."""
    if not sys.platform.startswith("linux"):
        return command
    return [sys.executable, "-c", _DIE_WITH_PARENT, *command]


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def launch(
    command: Sequence[str],
    *,
    processes: int = 2,
    devices_per_process: int = 1,
    port: int | None = None,
    grace: float = 30.0,
    timeout: float | None = None,
    out: Any = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """Runs `command` as `processes` local processes of one job; returns 0 when all succeed.

    Args:
        command: the program and its arguments, e.g. `["python", "train.py", "--steps", "100"]`.
        processes: how many processes (ranks) to start.
        devices_per_process: how many CPU devices each process has (default 1; more tests a
            multi-device, multi-process job on one machine), whatever the launcher's own
            environment says (`JAX_NUM_CPU_DEVICES` or XLA_FLAGS' device count).
        port: the coordinator's port on 127.0.0.1 (default: a free one).
        grace: seconds the others get to stop on their own after one fails, before being killed.
        timeout: seconds the whole job may run (default: no limit); past it every process is
            killed.
        out: where the tagged output lines go (a text stream; default `sys.stdout`).
        env: the environment the processes start from (default `os.environ`); the job's
            settings are added to it.

    Returns:
        0 when every process exits with 0.

    Raises:
        LaunchError: (E2201) naming the first process that failed (its status or signal), after
            the others have stopped, or when the job ran past `timeout`.
        ArgumentError: (E0002) for an empty command or an out-of-range count.

    Example:
        >>> distributed.launch(["python", "train.py"], processes=2, devices_per_process=2)
    """
    command = [str(c) for c in command]
    if not command:
        raise ArgumentError(
            "launch() got no command to run", fix='pass e.g. ["python", "train.py"]'
        )
    if shutil.which(command[0]) is None:
        raise ArgumentError(
            f"launch() cannot run `{command[0]}`: no such program on PATH or file",
            fix='pass the program first, e.g. ["python", "train.py"]',
        )
    processes = integer("processes", processes, low=1, high=4096)
    devices_per_process = integer("devices_per_process", devices_per_process, low=1, high=4096)
    port = free_port() if port is None else integer("port", port, low=1, high=65535)
    grace = real("grace", grace, low=0.0)
    timeout = None if timeout is None else real("timeout", timeout, low=0.0, low_open=True)
    out = sys.stdout if out is None else out
    procs: list[subprocess.Popen] = []
    readers: list[threading.Thread] = []
    try:
        for i in range(processes):
            settings = process_env(
                i, processes, port, devices_per_process, os.environ if env is None else env
            )
            p = subprocess.Popen(
                _dying_with_parent(command),
                env=settings,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            procs.append(p)
            readers.append(threading.Thread(target=_tag, args=(p.stdout, i, out), daemon=True))
            readers[-1].start()
        failure = _watch(procs, grace, timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()
        for t in readers:
            t.join(timeout=5)
        for p in procs:
            p.stdout.close()
    if failure is not None:
        raise failure
    return 0


def _watch(procs: list, grace: float, timeout: float | None) -> LaunchError | None:
    """Waits for every process; the error to raise (the others killed), or None."""
    start = time.monotonic()
    failed: tuple[int, int, float] | None = None  # (index, code, when)
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            break
        now = time.monotonic()
        if failed is None:
            bad = _failed(codes)
            if bad:
                failed = (*bad, now)
        if failed is not None and now - failed[2] > grace:
            break  # the survivors had their chance
        if timeout is not None and now - start > timeout:
            running = [i for i, c in enumerate(codes) if c is None]
            error = LaunchError(
                f"the job ran past its timeout of {timeout:g} s: process"
                f"{'es' if len(running) > 1 else ''} {_listed(running)} "
                f"{'were' if len(running) > 1 else 'was'} still running and killed",
                fix="raise --timeout, or look at the processes' last lines for where they stopped",
            )
            error.exit_code = 124  # as `timeout` exits
            return error
        time.sleep(_POLL)
    codes = [p.poll() for p in procs]
    if failed is None:
        bad = _failed(codes)
        if bad is None:
            return None
        failed = (*bad, time.monotonic())
    index, code, _ = failed
    killed = [i for i, c in enumerate(codes) if c is None]
    others = f"process {killed[0]} was" if len(killed) == 1 else f"processes {_listed(killed)} were"
    stopped = (
        f"; {others} still running after a grace period of {grace:g} s and killed"
        if killed
        else "; the other processes stopped on their own"
    )
    error = LaunchError(
        f"process {index} of {len(procs)} {_status(code)}{stopped}",
        fix="read the lines tagged with that process above; resume the job from its last "
        "complete checkpoint by running the same command again",
    )
    error.exit_code = _exit_code(code)
    return error
