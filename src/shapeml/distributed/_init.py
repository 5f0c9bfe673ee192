"""Joining a job of several processes: `initialize()` reads the launcher's or the cluster's settings.

One script runs everywhere: alone it is a single process (nothing to join); under `shapeml
launch` it joins the local job the launcher started (its settings are in `SHAPEML_*` variables);
on a cluster JAX's own detection reads SLURM's, Open MPI's, Kubernetes' or Cloud TPU's settings.
After it, `jax.devices()` lists every process's devices and one mesh spans them all.
"""

from __future__ import annotations

import dataclasses
import os

import jax

from .. import _jax_internals as jxi
from .._job import _watchdog as watchdog
from .._traceback import api_boundary
from .._validate import integer, real
from ._errors import InitializeError

__all__ = ["ENV_COORDINATOR", "ENV_PROCESSES", "ENV_PROCESS_ID", "ProcessInfo", "initialize"]

ENV_COORDINATOR = "SHAPEML_COORDINATOR"  # host:port of process 0's coordination service
ENV_PROCESSES = "SHAPEML_PROCESSES"  # how many processes the job has
ENV_PROCESS_ID = "SHAPEML_PROCESS_ID"  # this process's index, 0..processes-1


@api_boundary
@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """Where this process stands in its job.

    Attributes:
        index: this process's index (`jax.process_index()`), 0 in a single process.
        count: how many processes the job has (`jax.process_count()`).
        local_devices: how many devices this process drives.
        devices: how many devices the whole job has (`jax.device_count()`).
        source: where the settings came from: "single process", "launcher" or "cluster".
    """

    index: int
    count: int
    local_devices: int
    devices: int
    source: str

    @property
    def is_main(self) -> bool:
        """Whether this is process 0 (the one to print, evaluate and write single files)."""
        return self.index == 0


def _settings() -> tuple[str, int, int] | None:
    """The launcher's `(address, count, index)`, checked; None when no launcher set them."""
    if ENV_PROCESSES not in os.environ:
        return None
    values = {k: os.environ.get(k, "") for k in (ENV_COORDINATOR, ENV_PROCESSES, ENV_PROCESS_ID)}
    try:
        count = integer(ENV_PROCESSES, int(values[ENV_PROCESSES]), low=1)
        index = integer(ENV_PROCESS_ID, int(values[ENV_PROCESS_ID]), low=0, high=count - 1)
    except ValueError:
        raise InitializeError(
            f"the launcher's settings are malformed: {ENV_PROCESSES}={values[ENV_PROCESSES]!r}, "
            f"{ENV_PROCESS_ID}={values[ENV_PROCESS_ID]!r}",
            fix="start the job with `shapeml launch`, or set a count >= 1 and an id below it",
        ) from None
    host, colon, port = values[ENV_COORDINATOR].rpartition(":")
    if not colon or not host or not port.isdigit():
        raise InitializeError(
            f"{ENV_COORDINATOR}={values[ENV_COORDINATOR]!r} is not HOST:PORT",
            fix="start the job with `shapeml launch`, or set e.g. 127.0.0.1:12345",
        )
    return values[ENV_COORDINATOR], count, index


def _info(source: str) -> ProcessInfo:
    return ProcessInfo(
        jax.process_index(), jax.process_count(), jax.local_device_count(), jax.device_count(),
        source,
    )  # fmt: skip


@api_boundary
def initialize(
    *,
    timeout: int = 300,
    heartbeat_timeout: int = 100,
    shutdown_timeout: int = 30,
    collective_timeout: float = 300.0,
) -> ProcessInfo:
    """Joins this process to its job, wherever its settings come from; call it first.

    Reads, in order: the settings `shapeml launch` gives each process (`SHAPEML_COORDINATOR`,
    `SHAPEML_PROCESSES`, `SHAPEML_PROCESS_ID`); else a cluster's, as `jax.distributed.initialize()`
    detects them (SLURM, Open MPI, Kubernetes, Cloud TPU); else none: a single process, nothing
    to join. On CPU the processes' collectives run over gloo. A second call returns the same.

    Args:
        timeout: seconds to wait for every process to join (`initialization_timeout`).
        heartbeat_timeout: seconds after which a silent process counts as dead: the others then
            stop with an error instead of waiting for it (`heartbeat_timeout_seconds`).
        shutdown_timeout: seconds a process that ends waits for the others to end too
            (`shutdown_timeout_seconds`): past it, it exits anyway, so a process whose peer
            died exits within this bound rather than JAX's default of 300 s.
        collective_timeout: seconds each of shapeml's waits on the job's devices may take (a
            training step with its compile, reading its metrics, an evaluation, a checkpoint
            save or gather): past it, the process prints `CollectiveTimeoutError` (E2207) and
            exits with status 1, and its peers stop with E2203, so a job never hangs silently
            (as `timeout` of PyTorch's `init_process_group`). Only in a job of several processes.

    Returns:
        a `ProcessInfo`: this process's index, the process count, the devices.

    Example:
        >>> info = distributed.initialize()     # first thing in train.py
        >>> mesh = sharding.make_mesh(f"data={jax.device_count()}")

    Raises:
        InitializeError: (E2202) when JAX already started before it (in a job of several
            processes), for malformed launcher settings, or when the coordinator cannot be
            reached in `timeout` seconds.
    """
    timeout = integer("timeout", timeout, low=1)
    heartbeat_timeout = integer("heartbeat_timeout", heartbeat_timeout, low=1)
    shutdown_timeout = integer("shutdown_timeout", shutdown_timeout, low=1)
    collective_timeout = real("collective_timeout", collective_timeout, low=0.0, low_open=True)
    launched = _settings()
    source = "launcher" if launched else "cluster" if jxi.cluster_detected() else None
    if jxi.distributed_client_started():
        if jax.process_count() > 1:
            watchdog.start(collective_timeout)
        return _info(source or "cluster")
    if source is None:
        return _info("single process")
    if jxi.backend_started():
        raise InitializeError(
            "distributed.initialize() was called after JAX started (an array was made or the "
            "devices were listed first), so this process can no longer join its job",
            fix="call distributed.initialize() first thing in the script, before any JAX call",
        )
    # Gloo carries the collectives of CPU devices between processes (the default may change
    # between JAX versions); it does not affect accelerators.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    address, count, index = launched if launched else (None, None, None)
    try:
        jax.distributed.initialize(
            coordinator_address=address,
            num_processes=count,
            process_id=index,
            initialization_timeout=timeout,
            heartbeat_timeout_seconds=heartbeat_timeout,
            shutdown_timeout_seconds=shutdown_timeout,
        )
    except (RuntimeError, ValueError) as e:  # JAX's errors of a failed join (XlaRuntimeError)
        where = f"the coordinator at {address}" if address else "the cluster's coordinator"
        raise InitializeError(
            f"process {index if index is not None else '?'} could not join its job through "
            f"{where} within {timeout} s: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
            fix="start every process of the job (`shapeml launch --processes N -- ...` does), "
            "and check the address and port are reachable",
        ) from e
    if jax.process_count() > 1:
        watchdog.start(collective_timeout)
    return _info(source)
