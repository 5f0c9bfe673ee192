"""A process of the job that stops: the others fail at once with a coded error, never wait.

When a process dies its peers learn it from the failed collective of their next step (gloo:
"Connection closed by peer") or from JAX's coordination service (missing heartbeats). The error
JAX raises then names neither the job nor what to do; `peers_watched` turns it into a
`ProcessFailedError` (E2203). Any other runtime error passes through as JAX raised it. A
process that raised E2203 cannot go on with its job: it ends a few seconds later
(`_watchdog.exit_soon`) even if the error is caught, rather than wait in JAX's shutdown for the
stopped peer.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import jax

from .._job import _watchdog as watchdog
from ._errors import ProcessFailedError

__all__ = ["peers_watched"]

# What the runtime says when a peer is gone: gloo's transport, the coordination service.
_PEER_LOST = re.compile(
    r"connection (closed|reset|refused)|closed by peer|pair closure|broken pipe|heartbeat|"
    r"coordination service|barrier timed out|task .* (not found|disconnected|preempted)|"
    r"unavailable|deadline exceeded",
    re.IGNORECASE,
)


@contextlib.contextmanager
def peers_watched(what: str) -> Iterator[None]:
    """Runs the block; in a job of several processes, a runtime error that says a peer is gone
    becomes `ProcessFailedError` (E2203), the original chained to it.

    Args:
        what: what was running, for the message ("training step 12").
    """
    try:
        yield
    except jax.errors.JaxRuntimeError as e:
        text = str(e)
        if jax.process_count() == 1 or not _PEER_LOST.search(text):
            raise
        watchdog.exit_soon()  # the job is broken: this process ends too, whoever catches this
        first = text.strip().splitlines()[0] if text.strip() else type(e).__name__
        raise ProcessFailedError(
            f"{what} failed in process {jax.process_index()} of {jax.process_count()}: another "
            f"process of the job has stopped ({first})",
            fix="find the process that stopped first (the launcher names it), fix its cause, "
            "and run the job again with resume=True: it continues from the last complete "
            f"checkpoint (this process exits within {watchdog.EXIT_GRACE:g} s)",
        ) from e
