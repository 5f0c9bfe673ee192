"""A small training loop: compiled step, progress bar, evaluation, checkpoints, resume.

Losses stay on the device between log points, so the loop never waits on a step it does not
report; at each log point they are checked, and a non-finite loss stops training with an error
that names the last good checkpoint (never overwritten by a diverged state). Checkpoints are one
file (`sm.save_checkpoint`) or, in a job of several processes or for a model past one host,
sharded directories (`distributed.CheckpointManager`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from .._errors import ArgumentError, ShapemlError
from .._job._watchdog import watched
from .._traceback import api_boundary
from .._validate import instance, integer
from ..distributed import CheckpointManager
from ..distributed._faults import peers_watched
from ..distributed._finite import finite_flags
from ..models import Model
from ..models._introspect import tensors
from ..optim import Optimizer, averaged
from ..optim._from_optax import reconfigure
from ..sharding import make_mesh
from ._checkpoints import Checkpoints
from ._grads import Gradients
from ._step import TrainStep

__all__ = ["TrainResult", "TrainingDivergedError", "train"]


class TrainingDivergedError(
    ShapemlError,
    FloatingPointError,
    code="E1701",
    title="training loss is not finite",
    explanation="""
The training loss, or a weight, became NaN or infinite. Training stopped at the log point or
checkpoint that saw it; the last checkpoint written before it holds finite weights (every checkpoint
is checked before it is written) and was not overwritten.

