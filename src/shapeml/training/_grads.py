"""How a `TrainStep` takes its gradient: the loss under a mixed-precision policy (`sm.Precision`)
and a remat policy for the `nn.scan`s it runs, with the loss scaled when the policy says so."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .._errors import ArgumentError
from .._grad import value_and_grad
from ..nn._remat import remat_default, resolve_policy
from ._precision import Precision, precision_of

__all__ = ["Gradients"]


class Gradients:
    """`(value, grad, finite)` of a loss for a step, and the extra carry a loss scale needs.

    Args:
        loss: `loss(model, *batch)`, a scalar (with `has_aux`, `(scalar, aux)`).
        precision: None, a dtype name or an `sm.Precision`.
        remat: None, or the named policy of every `nn.scan` the loss runs without naming one.
    """

    def __init__(self, loss: Callable, has_aux: bool, precision: Any, remat: str | None):
        self.policy: Precision | None = precision_of(precision)
        self.has_aux = has_aux
        self.loss = loss if self.policy is None else self.policy.wrap(loss, has_aux)
        # checked now (E0002); an explicit "none" is kept: it overrides a stacked scan's default
        self.remat = None if remat is None else resolve_policy(remat)

    def initial_carry(self) -> tuple:
        """What the step carries besides the model and optimizer: the loss scale, if any."""
        scale = None if self.policy is None else self.policy.initial_scale()
        return () if scale is None else (scale,)

    def __call__(self, m, batch: tuple, extra: tuple):
        """The loss value (unscaled), the gradient (unscaled) and whether it is finite (None
        when the loss is not scaled: the optimizer's own `skip_nonfinite` decides)."""
        context = remat_default(self.remat) if self.remat else contextlib.nullcontext()
        with context as setting:
            if not extra:
                value, g = value_and_grad(self.loss, m, *batch, has_aux=self.has_aux)
                finite = None
            else:
                value, g, finite = self._scaled(m, batch, extra[0].scale)
        if setting is not None and not setting.used and self.remat != "none":
            raise ArgumentError(
                f"remat={self.remat!r} had no effect: the loss runs no `nn.scan` without its "
                "own remat policy (a Python loop over the blocks cannot be rematerialized "
                "block by block)",
                fix="run the blocks with `x = nn.scan(block_fn, m.blocks, x)`, or wrap them "
                "with `nn.remat(block_fn, policy)` yourself and drop remat=",
            )
        return value, g, finite

    def _scaled(self, m, batch: tuple, scale: jax.Array):
        loss, has_aux = self.loss, self.has_aux

        def scaled(model, *b):
            out = loss(model, *b)
            return (out[0] * scale, out[1]) if has_aux else out * scale

        value, g = value_and_grad(scaled, m, *batch, has_aux=has_aux)
        g = g * (1.0 / scale)
        value = (value[0] / scale, value[1]) if has_aux else value / scale
        leaves = jax.tree.leaves(g)
        finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))
        return value, g, finite

    def finish(self, old: tuple, new: tuple, finite, extra: tuple) -> tuple:
        """The carry after the step: with a loss scale, a step whose gradient was not finite
        keeps the old model and optimizer (and the scale is halved)."""
        if not extra:
            return new
        kept = jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
        return (*kept, self.policy.next_scale(extra[0], finite))
