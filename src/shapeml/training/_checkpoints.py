"""Where `train` keeps its checkpoints: one file (`sm.save_checkpoint`), or a sharded directory
(`distributed.CheckpointManager`), behind the same four calls."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax

from .._validate import instance
from ..distributed import CheckpointManager, SingleFileCheckpointError
from ..models import Model
from ..optim import Optimizer, load_checkpoint, save_checkpoint

__all__ = ["Checkpoints"]


class Checkpoints:
    """`train`'s checkpoint: a file path, a `CheckpointManager`, or None (nothing saved).

    Raises:
        SingleFileCheckpointError: (E2206) for a file in a job of several processes.
    """

    def __init__(self, target: Any, mesh: jax.sharding.Mesh | None, rules: Any):
        if target is not None and not isinstance(target, CheckpointManager):
            instance("checkpoint", target, (str, os.PathLike), "a file path or a CheckpointManager")
            if jax.process_count() > 1:
                raise SingleFileCheckpointError(
                    f"train(..., checkpoint={str(target)!r}) in a job of {jax.process_count()} "
                    "processes: one file needs every shard on one process",
                    fix="pass checkpoint=distributed.CheckpointManager(directory) instead",
                )
        self.target, self.mesh, self.rules = target, mesh, rules
        self._last: int | None = None  # the update saved last (its save may be in flight)

    @property
    def sharded(self) -> bool:
        return isinstance(self.target, CheckpointManager)

    def exists(self) -> bool:
        if self.target is None:
            return False
        if self.sharded:
            return self.target.latest_step() is not None
        return Path(self.target).exists()

    def load(self, model: Model, opt: Optimizer) -> tuple[Model, Optimizer]:
        """The latest checkpoint, like `opt` (placed on the mesh for a sharded one)."""
        if self.sharded:
            return self.target.restore_training(
                type(model), like=opt, mesh=self.mesh, rules=self.rules
            )
        return load_checkpoint(self.target, type(model), like=opt)

    def save(self, at: int, model: Model, opt: Optimizer) -> None:
        """Writes the checkpoint of update `at` (a step already saved is not saved again)."""
        if self.sharded:
            if at != self._last and at not in self.target.steps():
                self.target.save(at, model, opt)
        else:
            save_checkpoint(self.target, model, opt)
        self._last = at

    def wait(self) -> None:
        """Returns once every checkpoint started is complete."""
        if self.sharded:
            self.target.wait()

    def where(self, at: int) -> str:
        """How messages name the checkpoint of update `at`."""
        if self.sharded:
            return f"{self.target.directory} (step {at})"
        return str(self.target)
