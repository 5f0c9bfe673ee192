"""`nn.BatchNorm`: normalizes each channel by the batch's statistics while training and by running
statistics (buffers) in evaluation; `nn.take_buffers` carries the updated buffers into a step."""

from __future__ import annotations

import typing
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._errors import ArgumentTypeError
from .._shaped import shaped
from .._traceback import api_boundary
from .._validate import real
from ..models import Dims, Model, buffer, ones, param, static, zeros
from ..models._introspect import param_mask
from ._errors import LayerInputError, LayerOptionError
from ._layer import Layer

__all__ = ["BatchNorm", "take_buffers"]


@api_boundary
class BatchNorm(Layer):
    """Batch normalization over every axis but the channels (axis 1): `[b C]`, `[b C h w]`, ...

    Dims: `C`. Params: `scale [C]` (ones), `bias [C]` (zeros), both without weight decay.
    Buffers: `mean [C]` (zeros), `var [C]` (ones): saved with the model, never trained, updated
    by `train=True` calls as `new = (1 - momentum) * old + momentum * batch` (the batch variance
    unbiased, as PyTorch). Options: `momentum` in (0, 1] (default 0.1), `eps` > 0 (default 1e-5).

    Example:
        >>> y, bn = net.bn(x, train=True)     # batch statistics; bn holds the new buffers
        >>> y, _ = net.bn(x, train=False)     # running statistics; bn is unchanged
    """

    dims = Dims(C=8)
    scale: Float[Array, " C"] = param(ones, decay=False)
    bias: Float[Array, " C"] = param(zeros, decay=False)
    mean: Float[Array, " C"] = buffer(zeros)
    var: Float[Array, " C"] = buffer(ones)
    momentum: float = static(default=0.1)
    eps: float = static(default=1e-5)

    @classmethod
    @typing.no_type_check  # validates its arguments itself, with coded errors
    def init(
        cls,
        seed: Any = 0,
        *,
        C: int = 8,
        momentum: float = 0.1,
        eps: float = 1e-5,
        max_bytes: int | None = None,
    ) -> BatchNorm:
        """A new `BatchNorm` (scale ones, shift zeros, running mean zeros and variance ones).

        Args:
            seed: a whole number, a `jax.random.key` or an int array (as `sm.Model.init`).
            C: channels (axis 1 of the input).
            momentum: the weight of each batch in the running statistics, in (0, 1].
            eps: added to the variance, > 0.
            max_bytes: the most the layer may hold (default 16 GiB).
        """
        return super().init(seed, max_bytes=max_bytes, C=C, momentum=momentum, eps=eps)

    @classmethod
    def _check(cls, dims, options) -> None:
        for name, high in (("momentum", 1.0), ("eps", None)):
            try:
                real(name, options[name], low=0.0, low_open=True, high=high)
            except Exception as e:
                where = "in (0, 1]" if high else "> 0"
                raise LayerOptionError(
                    f"`{cls.__name__}` {name} is {options[name]!r}; it must be a number {where}",
                    fix=f"use e.g. `sm.submodel(nn.BatchNorm, {name}={0.1 if high else 1e-5})`",
                ) from e

    @shaped
    def __call__(
        self, x: Float[Array, "b C *s"], *, train: bool
    ) -> tuple[Float[Array, "b C *s"], BatchNorm]:
        """`(y, layer)`: with `train=True`, `y` uses the batch's statistics and `layer` holds the
        updated running statistics; with `train=False`, the running ones and `layer` is `self`."""
        m = self
        shape = (1, m.dims.C) + (1,) * (x.ndim - 2)
        if train:
            axes = (0,) + tuple(range(2, x.ndim))
            n = x.size // m.dims.C
            if n < 2:
                raise LayerInputError(
                    f"`{type(m).__name__}` needs at least 2 values per channel to train, got {n}",
                    fix="train with a batch of 2 or more, or call with train=False",
                )
            mean = jnp.mean(x, axis=axes)
            var = jnp.mean(jnp.square(x - mean.reshape(shape)), axis=axes)
            unbiased = var * (n / (n - 1))
            mom = m.momentum
            m = m.replace(
                mean=((1 - mom) * m.mean + mom * mean).astype(m.mean.dtype),
                var=((1 - mom) * m.var + mom * unbiased).astype(m.var.dtype),
            )
        else:
            mean, var = m.mean, m.var
        inv = jnp.reciprocal(jnp.sqrt(var.reshape(shape) + m.eps))
        y = (x - mean.reshape(shape)) * inv * m.scale.reshape(shape) + m.bias.reshape(shape)
        return y.astype(x.dtype), m


@api_boundary
def take_buffers(m: Model, source: Model) -> Model:
    """`m` with every buffer (at any depth) taken from `source`, its params kept.

    After a training step, the optimizer has updated `m`'s params and left its buffers alone;
    `source` is the model the loss returned (e.g. with BatchNorm running statistics updated):

        (loss, new), g = sm.value_and_grad(loss_fn, m, x, y, has_aux=True)
        m, opt = optim.update(m, opt, g)
        m = nn.take_buffers(m, new)

    Raises:
        ArgumentTypeError: (E0003) if the two are not models of the same class.
    """
    if not isinstance(m, Model) or type(source) is not type(m):
        raise ArgumentTypeError(
            f"take_buffers(m, source) takes two models of the same class, got "
            f"{type(m).__name__} and {type(source).__name__}",
            fix="pass the model and the model your loss returned (same class)",
        )
    changes = {}
    for name, spec in type(m).__shapeml_fields__.items():
        if spec.kind == "buffer":
            changes[name] = getattr(source, name)
        elif spec.kind == "submodel":
            changes[name] = take_buffers(getattr(m, name), getattr(source, name))
        elif spec.kind == "submodels" and isinstance(getattr(m, name), spec.model):
            # stacked layers: the same field-by-field choice, over every layer at once
            mine, theirs = getattr(m, name), getattr(source, name)
            mask = param_mask(mine)
            changes[name] = jax.tree.map(lambda p, a, b: a if p else b, mask, mine, theirs)
        elif spec.kind == "submodels":
            pairs = zip(getattr(m, name), getattr(source, name), strict=True)
            changes[name] = tuple(take_buffers(a, b) for a, b in pairs)
    return m.replace(**changes) if changes else m
