"""The watchdog of a multi-process job: a wait that never ends becomes a coded error and an exit.

A collective waits for every process of the job. When one never takes part (it hangs, or the
collectives of two programs interleave), the others would wait forever at 0% CPU: gloo has no
deadline of its own, and JAX's heartbeats only notice a process that has died. So in a job of
several processes, `distributed.initialize(collective_timeout=...)` starts one daemon thread,
and shapeml runs each of its waits on the devices (a training step, reading its metrics, an
evaluation, a checkpoint) `watched`: a wait that passes the deadline prints `CollectiveTimeoutError`
(E2207), naming what waited and for how long, and ends the process with status 1 (the main
thread, blocked inside the runtime, cannot be interrupted). Its peers then see a stopped process
(E2203) and end too.

A process that has raised `ProcessFailedError` (E2203) cannot go on with its job: `exit_soon`
ends it a few seconds later if it is still running (JAX's shutdown would otherwise wait for the
stopped peer for its whole `shutdown_timeout`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import threading
import time
from collections.abc import Iterator

from ._errors import CollectiveTimeoutError

__all__ = ["EXIT_GRACE", "exit_soon", "start", "timeout", "watched"]

EXIT_GRACE = 3.0  # seconds a process that raised E2203 gets to print and clean up before it ends
_TICK = 0.25  # seconds between the watchdog's looks

_lock = threading.Lock()
_armed: dict[int, tuple[str, float, float]] = {}  # token -> (what, started, deadline)
_ids = itertools.count()
_state: dict = {"timeout": None, "thread": None, "exit_at": None}


def timeout() -> float | None:
    """The deadline of one wait in seconds, or None when no watchdog runs (a single process)."""
    return _state["timeout"]


def start(seconds: float) -> None:
    """Starts the watchdog (once per process; a second call sets the new deadline)."""
    with _lock:
        _state["timeout"] = float(seconds)
        if _state["thread"] is None:
            thread = threading.Thread(target=_run, name="shapeml-watchdog", daemon=True)
            _state["thread"] = thread
            thread.start()


@contextlib.contextmanager
def watched(what: str) -> Iterator[None]:
    """Runs the block under the deadline (nothing when no watchdog runs).

    Args:
        what: what waits, for the message ("training step 12").
    """
    limit = _state["timeout"]
    if limit is None:
        yield
        return
    token = next(_ids)
    now = time.monotonic()
    _armed[token] = (what, now, now + limit)
    try:
        yield
    finally:
        _armed.pop(token, None)


def exit_soon(grace: float = EXIT_GRACE) -> None:
    """Ends the process with status 1 in `grace` seconds unless it has ended by then (starts
    the watchdog's thread if it is not running)."""
    with _lock:
        at = time.monotonic() + grace
        if _state["exit_at"] is None or at < _state["exit_at"]:
            _state["exit_at"] = at
        if _state["thread"] is None:
            thread = threading.Thread(target=_run, name="shapeml-watchdog", daemon=True)
            _state["thread"] = thread
            thread.start()


def _run() -> None:
    while True:
        time.sleep(_TICK)
        now = time.monotonic()
        exit_at = _state["exit_at"]
        if exit_at is not None and now >= exit_at:
            _end(1, None)
        for what, started, deadline in list(_armed.values()):
            if now >= deadline:
                _end(1, _timed_out(what, now - started))


def _timed_out(what: str, waited: float) -> CollectiveTimeoutError:
    import jax  # the thread runs only in a job, after `initialize` imported it

    limit = _state["timeout"]
    return CollectiveTimeoutError(
        f"{what} in process {jax.process_index()} of {jax.process_count()} did not complete "
        f"within the collective timeout of {limit:g} s (waited {waited:.0f} s): a process of "
        "the job never took part in its collective, so this process stops",
        fix="look at the other processes' last lines for the one that stopped or fell behind; "
        "for steps that really take longer, raise distributed.initialize(collective_timeout=...)"
        "; resume from the last complete checkpoint with resume=True",
    )


def _end(status: int, error: CollectiveTimeoutError | None) -> None:
    """Prints the error, flushes what the process printed, and exits at once."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    if error is not None:
        text = f"shapeml.distributed.{type(error).__name__}: {error}\n"
        with contextlib.suppress(Exception):
            os.write(2, text.encode(errors="replace"))
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os._exit(status)
