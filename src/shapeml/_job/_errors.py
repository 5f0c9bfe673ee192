"""The errors of a job's waits and single files (codes E2207..E2208, in the range of
`shapeml.distributed`, which re-exports them): below every package, so that `sm.save` can
raise them too."""

from __future__ import annotations

from .._errors import ShapemlError

__all__ = ["CollectiveTimeoutError", "JobSaveError"]


class CollectiveTimeoutError(
    ShapemlError,
    RuntimeError,
    code="E2207",
    title="a wait of the job passed its collective timeout",
    explanation="""
In a job of several processes, every collective (the all-reduce of a training step, a gather of
a checkpoint) waits for all the processes. One that never takes part would leave the others
waiting forever, silently: gloo has no deadline, and JAX's heartbeats only notice a process that
has died. So `distributed.initialize(collective_timeout=300)` starts a watchdog, and each wait
shapeml makes on the devices (a step, its metrics, an evaluation, a checkpoint save or gather)
must end within that many seconds. One that does not prints this error and ends its process with
status 1 (the waiting thread cannot be interrupted); the other processes then stop with E2203
and `shapeml launch` reports the job as failed (E2201).

Look at the other processes' last lines for the one that stopped or fell behind. If your steps
really take longer than the timeout (a large model on CPU, a long first compile under load),
raise it: `distributed.initialize(collective_timeout=1800)`. Resume the job from its last
complete checkpoint with `resume=True`.
""",
):
    pass


class JobSaveError(
    ShapemlError,
    RuntimeError,
    code="E2208",
    title="a single file from a multi-process job was not written",
    explanation="""
In a job of several processes, `sm.save(path, m)` is called by every process, as PyTorch's FSDP
full state dict is: each process gives its shards, process 0 gathers the whole model and writes
the one file (atomically: a temp file, fsync, rename), and the others wait until it is complete,
so nothing partial is ever visible. It failed because:

- not every process called it within the job's collective timeout (e.g. only under
  `if info.is_main:`): call `sm.save` in every process; only process 0 writes;
- process 0 could not write the file (the message carries its error, e.g. a missing folder or
  NaN values): fix that and save again. Nothing was written.

For sharded, asynchronous checkpoints in which every process writes only its own shards, use
`distributed.CheckpointManager`.
""",
):
    pass