Lower the learning rate, add or tighten gradient clipping (`transforms=[optim.clip_norm(1.0)]`),
or check the data for NaNs. Resume from the last good checkpoint with `resume=True`.
""",
):
    pass


@api_boundary
@dataclasses.dataclass
class TrainResult:
    """What `train` returns: the final model and optimizer, the logged history, and with
    `ema=` the moving average of the weights (a model of the same class)."""

    model: Model
    opt: Optimizer
    history: list[dict[str, Any]]
    ema: Model | None = None

    @property
    def skipped(self) -> int:
        """Steps whose gradient was not finite and were skipped."""
        return int(self.opt.skipped)


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def train(
    loss: Callable,
    model: Model,
    opt: Optimizer,
    data: Iterable[tuple],
    *,
    steps: int,
    has_aux: bool = False,
    log_every: int = 25,
    eval_fn: Callable[[Model], dict[str, float]] | None = None,
    eval_every: int = 0,
    checkpoint: str | os.PathLike | CheckpointManager | None = None,
    checkpoint_every: int = 0,
    resume: bool = False,
    devices: int | None = None,
    progress: bool = True,
    accumulate: int = 1,
    ema: float | None = None,
    mesh: jax.sharding.Mesh | None = None,
    rules: Mapping[str, Any] | None = None,
    precision: Any = None,
    remat: str | None = None,
) -> TrainResult:
    """Trains `model` with `opt` on batches from `data` for `steps` steps in total.

    Args:
        loss: `loss(model, *batch)`, a scalar, or with `has_aux` `(scalar, aux)`: `aux` is
            `{name: scalar}` (metrics shown in the progress bar, e.g. accuracy), the updated model
            (its buffers, e.g. BatchNorm's running statistics, are carried: see `TrainStep`), or
            `(model, {name: scalar})`.
        model, opt: the model and its optimizer (`optim.adamw(model, ...)`).
        data: an iterator of batch tuples (e.g. `shapeml.data.batches(x, y, batch_size=64)`).
        steps: total optimizer updates, counting those already done when resuming (each takes
            `accumulate` batches).
        log_every: steps between loss checks and progress-bar updates.
        eval_fn: `eval_fn(model) -> {name: value}`, run every `eval_every` steps and at the end.
        checkpoint: a path for `save_checkpoint` (one file), or a
            `distributed.CheckpointManager` (sharded: every process writes its own shards, in
            the background; what a job of several processes needs), written every
            `checkpoint_every` steps (if > 0) and at the end.
        resume: continue from `checkpoint` if it exists (from a manager: its latest complete
            checkpoint, placed on `mesh` by `rules`); the data iterator is fast-forwarded past
            the batches already used, so a resumed run equals an uninterrupted one.
        devices: shard each batch across this many devices (data parallel; params replicated);
            default every device of the process (one unless `sm.use_cpu_devices()` made more).
        progress: show a tqdm progress bar (loss, metrics, skipped steps, steps/s).
        accumulate: average the gradients of this many batches per update (`optax.MultiSteps`);
            1 keeps the optimizer's own setting (`optim.adamw(m, ..., accumulate=N)`).
        ema: keep a moving average of the weights with this decay (e.g. 0.999), updated after
            each update and saved in checkpoints; returned as `TrainResult.ema`. None keeps the
            optimizer's own setting.
        mesh, rules: train on a device mesh: the batch split over its `data` axis, params and
            optimizer state placed by `rules` (dim name -> mesh axis, as for `sm.shard`), e.g.
            `mesh=sharding.make_mesh("data=2,model=2"), rules={"F": "model"}`. Not with `devices`.
            Auto and Explicit mesh axes both work. In a job of several processes (after
            `distributed.initialize()`) `data` yields each process's part of every batch
            (`batches(..., part=sharding.batch_part(mesh))`) and the progress bar is process 0's.
        precision: compute the loss in `"bfloat16"` or `"float16"` (or an `sm.Precision`) while
            the params, their update and every checkpoint stay float32 (see `TrainStep`).
        remat: the rematerialization policy (`"full"`, `"dots"`, `"dots_no_batch"`, `"none"`)
            of every `nn.scan` over blocks the loss runs without naming its own (the zoo models
            run theirs so); E0002 if the loss runs none. Neither option changes what a
            checkpoint holds, so a run resumed with the same options equals an uninterrupted
            one (bfloat16, float32, a fixed loss scale; float16's dynamic loss scale is not
            saved and starts again from `2**15`).

    Example:
        >>> result = train(gpt2.loss, m, optim.adamw(m, lr=3e-4), batches(tokens, batch_size=8),
        ...                steps=1000, precision="bfloat16", remat="full",
        ...                checkpoint="run.safetensors", checkpoint_every=100, resume=True)

    Raises:
        TrainingDivergedError: (E1701) when the loss is not finite, naming the last good checkpoint.
        ArgumentError, ArgumentTypeError: (E0002, E0003) for a bad count or flag, checked before
            anything runs (`steps=-5` trains nothing and is refused).
        OptionConflictError: (E1207) if `opt` was built with another `accumulate` or `ema`.
        SingleFileCheckpointError: (E2206) for a checkpoint file in a job of several processes.
        ProcessFailedError: (E2203) when another process of the job stops mid-run.
    """
    steps = integer("steps", steps, low=1)
    log_every = integer("log_every", log_every, low=1)
    eval_every = integer("eval_every", eval_every, low=0)
    checkpoint_every = integer("checkpoint_every", checkpoint_every, low=0)
    for name, flag in (("has_aux", has_aux), ("resume", resume), ("progress", progress)):
        instance(name, flag, bool, "True or False")
    instance("model", model, Model, "the sm.Model to train")
    instance("opt", opt, Optimizer, "its optimizer, e.g. optim.adamw(model, lr=3e-3)")
    accumulate = integer("accumulate", accumulate, low=1)
    opt = reconfigure(model, opt, accumulate=None if accumulate == 1 else accumulate, ema=ema)
    per_update = opt.accumulate
    if devices is not None and mesh is not None:
        raise ArgumentError(
            "train(..., devices=, mesh=) got both; `devices=N` is a 1-D data-parallel mesh",
            fix="pass mesh= (with rules=) or devices=, not both",
        )
    if rules is not None and mesh is None:
        raise ArgumentError(
            "train(..., rules=...) was given rules but no mesh to place the fields on",
            fix="pass mesh= too, e.g. train(..., mesh=sharding.make_mesh('data=2'), rules=rules)",
        )
    Gradients(loss, has_aux, precision, remat)  # E0002/E0003 for a bad option, before any file
    if devices is not None:  # checked, like everything above, before any file is read
        mesh = make_mesh({"data": integer("devices", devices, low=1)})
    saves = Checkpoints(checkpoint, mesh, rules)
    done = 0  # batches already used (gradients taken or skipped)
    if resume and saves.exists():
        model, opt = saves.load(model, opt)
        done = int(opt.step) + int(opt.skipped)
    step = TrainStep(
        loss, model, opt, has_aux=has_aux, mesh=mesh, rules=rules, precision=precision, remat=remat
    )
    batches = iter(data)
    for _ in itertools.islice(batches, done):
        pass  # fast-forward past the batches a resumed run already used
    history: list[dict[str, Any]] = []
    pending: list[tuple[int, Any]] = []
    last_good: tuple[int, str] | None = (
        (done // per_update, saves.where(done // per_update)) if done else None
    )
    bar = tqdm(
        total=steps,
        initial=done // per_update,
        disable=not progress or jax.process_index() != 0,
        unit="step",
        dynamic_ncols=True,
    )

    def flush(at: int) -> None:
        nonlocal pending
        if not pending:
            return
        with watched(f"reading the loss of step {at}"):
            values = jax.device_get([v for _, v in pending])
        metrics = [v[1] if isinstance(v, tuple) else {} for v in values]
        losses = [float(v[0] if isinstance(v, tuple) else v) for v in values]
        for (i, _), value in zip(pending, losses):
            if not math.isfinite(value):
                raise TrainingDivergedError(
                    f"the loss is {value} at step {i + 1}; {_where(last_good)}",
                    fix="lower the learning rate or clip gradients, then resume from the checkpoint",
                )
        record = {"step": at, "loss": float(np.mean(losses))}
        for name in metrics[-1]:
            record[name] = float(np.mean([float(m[name]) for m in metrics]))
        record["skipped"] = int(step.opt.skipped)
        history.append(record)
        bar.set_postfix(
            {
                k: (f"{v:.4g}" if isinstance(v, float) else v)
                for k, v in record.items()
                if k != "step"
            }
        )
        pending = []

    with peers_watched("training"):  # E2203 when another process has stopped
        for i in range(done, steps * per_update):
            try:
                batch = next(batches)
            except StopIteration:
                raise ArgumentError(
                    f"the data ran out after {i} of {steps * per_update} batches; pass more batches "
                    "(e.g. batches(..., epochs=None))"
                ) from None
            pending.append((i // per_update, step(*batch)))
            if (i + 1) % per_update:
                continue  # the update of this group of batches is not complete yet
            bar.update(1)
            at = (i + 1) // per_update
            if at % log_every == 0 or at == steps:
                flush(at)
            if checkpoint is not None and checkpoint_every and at % checkpoint_every == 0:
                flush(at)
                settle(step, at)
                check_finite_weights(step.model, at, last_good)
                saves.save(at, step.model, step.opt)
                last_good = (at, saves.where(at))
            if eval_fn is not None and eval_every and at % eval_every == 0 and at != steps:
                history.append({"step": at, **evaluated(eval_fn, step, at)})
        flush(steps)
        bar.close()
        settle(step, steps)
        if eval_fn is not None:
            history.append({"step": steps, **evaluated(eval_fn, step, steps)})
        if checkpoint is not None:
            check_finite_weights(step.model, steps, last_good)
            saves.save(steps, step.model, step.opt)
        saves.wait()
    final_opt = step.opt
    average = averaged(step.model, final_opt) if final_opt.ema is not None else None
    return TrainResult(step.model, final_opt, history, average)


def _where(last_good: tuple[int, str] | None) -> str:
    if last_good:
        return f"the last good checkpoint is `{last_good[1]}` (step {last_good[0]})"
    return "no checkpoint was written before it"


def settle(step: TrainStep, at: int) -> None:
    """Waits for the step's last update before anything else is queued: in a job (or on several
    CPU devices) two programs with collectives in flight at once can deadlock them."""
    with watched(f"training step {at}"):
        jax.block_until_ready((step.model, step.opt))


def evaluated(eval_fn: Callable, step: TrainStep, at: int) -> dict:
    """`eval_fn(model)` after the step's last update, its values read before training goes on."""
    settle(step, at)
    with watched(f"eval_fn after step {at}"):
        return jax.device_get(dict(eval_fn(step.model)))


