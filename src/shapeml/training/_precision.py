"""`sm.Precision`: a mixed-precision policy. Params are stored and updated in float32; the loss
computes with a bfloat16 or float16 copy of them; the loss value and every reduction the layers
make (norm statistics, softmax, cross-entropy) stay in float32; with float16 the loss can be
scaled so small gradients do not underflow."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._errors import ArgumentError
from .._traceback import api_boundary
from .._validate import choice, real

__all__ = ["LossScale", "Precision", "precision_of"]

_DTYPES = ("float32", "bfloat16", "float16")


class LossScale(typing.NamedTuple):
    """The dynamic loss scale carried between steps: the scale and the finite steps since it
    last changed."""

    scale: jax.Array  # float32 []
    good: jax.Array  # int32 []


@api_boundary
@dataclasses.dataclass(frozen=True)
class Precision:
    """Mixed precision: float32 params, `compute` activations and matmuls, float32 loss.

    Args:
        compute: `"bfloat16"` (the default), `"float16"` or `"float32"` (the policy is then the
            identity).
        loss_scale: None (no scaling; the default for bfloat16, whose range is float32's), a
            number (a fixed scale), or `"dynamic"` (the default for float16): start at
            `2 ** 15`, halve on a step whose gradient is not finite (the step is skipped), double
            after `period` finite steps.
        period: finite steps before a dynamic scale doubles.

    Example:
        >>> step = TrainStep(loss, m, opt, precision="bfloat16")   # or sm.Precision("float16")
        >>> loss(sm.Precision().cast(m), tokens)                   # by hand, inside your own jit
    """

    compute: str = "bfloat16"
    loss_scale: float | int | str | None = "default"
    period: int = 2000

    def __post_init__(self):
        choice("compute", self.compute, _DTYPES)
        scale = self.loss_scale
        if scale == "default":
            scale = "dynamic" if self.compute == "float16" else None
        elif scale is not None and scale != "dynamic":
            scale = real("loss_scale", scale, low=0.0, low_open=True)
        object.__setattr__(self, "loss_scale", scale)
        if type(self.period) is not int or self.period < 1:
            raise ArgumentError(
                f"Precision(period={self.period!r}): the period is a whole number >= 1",
                fix="pass e.g. period=2000",
            )

    @property
    def dtype(self) -> np.dtype:
        """The compute dtype."""
        return jnp.dtype(self.compute)

    @property
    def dynamic(self) -> bool:
        return self.loss_scale == "dynamic"

    def cast(self, tree: Any) -> Any:
        """`tree` (a model, a batch) with every float32 array in the compute dtype; integer
        arrays (token ids, labels) and other floats are left as they are."""
        if self.compute == "float32":
            return tree
        return jax.tree.map(
            lambda x: x.astype(self.dtype) if _is_f32(x) else x,
            tree,
        )

    def wrap(self, loss: Callable, has_aux: bool = False) -> Callable:
        """`loss` computing with the model and float inputs in the compute dtype; its value comes
        back float32 (the aux as the loss returns it)."""
        if self.compute == "float32":
            return loss

        def cast_loss(m, *batch, **kwargs):
            out = loss(self.cast(m), *self.cast(batch), **self.cast(kwargs))
            if has_aux:
                return out[0].astype(jnp.float32), out[1]
            return out.astype(jnp.float32)

        return cast_loss

    # dynamic loss scaling ---------------------------------------------------------------------
    def initial_scale(self) -> LossScale | None:
        """The loss scale a training step starts with (None without scaling)."""
        if self.loss_scale is None:
            return None
        first = 2.0**15 if self.dynamic else float(self.loss_scale)
        return LossScale(jnp.asarray(first, jnp.float32), jnp.asarray(0, jnp.int32))

    def next_scale(self, state: LossScale, finite: jax.Array) -> LossScale:
        """The scale after a step whose gradient was (not) `finite`."""
        if not self.dynamic:
            return state
        grow = finite & (state.good + 1 >= self.period)
        scale = jnp.where(finite, jnp.where(grow, state.scale * 2.0, state.scale), state.scale / 2)
        good = jnp.where(finite & ~grow, state.good + 1, 0)
        return LossScale(jnp.maximum(scale, 1.0).astype(jnp.float32), good.astype(jnp.int32))


def _is_f32(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray)) and x.dtype == jnp.float32


def precision_of(value: Any) -> Precision | None:
    """`Precision` from what a user passes: None, a dtype name, or a `Precision`."""
    if value is None or isinstance(value, Precision):
        return value
    if isinstance(value, str):
        return Precision(value)
    raise ArgumentError(
        f"precision={value!r}: pass a dtype name ('bfloat16', 'float16') or an sm.Precision",
        fix='write precision="bfloat16", or precision=sm.Precision("float16", loss_scale=1024)',
    )
