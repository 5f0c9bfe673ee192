"""`nn.LayerNorm` and `nn.RMSNorm` over the last axis `D`, each with a learned scale (and a shift,
unless `LayerNorm(bias=False)`)."""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._shaped import shaped
from .._traceback import api_boundary
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
            fix=f"use e.g. `sm.submodel(nn.{cls.__name__}, eps=1e-5)`",
        ) from e


def _check_bool(cls: type, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise LayerOptionError(
            f"`{cls.__name__}` {name} is {value!r}; it must be True or False",
            fix=f"use e.g. `sm.submodel(nn.{cls.__name__}, {name}=False)`",
        )


def _f32(x: jax.Array | np.ndarray) -> jax.Array | np.ndarray:
    """`x` in float32 for statistics (bfloat16 and float16 sums lose digits); wider stays."""
    return x.astype(jnp.float32) if jnp.finfo(x.dtype).bits < 32 else x


@api_boundary
class LayerNorm(Layer):
    """`(x - mean) / sqrt(var + eps) * scale + shift` over the last axis.

    Dims: `D`. Fields: `scale [D]` (ones), `shift [D]` (zeros, present when `bias` is True, the
    default), both without weight decay. Options: `eps` (default 1e-5), `bias`: with
    `bias=False` there is no shift (`torch.nn.LayerNorm(D, bias=False)`), `shift` is None and
    no checkpoint, optimizer or rule table lists it.

    Example:
        >>> ln: nn.LayerNorm = sm.submodel(nn.LayerNorm, bias=False)     # parent dims: D
        >>> nn.LayerNorm.init(seed=0, D=8, bias=False).shift is None
        True
    """

    dims = Dims(D=32)
    scale: Float[Array, " D"] = param(ones, decay=False)
    shift: Float[Array, " D"] | None = param(zeros, decay=False, when="bias")
    eps: float = static(default=1e-5)
    bias: bool = static(default=True)

    @classmethod
    @typing.no_type_check  # validates its arguments itself, with coded errors
    def init(
        cls,
        seed: Any = 0,
        *,
        D: int = 32,
        eps: float = 1e-5,
        bias: bool = True,
        max_bytes: int | None = None,
    ) -> LayerNorm:
        """A new `LayerNorm` (scale ones, shift zeros).

        Args:
            seed: a whole number, a `jax.random.key` or an int array (as `sm.Model.init`).
            D: width of the normalized axis.
            eps: added to the variance, > 0.
            bias: whether the layer has the shift `shift [D]`.
            max_bytes: the most the layer may hold (default 16 GiB).
        """
        return super().init(seed, max_bytes=max_bytes, D=D, eps=eps, bias=bias)

    @classmethod
    def _check(cls, dims, options) -> None:
        _check_eps(cls, options)
        _check_bool(cls, "bias", options["bias"])

    @shaped
    def __call__(self, x: Float[Array, "*b D"]) -> Float[Array, "*b D"]:
        """Normalizes `[*b D]` over `D` (statistics in float32 whatever `x`'s dtype)."""
        xf = _f32(x)
        mean = jnp.mean(xf, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
        lead = (1,) * (x.ndim - 1)  # explicit broadcasting: the suite forbids rank promotion
        y = ((xf - mean) * jnp.reciprocal(jnp.sqrt(var + self.eps))).astype(x.dtype)
        y = y * self.scale.reshape(lead + self.scale.shape)
        if self.shift is None:
            return y
        return y + self.shift.reshape(lead + self.shift.shape)


@api_boundary
class RMSNorm(Layer):
    """`x / sqrt(mean(x ** 2) + eps) * scale` over the last axis.

    Dims: `D`. Field: `scale [D]` (ones, without weight decay). Option: `eps` (default 1e-6).
    """

    dims = Dims(D=32)
    scale: Float[Array, " D"] = param(ones, decay=False)
    eps: float = static(default=1e-6)

    @classmethod
    @typing.no_type_check  # validates its arguments itself, with coded errors
    def init(
        cls, seed: Any = 0, *, D: int = 32, eps: float = 1e-6, max_bytes: int | None = None
    ) -> RMSNorm:
        """A new `RMSNorm` (scale ones).

        Args:
            seed: a whole number, a `jax.random.key` or an int array (as `sm.Model.init`).
            D: width of the normalized axis.
            eps: added to the mean square, > 0.
            max_bytes: the most the layer may hold (default 16 GiB).
        """
        return super().init(seed, max_bytes=max_bytes, D=D, eps=eps)

    @classmethod
    def _check(cls, dims, options) -> None:
        _check_eps(cls, options)

    @shaped
    def __call__(self, x: Float[Array, "*b D"]) -> Float[Array, "*b D"]:
        """Normalizes `[*b D]` by its root mean square over `D` (in float32 whatever `x`'s
        dtype)."""
        xf = _f32(x)
        ms = jnp.mean(jnp.square(xf), axis=-1, keepdims=True)
        lead = (1,) * (x.ndim - 1)
        scale = self.scale.reshape(lead + self.scale.shape)
        return (xf * jnp.reciprocal(jnp.sqrt(ms + self.eps))).astype(x.dtype) * scale
