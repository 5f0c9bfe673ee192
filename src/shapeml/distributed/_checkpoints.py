"""Sharded checkpoints on orbax-checkpoint: every process writes and reads only its own shards.

A checkpoint is one directory per step (`run/ckpt/120/`) holding the arrays by dotted name
(`model.w_e`, `opt.state.0.mu.w_e`, the names of `sm.save_checkpoint`'s file) and shapeml's
metadata (class, dims, statics, the optimizer's description) beside them. orbax writes each
array's shards from the process that holds them (replicated ones once), asynchronously, into a
temporary directory that becomes the step only once every process has finished: a save
interrupted by a crash is never listed, never restored. A restore checks the class, the dims,
the statics and every missing, unexpected and wrong-shape entry from the metadata alone, before
any array is read (E1301, E1303: the codes of `sm.load`), then reads each array straight onto
the shardings asked for: any mesh, rule table or process count.
"""

from __future__ import annotations

import json
import os
import typing
from collections.abc import Collection
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from .._errors import ArgumentError, ArgumentTypeError
from .._io import NonFiniteError, allowed_nonfinite, names_text
from .._job._watchdog import watched
from .._traceback import api_boundary
from .._validate import instance, integer, shorten
from ..models import Model
from ..models._introspect import tensors
from ..models._metadata import model_metadata
from ..optim import Optimizer
from ..optim._checkpoint import _opt_entries
from ..optim._errors import OptimizerMismatchError
from ._errors import CheckpointDirectoryError, OrbaxMissingError
from ._finite import finite_flags
from ._restore import restore_entries

__all__ = ["CheckpointManager"]

_ARRAYS, _META = "arrays", "shapeml"


def orbax() -> Any:
    """The `orbax.checkpoint` module (E2204 naming the extra when it is not installed)."""
    try:
        import orbax.checkpoint as ocp
    except ImportError as e:
        raise OrbaxMissingError(
            f"sharded checkpoints need orbax-checkpoint, which is not installed ({e})",
            fix="pip install 'shapeml[distributed]' (or use sm.save / sm.save_checkpoint, one "
            "file for a model that fits one host)",
        ) from None
    return ocp


