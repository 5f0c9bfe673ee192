"""`nn.Conv2d`: a 2-D convolution over `[b Ci h w]` images (channels first), with stride and
zero padding."""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any

from jax import lax
from jaxtyping import Array, Float

from .._shaped import shaped
from .._traceback import api_boundary
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
                fix=f"use e.g. `sm.submodel(nn.{owner}, {name}={max(low, 1)})`",
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


@api_boundary
class Conv2d(Layer):
    """`y[b, o] = sum_i w[o, i] * x[b, i] + b[o]`, `K x K` windows (cross-correlation, as in
    PyTorch), channels first.

    Dims: `Ci` (input channels), `Co` (output channels), `K` (kernel size). Fields: `w [Co Ci K K]`
    (`nn.fan_in(axes=(1, 2, 3))`), `b [Co]` (zeros, no weight decay; None with `bias=False`).
    Options: `stride` (default 1), `padding` (zeros on each side, default 0), `bias` (default
    True).

    Example:
        >>> conv: nn.Conv2d = sm.submodel(nn.Conv2d, Ci="C", Co="2 * C", padding=1)
        >>> y = net.conv(x)               # [b C h w] -> [b 2C h w]
    """

    dims = Dims(Ci=1, Co=8, K=3)
    w: Float[Array, "Co Ci K K"] = param(fan_in(axes=(1, 2, 3)))
    b: Float[Array, " Co"] | None = param(zeros, decay=False, when="bias")
    stride: int = static(default=1)
    padding: int = static(default=0)
    bias: bool = static(default=True)

    @classmethod
    @typing.no_type_check  # validates its arguments itself, with coded errors
    def init(
        cls,
        seed: Any = 0,
        *,
        Ci: int = 1,
        Co: int = 8,
        K: int = 3,
        stride: int = 1,
        padding: int = 0,
        bias: bool = True,
        max_bytes: int | None = None,
    ) -> Conv2d:
        """A new `Conv2d` drawn from `seed`.

        Args:
            seed: a whole number, a `jax.random.key` or an int array (as `sm.Model.init`).
            Ci: input channels.
            Co: output channels.
            K: kernel size (`K x K` windows).
            stride: the step between windows, >= 1.
            padding: zeros added on each side of the height and width, >= 0.
            bias: whether the layer has the bias `b [Co]`.
            max_bytes: the most the layer may hold (default 16 GiB).
        """
        return super().init(
            seed, max_bytes=max_bytes, Ci=Ci, Co=Co, K=K, stride=stride, padding=padding, bias=bias
        )

    @classmethod
    def _check(cls, dims, options) -> None:
        check_window(cls.__name__, options, "", allow_none=False)
        if not isinstance(options["bias"], bool):
            raise LayerOptionError(
                f"`Conv2d` bias is {options['bias']!r}; it must be True or False",
                fix="use `sm.submodel(nn.Conv2d, bias=False)` for a layer without bias",
            )

    @shaped
    def __call__(self, x: Float[Array, "b Ci h w"]) -> Float[Array, "b Co oh ow"]:
        """`[b Ci h w] -> [b Co oh ow]`, `oh = (h + 2 * padding - K) // stride + 1`."""
        k, s, p = self.dims.K, self.stride, self.padding
        for n, axis in ((x.shape[2], "height"), (x.shape[3], "width")):
            out_size(type(self).__name__, n, k, s, p, axis)
        dimension_numbers = ("NCHW", "OIHW", "NCHW")
        w = self.w.astype(x.dtype)
        y = lax.conv_general_dilated(
            x, w, (s, s), ((p, p), (p, p)), dimension_numbers=dimension_numbers
        )
        return y if self.b is None else y + self.b[None, :, None, None]
