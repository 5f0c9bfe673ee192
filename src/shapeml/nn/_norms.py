"""`nn.LayerNorm` and `nn.RMSNorm` over the last axis `D`, each with a learned scale (and shift)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
from jaxtyping import Array, Float

from .._shaped import shaped
from .._validate import real
from ..models import Dims, ones, param, static, zeros
from ._errors import LayerOptionError
from ._layer import Layer

__all__ = ["LayerNorm", "RMSNorm"]


def _check_eps(cls: type, options: Mapping[str, Any]) -> None:
    try:
        real("eps", options["eps"], low=0.0, low_open=True)
    except Exception as e:
        raise LayerOptionError(
            f"`{cls.__name__}` eps is {options['eps']!r}; it must be a number > 0",
            fix=f"use e.g. `{cls.__name__.split('[')[0]}.of(eps=1e-5)`",
        ) from e


class LayerNorm(Layer):
    """`(x - mean) / sqrt(var + eps) * scale + bias` over the last axis.

    Dims: `D`. Fields: `scale [D]` (ones), `bias [D]` (zeros), both without weight decay.
    Option: `eps` (default 1e-5).
    """

    dims = Dims(D=32)
    scale: Float[Array, " D"] = param(ones, decay=False)
    bias: Float[Array, " D"] = param(zeros, decay=False)
    eps: float = static(default=1e-5)

    @classmethod
    def _check(cls, dims, options) -> None:
        _check_eps(cls, options)

    def __call__(self, x: Float[Array, "*b D"]) -> Float[Array, "*b D"]:
        """Normalizes `[*b D]` over `D`."""
        return _layer_norm(self, x)


class RMSNorm(Layer):
    """`x / sqrt(mean(x ** 2) + eps) * scale` over the last axis.

    Dims: `D`. Field: `scale [D]` (ones, without weight decay). Option: `eps` (default 1e-6).
    """

    dims = Dims(D=32)
    scale: Float[Array, " D"] = param(ones, decay=False)
    eps: float = static(default=1e-6)

    @classmethod
    def _check(cls, dims, options) -> None:
        _check_eps(cls, options)

    def __call__(self, x: Float[Array, "*b D"]) -> Float[Array, "*b D"]:
        """Normalizes `[*b D]` by its root mean square over `D`."""
        return _rms_norm(self, x)


@shaped
def _layer_norm(m: LayerNorm, x: Float[Array, "*b D"]) -> Float[Array, "*b D"]:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    lead = (1,) * (x.ndim - 1)  # explicit broadcasting: the suite forbids rank promotion
    y = (x - mean) * jnp.reciprocal(jnp.sqrt(var + m.eps))
    return y * m.scale.reshape(lead + m.scale.shape) + m.bias.reshape(lead + m.bias.shape)


@shaped
def _rms_norm(m: RMSNorm, x: Float[Array, "*b D"]) -> Float[Array, "*b D"]:
    ms = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    lead = (1,) * (x.ndim - 1)
    return x * jnp.reciprocal(jnp.sqrt(ms + m.eps)) * m.scale.reshape(lead + m.scale.shape)