def check_finite_weights(model: Model, at: int, last_good: tuple[int, str] | None) -> None:
    """Refuses to go on (or checkpoint) once a weight is NaN or infinite: one program over every
    weight (`finite_flags`), read by every process."""
    named = [(k, v) for k, (_, v) in tensors(model).items() if jnp.issubdtype(v.dtype, jnp.inexact)]
    with watched(f"checking the weights after step {at} for NaN and inf"):
        ok = finite_flags([v for _, v in named])
    if not ok.all():
        bad = [k for (k, _), good in zip(named, ok) if not good]
        raise TrainingDivergedError(
            f"after step {at} the params {', '.join(f'`{k}`' for k in bad)} hold NaN or inf "
            f"(the loss was still finite); {_where(last_good)}",
            fix="lower the learning rate or clip gradients, then resume from the checkpoint",
        )


def predict_in_batches(
    predict: Callable, model: Model, images: np.ndarray, batch_size: int = 1024
) -> np.ndarray:
    """Runs a jitted `predict(model, images)` over `images` in fixed-size chunks."""
    fn = jax.jit(predict)
    out = []
    for start in range(0, len(images), batch_size):
        chunk = images[start : start + batch_size]
        n = len(chunk)
        if n < batch_size and start > 0:  # pad the last chunk: no recompile for a new shape
            chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch_size - n, axis=0)])
        out.append(np.asarray(fn(model, jnp.asarray(chunk)))[:n])
    return np.concatenate(out)
