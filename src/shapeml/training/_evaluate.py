"""Evaluation on a `TrainStep`'s devices: a loss (or any `fn(model, *batch)`) run on the step's
current model, with each batch placed as the step places its own, split over the data axis
(`TrainStep.evaluate`), or on the devices a model's arrays are placed on (`evaluate`, for an
`eval_fn` of `train` or a loop of one's own).

`jax.jit(loss)(step.model, batch)` on a model replicated over several devices runs the whole batch
on every device (the input arrives on one device and the output is replicated); placing the batch
first makes XLA split the work as it does the step's, so an evaluation costs what the forward part
of a step costs. The function runs under the step's precision policy, and is one `jax.jit` program
per function and batch layout, cached by JAX.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import sharding
from .._step._devices import auto_mesh, auto_view, is_auto, paced
from .._traceback import api_boundary
from .._validate import instance
from ..models import Model
from ._devices import DataParallel
from ._precision import Precision, precision_of

__all__ = ["Evaluation", "evaluate"]


@dataclasses.dataclass(frozen=True)
class _Forward:
    """`fn(model, *batch)` under the step's precision; with `drop_model`, a loss's aux that is
    the updated model (BatchNorm's running statistics) is left out. Equal for an equal function
    and options, so `jax.jit` compiles it once per layout."""

    fn: Callable
    has_aux: bool
    policy: Precision | None
    drop_model: bool

    def __call__(self, m, *batch):
        if self.policy is None:
            out = self.fn(m, *batch)
        else:  # as the step computes its loss; floating results come back float32
            out = self.fn(self.policy.cast(m), *self.policy.cast(batch))
            out = jax.tree.map(_f32, out, is_leaf=lambda x: isinstance(x, Model))
        if not self.drop_model:
            return out
        value, aux = out
        if isinstance(aux, type(m)):
            return value
        if isinstance(aux, tuple) and aux and isinstance(aux[0], type(m)):
            rest = aux[1:]
            return value, (rest[0] if len(rest) == 1 else rest)
        return out


def _f32(x: Any) -> Any:
    if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.floating):
        return x.astype(jnp.float32)
    return x


_run = jax.jit(lambda forward, m, *batch: forward(m, *batch), static_argnums=0)


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """How a `TrainStep` evaluates: its loss and options, and where its batches go."""

    loss: Callable
    has_aux: bool
    policy: Precision | None
    placement: tuple | None  # (mesh, batch axis) of a step on a mesh
    cores: Any  # the step's DataParallel, without a mesh

    def place(self, batch: tuple) -> tuple:
        """The batch as the step places its own (split over the data axis)."""
        if self.placement is not None:
            batch = tuple(b if isinstance(b, jax.Array) else np.asarray(b) for b in batch)
            return sharding.place_local_batch(batch, *self.placement)
        if self.cores is not None:
            return self.cores.place_batch(batch)
        return batch

    def __call__(self, m: Model, batch: tuple, fn: Callable | None) -> Any:
        if fn is None:
            forward = _Forward(self.loss, self.has_aux, self.policy, self.has_aux)
        else:
            forward = _Forward(fn, False, self.policy, False)
        # traced on the Auto view of an Explicit mesh, as the step is (`shapeml._step`)
        m = jax.tree.map(lambda x: x if is_auto(x) else jax.device_put(x, auto_view(x.sharding)), m)
        batch = self.place(batch)
        if not paced(jax.tree.leaves(m)):
            return _run(forward, m, *batch)
        # Over several CPU devices its collectives must not overlap a step's (see
        # `shapeml._step._devices`): it runs after the step that made `m`, and before the next.
        jax.block_until_ready(m)
        return jax.block_until_ready(_run(forward, m, *batch))


def _mesh_of(m: Model) -> jax.sharding.Mesh | None:
    """The mesh of several devices the model's arrays are placed on, or None."""
    for leaf in jax.tree.leaves(m):
        s = getattr(leaf, "sharding", None)
        if isinstance(s, jax.sharding.NamedSharding) and s.mesh.size > 1:
            return s.mesh
    return None


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def evaluate(
    fn: Callable,
    model: Model,
    *batch: Any,
    data_axis: str = "data",
    precision: Any = None,
) -> Any:
    """`fn(model, *batch)` compiled, on the devices `model` is placed on, each batch array split
    by rows over the mesh's `data_axis` (as a `TrainStep` splits its batches) instead of run
    whole on every device.

    `train`'s `eval_fn` receives the step's model, placed as the step places it: evaluating with
    this function there costs what the forward part of a step costs. On a model on one device it
    is `jax.jit(fn)(model, *batch)`. A batch whose rows the devices do not divide is replicated
    (the same numbers, no speed-up). In a job of several processes each passes its part of the
    batch, as to the step.

    Args:
        fn: `fn(model, *batch)`, e.g. the loss; one `jax.jit` program per `fn` and batch layout.
        model: a model placed by a `TrainStep` or `train` (`step.model`), or by `sm.shard`.
        *batch: the arrays.
        data_axis: the mesh axis the batch is split over.
        precision: compute as a step of this precision does (None: float32).

    Example:
        >>> def eval_fn(m):
        ...     return {"val_loss": float(training.evaluate(loss, m, x_val, y_val))}
        >>> train(loss, m, opt, data, steps=1000, eval_fn=eval_fn, eval_every=100)

    Raises:
        ArgumentTypeError: (E0003) for a `model` that is not an `sm.Model`.
        IndivisibleDimError: (E1903) in a job of several processes, for a batch that does not
            split evenly over the axis.
    """
    instance("model", model, Model, "the sm.Model to evaluate (e.g. step.model)")
    policy = precision_of(precision)
    mesh = _mesh_of(model)
    placement, cores = None, None
    if mesh is not None and data_axis in mesh.shape:
        if jax.process_count() > 1:
            placement = (auto_mesh(mesh), data_axis)
        else:
            cores = DataParallel(mesh, data_axis)
    return Evaluation(fn, False, policy, placement, cores)(model, batch, None)
