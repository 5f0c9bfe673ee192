"""One file from a job of several processes: every process gives its shards, process 0 writes.

`sm.save` in a job is a collective, as PyTorch's FSDP full state dict is: every process calls it
(a barrier of the coordination service checks that they all do, within the job's collective
timeout), every array is gathered whole to the host, process 0 writes the file atomically, and
the others wait for its word in the coordination service's key-value store, so none returns
before the file is complete, and all raise when process 0 could not write it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from .. import _jax_internals as jxi
from .._errors import ShapemlError
from ._errors import JobSaveError
from ._watchdog import timeout, watched

__all__ = ["in_job", "on_host", "write_from_job"]

_DEFAULT_TIMEOUT = 300.0  # seconds, when no watchdog runs (a job joined without `initialize`)
_saves = itertools.count()  # the same sequence in every process: each calls every save


def _elsewhere(v: Any) -> bool:
    """Whether part of `v` lives only on other processes' devices (a replicated array is whole
    in every process)."""
    return isinstance(v, jax.Array) and not v.is_fully_addressable and not v.is_fully_replicated


def in_job(arrays: Mapping[str, Any]) -> bool:
    """Whether writing these arrays needs the whole job: some array has shards only on other
    processes' devices. A replicated (data-parallel) model is written by whichever process
    calls `sm.save`, as `torch.save` under `if rank == 0:`."""
    return jax.process_count() > 1 and any(_elsewhere(v) for v in arrays.values())


def on_host(arrays: Mapping[str, Any]) -> dict[str, Any]:
    """The arrays as this process holds them: a replicated array spanning other processes'
    devices is read from its local copy."""
    return {
        k: np.asarray(v.addressable_data(0))
        if isinstance(v, jax.Array) and not v.is_fully_addressable
        else v
        for k, v in arrays.items()
    }


def _whole(x: Any) -> np.ndarray:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def write_from_job(
    path: Any, arrays: Mapping[str, Any], write: Callable[[dict[str, np.ndarray]], Path]
) -> Path:
    """Gathers `arrays` whole in every process; process 0 runs `write(host_arrays)`, the others
    wait for it. Returns the path written.

    Raises:
        JobSaveError: (E2208) when not every process calls it in time, or (in the other
            processes) when process 0 could not write; process 0 raises its own error.
    """
    n = next(_saves)
    limit = timeout() or _DEFAULT_TIMEOUT
    me, count = jax.process_index(), jax.process_count()
    try:
        jxi.barrier(f"shapeml.single_file.{n}", limit)
    except (RuntimeError, ValueError) as e:  # JAX's runtime error of a barrier that timed out
        raise JobSaveError(
            f"sm.save(`{path}`) in process {me} of {count}: not every process of the job called "
            f"it within {limit:g} s ({str(e).strip().splitlines()[0] if str(e).strip() else e})",
            fix="call sm.save in every process of the job (not only under `if info.is_main:`): "
            "each gives its shards and only process 0 writes the file",
        ) from e
    with watched(f"gathering `{path}` from every process"):
        host = {k: _whole(v) for k, v in arrays.items()}
    key = f"shapeml.single_file.{n}"
    if me == 0:
        try:
            written = write(host)
        except ShapemlError as e:
            jxi.kv_set(key, f"error:{e}")
            raise
        jxi.kv_set(key, f"ok:{written}")
        return written
    try:
        status = jxi.kv_get(key, limit)
    except (RuntimeError, ValueError) as e:
        raise JobSaveError(
            f"sm.save(`{path}`) in process {me} of {count}: process 0 did not finish writing it "
            f"within {limit:g} s",
            fix="look at process 0's output for why it stopped; save again",
        ) from e
    if status.startswith("ok:"):
        return Path(status[3:])
    raise JobSaveError(
        f"sm.save(`{path}`) in process {me} of {count}: process 0 could not write it: "
        f"{status[len('error:') :]}",
        fix="fix what process 0's error says and save again (nothing was written)",
    )