@api_boundary
class CheckpointManager:
    """Sharded checkpoints in a directory, one per step, the last `keep` kept.

    Every process of a job builds the same manager and calls `save` with the same step: each
    writes only the shards its devices hold, in the background (`save` returns once the arrays
    are copied off the devices). `restore` reads each array straight onto the shardings of a
    mesh and rule table, which need not be the ones it was saved with (another table, mesh
    kind or process count). A step is listed and restored only once every process has written
    it: a save cut short by a crash is never taken as complete. `train(..., checkpoint=ckpt,
    checkpoint_every=N, resume=True)` saves through it and resumes from its latest step.

    Use it for a job of several processes or a model past one host's memory; for a model that
    fits one host, in one process, `sm.save` / `sm.load` (one safetensors file) is simpler.
    Needs orbax-checkpoint (`pip install 'shapeml[distributed]'`).

    Args:
        directory: where the steps go (made if missing; the same path for every process).
        keep: how many of the latest checkpoints to keep (None: all).
        async_save: write in the background (the default); False waits in `save`.

    Example:
        >>> ckpt = distributed.CheckpointManager("run/ckpt", keep=3)
        >>> ckpt.save(100, step.model, step.opt)
        >>> m, opt = ckpt.restore_training(Spotter, mesh=mesh, rules={"D": "data"})
        >>> ckpt.close()                # or `with distributed.CheckpointManager(...) as ckpt:`

    Raises:
        OrbaxMissingError: (E2204) when orbax-checkpoint is not installed.
    """

    @typing.no_type_check  # validates its arguments itself, with coded errors
    def __init__(
        self, directory: str | os.PathLike, *, keep: int | None = 3, async_save: bool = True
    ):
        ocp = orbax()
        if keep is not None:
            keep = integer("keep", keep, low=1)
        instance("async_save", async_save, bool, "True or False")
        instance("directory", directory, (str, os.PathLike), "a directory path")
        self.directory = Path(directory).absolute()
        self.keep = keep
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=async_save, create=True
        )
        self._ocp = ocp
        self._mgr = ocp.CheckpointManager(
            self.directory,
            options=options,
            item_handlers={
                _ARRAYS: ocp.PyTreeCheckpointHandler(),
                _META: ocp.JsonCheckpointHandler(),
            },
        )

    def __repr__(self) -> str:
        return f"CheckpointManager({str(self.directory)!r}, keep={self.keep})"

    # what is there ----------------------------------------------------------------------------
    def steps(self) -> list[int]:
        """The steps of every complete checkpoint, oldest first: read from the directory, so a
        save still in flight (or cut short by a crash) is not among them."""
        return sorted(self._ocp.step.checkpoint_steps(self.directory))

    def latest_step(self) -> int | None:
        """The step of the newest complete checkpoint, or None."""
        steps = self.steps()
        return steps[-1] if steps else None

    def wait(self) -> None:
        """Waits until every save started has been written (and committed) by every process."""
        with watched(f"waiting for the checkpoints of `{self.directory}`"):
            self._mgr.wait_until_finished()

    def close(self) -> None:
        """Waits for the saves in flight, then releases orbax's threads."""
        self._mgr.close()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # saving -----------------------------------------------------------------------------------
    @typing.no_type_check  # validates its arguments itself, with coded errors
    def save(
        self,
        step: int,
        m: Model,
        opt: Optimizer | None = None,
        *,
        allow_nonfinite: bool | Collection[str] = False,
    ) -> None:
        """Starts saving the model (and its optimizer) as checkpoint `step`; every process calls
        it alike. It returns once the arrays are off the devices, so training may go on (and
        donate them); the files are written in the background (`wait` waits for them).

        Args:
            step: the checkpoint's step (a new one: steps are never overwritten).
            m: the model; its class, dims and statics go into the metadata.
            opt: its optimizer (then `restore_training` restores both), or None.
            allow_nonfinite: True (or entry names such as `"model.w"`) to save NaN/inf on
                purpose; by default a state holding them is refused (E1307), nothing written.

        Raises:
            NonFiniteError: (E1307) naming every entry holding NaN or an infinity.
            OptimizerMismatchError: (E1201) for an optimizer built for another model class.
            ArgumentError: (E0002) for a step that is negative or already saved.
        """
        step = integer("step", step, low=0)
        instance("m", m, Model, "the sm.Model to save")
        if opt is not None and (not isinstance(opt, Optimizer) or opt.model_class is not type(m)):
            raise OptimizerMismatchError(
                f"CheckpointManager.save(step, m, opt) got a `{type(opt).__name__}` for a "
                f"`{type(m).__name__}`",
                fix="pass the optimizer built for this model, or none",
            )
        allowed = allowed_nonfinite(allow_nonfinite)
        arrays = {f"model.{k}": v for k, (_, v) in tensors(m).items()}
        if opt is not None:
            arrays.update(_opt_entries(opt))
        traced = [k for k, v in arrays.items() if isinstance(v, jax.core.Tracer)]
        if traced:
            raise ArgumentTypeError(
                "CheckpointManager.save was called inside a JAX transformation (jit, vmap, grad): "
                f"{names_text(traced)} are traced, not values",
                fix="save outside the transformation, e.g. after the jitted step returns",
            )
        if step in self._mgr.all_steps():
            raise ArgumentError(
                f"step {step} is already saved in `{self.directory}` (steps: {self.steps()})",
                fix="save each step once; restore it, or save under a later step",
            )
        with watched(f"checking checkpoint {step} for NaN and inf"):
            bad = _nonfinite(arrays, allowed)
        if bad:
            raise NonFiniteError(
                f"refusing to save step {step} in `{self.directory}`: {names_text(bad)} hold NaN "
                "or infinite values",
                fix="train from the last good checkpoint with a lower learning rate or clipped "
                "gradients; to save them on purpose pass allow_nonfinite=True (or the names)",
            )
        meta = model_metadata(m)
        if opt is not None:
            meta["shapeml.format"] = "checkpoint"
            meta["shapeml.optimizer"] = json.dumps(opt.config())
        ocp = self._ocp
        with watched(f"saving checkpoint {step} in `{self.directory}`"):
            self._mgr.save(
                step,
                args=ocp.args.Composite(
                    **{_ARRAYS: ocp.args.PyTreeSave(arrays), _META: ocp.args.JsonSave(meta)}
                ),
            )

    # restoring --------------------------------------------------------------------------------
    @typing.no_type_check  # validates its arguments itself, with coded errors
    def restore(
        self,
        cls: type[Model] | None = None,
        *,
        like: Model | None = None,
        step: int | None = None,
        mesh: jax.sharding.Mesh | None = None,
        rules: Any = None,
        max_bytes: int | None = None,
    ) -> Model:
        """The model of checkpoint `step` (default: the latest complete one), each field read
        straight onto its shards: `rules` on `mesh` (as `sm.shard` places it), or one device
        without a mesh (a single process only).

        Args:
            cls: the model class; its dims are taken from the checkpoint.
            like: instead of `cls`, a model whose class and dims the checkpoint must match.
            step, mesh, rules, max_bytes: which checkpoint; where to place it; the most bytes
                the model may hold (as for `sm.load`, default 16 GiB).

        Raises:
            CheckpointDirectoryError: (E2205) when there is no such complete checkpoint.
            CheckpointError: (E1301) listing every missing, unexpected, wrong-shape and
                wrong-dtype entry at once, before any array is read.
            CheckpointModelError: (E1303) for another class or other dims.
            and the errors of `sm.shard` for the rules (E1901-E1905).
        """
        model, _ = restore_entries(self, cls, like, None, step, mesh, rules, max_bytes, False)
        return model

    @typing.no_type_check  # validates its arguments itself, with coded errors
    def restore_training(
        self,
        cls: type[Model],
        *,
        like: Optimizer | None = None,
        step: int | None = None,
        mesh: jax.sharding.Mesh | None = None,
        rules: Any = None,
        max_bytes: int | None = None,
    ) -> tuple[Model, Optimizer]:
        """`(model, optimizer)` of checkpoint `step` (default: the latest complete one), placed
        as a `TrainStep(mesh=mesh, rules=rules)` places them.

        Args:
            cls: the model class.
            like: the optimizer to fill (needed for `from_optax` optimizers and custom
                transforms, as for `sm.load_checkpoint`); its kind and options must match.
            step, mesh, rules, max_bytes: as for `restore`.

        Raises:
            the errors of `restore`, and of `sm.load_checkpoint` for the optimizer (E1201,
            E1202, E1205, E1207, E1301).
        """
        return restore_entries(self, cls, None, like, step, mesh, rules, max_bytes, True)

    def _step(self, step: int | None) -> int:
        steps = self.steps()
        if step is None and steps:
            return steps[-1]
        if step is not None and integer("step", step, low=0) in steps:
            return step
        raise CheckpointDirectoryError(
            f"`{self.directory}` holds no complete checkpoint"
            + (f" of step {step}" if step is not None else "")
            + (f" (steps: {shorten(steps)})" if steps else ""),
            fix="save one first, or pass one of the steps it holds"
            if steps
            else "check the directory; a save interrupted by a crash is never complete",
        )


def _nonfinite(arrays: dict[str, jax.Array], allowed: bool | frozenset) -> list[str]:
    """Names of floating entries holding NaN or inf: one program, read once (every process
    computes the same answer from its shards)."""
    if allowed is True:
        return []
    allowed = allowed or frozenset()
    names = [
        k
        for k, v in arrays.items()
        if jnp.issubdtype(v.dtype, jnp.inexact) and k not in allowed and v.size
    ]
    if not names:
        return []
    ok = finite_flags([arrays[k] for k in names])
    return [k for k, good in zip(names, ok) if not good]
