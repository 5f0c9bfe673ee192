"""`nn.Conv2d`: a 2-D convolution over `[b Ci h w]` images (channels first), with stride and
zero padding."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jax import lax
from jaxtyping import Array, Float

from .._shaped import shaped
from .._validate import shorten
from ..models import Dims, param, static, zeros
from ._errors import LayerInputError, LayerOptionError
from ._init import fan_in
from ._layer import Layer

__all__ = ["Conv2d", "check_window"]


def check_window(owner: str, options: Mapping[str, Any], size: str, allow_none: bool) -> None:
    """Raises E1802 unless `stride` >= 1 (or None where allowed) and `padding` >= 0 are whole
    numbers (and `size`, the window option's name, >= 1 when given)."""
    rules = [("stride", 1), ("padding", 0)] + ([(size, 1)] if size else [])
    for name, low in rules:
        v = options[name]
        if v is None and allow_none and name == "stride":
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise LayerOptionError(
                f"`{owner}` {name} is {shorten(v)}; it must be a whole number >= {low}",
                fix=f"use e.g. `{owner.split('[')[0]}.of({name}={max(low, 1)})`",
            )


def out_size(owner: str, n: int, window: int, stride: int, padding: int, axis: str) -> int:
    """The output length of a window sliding over `n` (+ padding); E1803 if it does not fit."""
    if n + 2 * padding < window:
        raise LayerInputError(
            f"`{owner}`: the input's {axis} is {n}, padded {n + 2 * padding}, smaller than the "
            f"window {window}",
            fix=f"pass inputs with {axis} >= {window - 2 * padding}, or pad more",
        )
    return (n + 2 * padding - window) // stride + 1


class Conv2d(Layer):
    """`y[b, o] = sum_i w[o, i] * x[b, i] + b[o]`, `K x K` windows (cross-correlation, as in
    PyTorch), channels first.

    Dims: `Ci` (input channels), `Co` (output channels), `K` (kernel size). Fields: `w [Co Ci K K]`
    (`nn.fan_in(axes=(1, 2, 3))`), `b [Co]` (zeros, no weight decay). Options: `stride` (default
    1), `padding` (zeros on each side, default 0).

    Example:
        >>> conv: nn.Conv2d = sm.submodel(nn.Conv2d.of(Ci="C", Co="2 * C", padding=1))
        >>> y = net.conv(x)               # [b C h w] -> [b 2C h w]
    """

    dims = Dims(Ci=1, Co=8, K=3)
    w: Float[Array, "Co Ci K K"] = param(fan_in(axes=(1, 2, 3)))
    b: Float[Array, " Co"] = param(zeros, decay=False)
    stride: int = static(default=1)
    padding: int = static(default=0)

    @classmethod
    def _check(cls, dims, options) -> None:
        check_window(cls.__name__, options, "", allow_none=False)

    def __call__(self, x: Float[Array, "b Ci h w"]) -> Float[Array, "b Co oh ow"]:
        """`[b Ci h w] -> [b Co oh ow]`, `oh = (h + 2 * padding - K) // stride + 1`."""
        return _conv(self, x)


@shaped
def _conv(m: Conv2d, x: Float[Array, "b Ci h w"]) -> Float[Array, "b Co oh ow"]:
    k, s, p = m.dims.K, m.stride, m.padding
    for n, axis in ((x.shape[2], "height"), (x.shape[3], "width")):
        out_size(type(m).__name__, n, k, s, p, axis)
    y = lax.conv_general_dilated(
        x, m.w.astype(x.dtype), (s, s), ((p, p), (p, p)), dimension_numbers=("NCHW", "OIHW", "NCHW")
    )
    return y + m.b[None, :, None, None]
