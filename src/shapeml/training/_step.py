"""The compiled training step: value_and_grad + update, jitted once with buffer donation.

The model and optimizer are flattened once; each call passes flat lists of arrays, so per-step
dispatch costs what a hand-written `jax.jit` step on raw dicts costs (no Python pytree walk), and
donation lets XLA update the weights and optimizer state in place.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _jax_internals as jxi
from .. import sharding
from .._errors import ArgumentError
from .._grad import value_and_grad
from .._validate import instance
from ..models import Model
from ..optim import Optimizer, averaged, update

__all__ = ["TrainStep"]


class TrainStep:
    """A stateful shell around one pure compiled step: holds the current model and optimizer.

    The optimizer's options work unchanged: with `accumulate=N` every N-th call applies an
    update (`optax.MultiSteps`), with `ema=DECAY` `step.averaged` is the moving average of the
    weights, and a non-finite gradient is skipped and counted in `step.opt.skipped`.

    With `mesh`, each batch is split over its `data_axis` and the params and optimizer state are
    placed by `rules` (dim name -> mesh axis, as for `sm.shard`; none given: replicated), so one
    rule table is data parallelism, FSDP or tensor parallelism. The layout never changes between
    steps: one compile.

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
    ):
        instance("model", model, Model, "the sm.Model to train")
        instance("opt", opt, Optimizer, "its optimizer, e.g. optim.adamw(model, lr=3e-3)")
        self.loss = loss
        self.has_aux = has_aux
        # Copies: the step donates its buffers, and the caller's model must stay readable.
        self._model_leaves, self._model_def = jax.tree.flatten(jax.tree.map(jnp.copy, model))
        self._opt_leaves, self._opt_def = jax.tree.flatten(jax.tree.map(jnp.copy, opt))
        self.mesh = mesh
        self._data_axis = data_axis
        out_shardings = None
        if mesh is not None:
            batch_axis = data_axis if data_axis in mesh.shape else None
            s = sharding.step_shardings(model, opt, mesh, rules or {}, batch_axis=batch_axis)
            out_shardings = (jax.tree.leaves(s.model), jax.tree.leaves(s.opt), s.replicated)
            self._model_leaves = jax.device_put(self._model_leaves, out_shardings[0])
            self._opt_leaves = jax.device_put(self._opt_leaves, out_shardings[1])
            self._placement = (mesh, batch_axis)
        elif rules is not None:
            raise ArgumentError(
                "TrainStep(..., rules=...) was given rules but no mesh to place the fields on",
                fix="pass mesh= too, e.g. TrainStep(loss, m, opt, mesh=mesh, rules=rules)",
            )
        model_def, opt_def = self._model_def, self._opt_def

        def step(model_leaves, opt_leaves, *batch):
            m = jax.tree.unflatten(model_def, model_leaves)
            o = jax.tree.unflatten(opt_def, opt_leaves)
            value, g = value_and_grad(loss, m, *batch, has_aux=has_aux)
            m, o = update(m, o, g)
            return jax.tree.leaves(m), jax.tree.leaves(o), value

        self._step = jax.jit(step, donate_argnums=(0, 1), out_shardings=out_shardings)

    def __call__(self, *batch):
        """Runs one step on a batch; returns the loss (and aux) before the step, on device."""
        if self.mesh is not None:  # E1903 for a batch the data axis does not divide
            batch = sharding.place_batch(tuple(np.asarray(b) for b in batch), *self._placement)
        self._model_leaves, self._opt_leaves, value = self._step(
            self._model_leaves, self._opt_leaves, *batch
        )
        return value

    @property
    def model(self) -> Model:
        return jax.tree.unflatten(self._model_def, self._model_leaves)

    @property
    def opt(self) -> Optimizer:
        return jax.tree.unflatten(self._opt_def, self._opt_leaves)

    @property
    def averaged(self) -> Model:
        """The moving average of the weights (an optimizer built with `ema=`), a model of the
        same class (E1207 if the optimizer keeps none)."""
        return averaged(self.model, self.opt)

    def compiled_count(self) -> int:
        """How many distinct programs this step has compiled (1 in a healthy training run)."""
        return jxi.compiled_count(self._step)


def make_mesh(devices: int | Sequence[jax.Device], axis: str = "data") -> jax.sharding.Mesh:
    """A 1-D mesh over `devices` (a count takes the first n devices) for data parallelism."""
    if isinstance(devices, int):
        available = jax.devices()
        if devices > len(available):
            raise ArgumentError(
                f"asked for {devices} devices but JAX sees {len(available)}; on CPU, set "
                f"XLA_FLAGS=--xla_force_host_platform_device_count={devices} before JAX starts "
                "(`shapeml train --devices N` does this for you)"
            )
        devices = available[:devices]
    return jax.sharding.Mesh(np.array(devices), (axis,))
