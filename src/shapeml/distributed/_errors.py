"""The errors of running past one process: the launcher, joining a job, sharded checkpoints
(codes E2201..E2249)."""

from __future__ import annotations

from .._errors import ShapemlError

__all__ = [
    "CheckpointDirectoryError",
    "InitializeError",
    "LaunchError",
    "OrbaxMissingError",
    "ProcessFailedError",
    "SingleFileCheckpointError",
]


class LaunchError(
    ShapemlError,
    RuntimeError,
    code="E2201",
    title="a launched process failed",
    explanation="""
`shapeml launch` (or `distributed.launch`) starts one process per rank and watches them. When one
exits with an error or is killed, the others cannot go on (their collectives need it): the
launcher gives them a grace period to fail on their own, then kills them, and reports the first
process that failed with its exit status or signal. Its own output, above, shows why (each line
is tagged with its process, `[1] ...`). A job that runs past `--timeout` is stopped the same way.

A job resumes from its last complete checkpoint (`train(..., checkpoint=CheckpointManager(dir),
resume=True)`): run the same command again.
""",
):
    pass


class InitializeError(
    ShapemlError,
    RuntimeError,
    code="E2202",
    title="could not join the multi-process job",
    explanation="""
`distributed.initialize()` joins the processes of one job through JAX's coordination service
(`jax.distributed.initialize`). It reads the job's settings from the launcher's environment
(`SHAPEML_COORDINATOR`, `SHAPEML_PROCESSES`, `SHAPEML_PROCESS_ID`, set by `shapeml launch`) or,
on a cluster, from the cluster's own (SLURM, Open MPI, Kubernetes, Cloud TPU: JAX detects them).
It failed because:

- JAX had already started its backends (an array was made or `jax.devices()` was called first):
  call `initialize()` first thing in the script, before any other JAX call;
- a setting is malformed (a process id outside `0..count-1`, an address without a port);
- the coordinator could not be reached in time (a process of the job did not start, or a
  firewall blocks the port): the message says which address was tried.
""",
):
    pass


class ProcessFailedError(
    ShapemlError,
    RuntimeError,
    code="E2203",
    title="another process of the job stopped",
    explanation="""
A step of a multi-process job failed in a collective or in the coordination service: another
process of the job has stopped (it was killed, crashed or lost its network). Training cannot go
on without it, so this process stops too instead of waiting. Nothing of the checkpoints is lost:
a checkpoint whose save did not complete on every process is never taken as complete.

Find the first process that failed (the launcher names it), fix its cause, and run the job again
with `resume=True`: it continues from the last complete checkpoint.
""",
):
    pass


class OrbaxMissingError(
    ShapemlError,
    ImportError,
    code="E2204",
    title="sharded checkpoints need orbax-checkpoint",
    explanation="""
`distributed.CheckpointManager` writes and reads sharded checkpoints with orbax-checkpoint, an
optional dependency of shapeml. Install it with the extra:

    pip install 'shapeml[distributed]'

A model that fits one host's memory can use the single-file checkpoints instead, which need
nothing more: `sm.save` / `sm.load` and `sm.save_checkpoint` / `sm.load_checkpoint`.
""",
):
    pass


class CheckpointDirectoryError(
    ShapemlError,
    FileNotFoundError,
    code="E2205",
    title="no complete checkpoint to restore",
    explanation="""
A `CheckpointManager` was asked to restore from a directory that holds no complete checkpoint, or
for a step it does not hold. Only checkpoints whose save completed on every process count: a
save interrupted by a crash leaves a temporary directory that is never read. The message lists
the steps the directory does hold.
""",
):
    pass


class SingleFileCheckpointError(
    ShapemlError,
    ValueError,
    code="E2206",
    title="a single-file checkpoint in a multi-process job",
    explanation="""
A checkpoint file (`train(..., checkpoint="run.safetensors")`, `sm.save`) is written by one
process from every shard, which no process of a multi-process job holds: each holds only the
shards of its own devices. Give `train` a sharded checkpoint directory instead, in which every
process writes its own shards:

    train(..., checkpoint=distributed.CheckpointManager("run/ckpt", keep=3), resume=True)
""",
):
    pass
