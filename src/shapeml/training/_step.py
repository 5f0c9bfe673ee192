"""The compiled training step: value_and_grad + update, on the one shell (`shapeml._step`).

The step's carry is the model and its optimizer: donated to each call, so XLA updates the weights
and optimizer state in place, and kept on the device between calls. A loss may return an updated
model (BatchNorm's running statistics) as its aux: its buffers are carried, while the optimizer
updates the params alone.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from .. import sharding
from .._errors import ArgumentError
from .._job._watchdog import watched
from .._step import CarryChangedError, Shell
from .._step._devices import auto_mesh
from .._traceback import api_boundary
from .._validate import instance
from ..distributed._faults import peers_watched
from ..models import Model
from ..models._introspect import param_mask
from ..optim import Optimizer, averaged, update
from ._devices import default_devices
from ._evaluate import Evaluation
from ._grads import Gradients

__all__ = ["TrainStep"]


def _split_aux(aux: Any, cls: type) -> tuple[Model | None, Any]:
    """`(updated model or None, the rest of the aux)`: the aux is a model of the trained class,
    a tuple that starts with one, or anything else (returned to the caller as it is)."""
    if isinstance(aux, cls):
        return aux, None
    if isinstance(aux, tuple) and aux and isinstance(aux[0], cls):
        rest = aux[1:]
        return aux[0], (rest[0] if len(rest) == 1 else rest)
    return None, aux


def _with_buffers(m: Model, source: Model) -> Model:
    """`m` (the optimizer's update of the params) with every buffer taken from `source`.

    Raises:
        CarryChangedError: (E1414) when `source` has other dims or statics than `m`.
    """
    if jax.tree.structure(m) != jax.tree.structure(source):
        diff = [
            f"{k}: {m.dims[k]} -> {source.dims[k]}"
            for k in m.dims
            if m.dims[k] != source.dims.get(k)
        ]
        raise CarryChangedError(
            f"the loss returned a `{type(source).__name__}` whose structure differs from the model "
            f"being trained ({', '.join(diff) or 'its static fields or sub-models differ'})",
            fix="return the model the loss was given, updated with `replace` (e.g. "
            "`m.replace(bn=new_bn)`), so its dims and statics stay the same",
        )
    return jax.tree.map(lambda is_param, a, b: a if is_param else b, param_mask(m), m, source)


@dataclasses.dataclass(frozen=True)
class _Update:
    """The pure step of a loss and its options: `(None, (model, opt, *extra), *batch) ->
    (loss value, new carry)`. Equal for an equal loss and options, so a new `TrainStep` of them
    runs the program `jax.jit` compiled for an earlier one (on the same layout)."""

    loss: Callable
    has_aux: bool
    precision: Any
    remat: str | None

    def __call__(self, _, carry, *batch):
        grads = Gradients(self.loss, self.has_aux, self.precision, self.remat)
        m, o = carry[0], carry[1]
        value, g, finite = grads(m, batch, carry[2:])
        new, o = update(m, o, g)
        if self.has_aux:
            updated, rest = _split_aux(value[1], type(m))
            if updated is not None:
                new = _with_buffers(new, updated)
                value = value[0] if rest is None else (value[0], rest)
        return value, grads.finish((m, carry[1]), (new, o), finite, carry[2:])


@api_boundary
class TrainStep:
    """A stateful shell around one pure compiled step: holds the current model and optimizer.

    The loss is `loss(model, *batch)`, a scalar; with `has_aux=True`, `(scalar, aux)`. An aux that
    is a model of the trained class, or a tuple that starts with one, is the updated model (e.g.
    BatchNorm's running statistics after a `train=True` forward): its buffers are carried into
    the next step, and the rest of the aux (if any) is returned.

    The optimizer's options work unchanged: with `accumulate=N` every N-th call applies an
    update (`optax.MultiSteps`), with `ema=DECAY` `step.averaged` is the moving average of the
    weights, and a non-finite gradient is skipped and counted in `step.opt.skipped`.

    With `mesh`, each batch is split over its `data_axis` and the params and optimizer state are
    placed by `rules` (dim name -> mesh axis, as for `sm.shard`; none given: replicated), so one
    rule table is data parallelism, FSDP or tensor parallelism. The layout never changes between
    steps: one compile. The mesh's axes may be Auto or Explicit (`jax.make_mesh`'s default): the
    loss is traced for Auto axes either way, and the model keeps its shardings' types. In a job
    of several processes each process passes its own part of each batch (see `__call__`).
    Without a mesh, each batch is split over every device of the process (on CPU, the cores
    `sm.use_cpu_devices()` made devices: data parallelism across cores, the same update as on
    one device) unless `devices=1`.

    `precision` computes the loss in bfloat16 or float16 while the params and their update stay
    float32 (`sm.Precision`; float16 scales the loss). `remat` names the rematerialization policy
    (`nn.remat`) of every `nn.scan` over layers the loss runs without naming one: `"full"` keeps
    only each block's input for the backward pass. A model offers both options by running its
    blocks with `nn.scan`, as the zoo's do: `TrainStep(gpt2.loss, m, opt, remat="full")`.

    A new step of the same loss function and options, on a model, optimizer and batch of the same
    structure, shapes, dtypes and placement, runs the program an earlier one compiled (the step
    is one `jax.jit` program, and `jax.jit` caches it), also after that step is gone: the latest
    16 steps' programs are kept (with their loss functions), so `train(...)` called again
    compiles nothing. `compiled_count()` counts the programs this step runs.

    Example:
        >>> step = TrainStep(spotter.loss, m, opt)
        >>> loss = step(img, y)          # updates step.model and step.opt in place on device
    """

    @typing.no_type_check  # validates its arguments itself, with coded errors
    def __init__(
        self,
        loss: Callable,
        model: Model,
        opt: Optimizer,
        *,
        has_aux: bool = False,
        mesh: jax.sharding.Mesh | None = None,
        rules: Mapping[str, Any] | None = None,
        data_axis: str = "data",
        devices: int | None = None,
        precision: Any = None,
        remat: str | None = None,
    ):
        instance("model", model, Model, "the sm.Model to train")
        instance("opt", opt, Optimizer, "its optimizer, e.g. optim.adamw(model, lr=3e-3)")
        self.loss = loss
        self.has_aux = has_aux
        self.mesh = mesh
        self._placement = None
        if mesh is not None:
            batch_axis = data_axis if data_axis in mesh.shape else None
            s = sharding.step_shardings(model, opt, mesh, rules or {}, batch_axis=batch_axis)
            with watched("placing a TrainStep's model and optimizer"):  # a resharding program
                model, opt = jax.device_put(model, s.model), jax.device_put(opt, s.opt)
            self._placement = (auto_mesh(mesh), batch_axis)  # the step's view (`_step`)
        elif rules is not None:
            raise ArgumentError(
                "TrainStep(..., rules=...) was given rules but no mesh to place the fields on",
                fix="pass mesh= too, e.g. TrainStep(loss, m, opt, mesh=mesh, rules=rules)",
            )
        if mesh is not None and devices is not None:
            raise ArgumentError(
                "TrainStep(..., mesh=, devices=) got both; `devices=N` splits batches over N "
                "devices when there is no mesh",
                fix="pass mesh= (with rules=) or devices=, not both",
            )
        # Without a mesh: every device of the process, the batch split over them (or one).
        self._cores = None if mesh is not None else default_devices(devices)
        if self._cores is not None:
            model, opt = self._cores.replicate((model, opt))
        grads = Gradients(loss, has_aux, precision, remat)  # checks the options now
        # The model and optimizer are copied: their buffers are donated to each call.
        carry = (model, opt, *grads.initial_carry())
        if self._cores is not None:
            carry = self._cores.replicate(carry)
        step = _Update(loss, has_aux, grads.policy, remat)
        self._evaluation = Evaluation(loss, has_aux, grads.policy, self._placement, self._cores)
        with watched("copying a TrainStep's model and optimizer"):  # its own buffers
            self._shell = Shell(step, None, carry, name="TrainStep", takes=loss, keep=True)

    def __call__(self, *batch):
        """Runs one step on a batch; returns the loss (and aux) before the step, on device.

        With a mesh, in a job of several processes, each process passes only its part of the
        global batch (`sharding.batch_part(mesh)`: the rows its devices hold) and the global batch
        is assembled from the parts (`jax.make_array_from_process_local_data`); in one process
        the part is the whole batch.
        """
        if self._placement is not None:  # E1903 for a batch the data axis does not divide
            batch = tuple(b if isinstance(b, jax.Array) else np.asarray(b) for b in batch)
            batch = sharding.place_local_batch(batch, *self._placement)
        elif self._cores is not None:
            batch = self._cores.place_batch(batch)
        # E2203 when another process has stopped, E2207 past the job's collective timeout
        with peers_watched("a TrainStep call"), watched("a TrainStep call"):
            return self._shell(*batch)

    def evaluate(self, *batch, fn: Callable | None = None):
        """Evaluates the current model on a batch, on the step's devices, the batch split over
        them as the step splits its own (never replicated, which would run all of it on each).

        Runs `fn(model, *batch)` (default: the step's loss; with `has_aux`, an aux that is the
        updated model is left out) under the step's precision, as one `jax.jit` program per
        function and batch shape; nothing is updated and nothing is donated.

        Args:
            *batch: arrays as the step takes them (each process's part, in a job of several).
            fn: another function of `(model, *batch)`, e.g. an accuracy or a per-example loss
                (a per-row output comes back split over the devices, as the batch).

        Returns:
            What `fn` (or the loss) returns, on device: `float(...)` waits for it.

        Example:
            >>> step = TrainStep(loss, m, opt)
            >>> val = step.evaluate(x_val, y_val)                  # the loss, batch split
            >>> acc = step.evaluate(x_val, y_val, fn=accuracy)     # any fn(model, *batch)
        """
        with peers_watched("a TrainStep evaluation"), watched("a TrainStep evaluation"):
            return self._evaluation(self.model, batch, fn)

    def compiled(self, *batch):
        """The compiled step for this batch (compiled if needed, nothing run), a
        `jax.stages.Compiled`: `step.compiled(tokens).memory_analysis().temp_size_in_bytes` is
        the step's peak temporary memory (activations kept for the backward pass and scratch)."""
        if self._placement is not None:
            batch = tuple(b if isinstance(b, jax.Array) else np.asarray(b) for b in batch)
            batch = sharding.place_local_batch(batch, *self._placement)
        elif self._cores is not None:
            batch = self._cores.place_batch(batch)
        return self._shell.compiled(*batch)

    @property
    def model(self) -> Model:
        return self._shell.carry[0]

    @property
    def opt(self) -> Optimizer:
        return self._shell.carry[1]

    @property
    def averaged(self) -> Model:
        """The moving average of the weights (an optimizer built with `ema=`), a model of the
        same class (E1207 if the optimizer keeps none)."""
        return averaged(self.model, self.opt)

    @property
    def loss_scale(self) -> float | None:
        """The loss scale of a float16 `precision` now (halved after a step whose gradient was
        not finite, which is skipped; doubled after `period` finite steps), else None."""
        extra = self._shell.carry[2:]
        return float(extra[0].scale) if extra else None

    def compiled_count(self) -> int:
        """How many programs this step runs (1 in a healthy training run), whether it compiled
        them or an earlier step of the same loss, options and layout did."""
        return self._shell.compile_count
