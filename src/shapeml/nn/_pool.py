"""`nn.MaxPool2d` and `nn.AvgPool2d`: windows over `[b c h w]` images, no parameters."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float

from .._shaped import shaped
from ..models import static
from ._conv import check_window, out_size
from ._errors import LayerOptionError
from ._layer import Layer

__all__ = ["AvgPool2d", "MaxPool2d"]


class _Pool(Layer):
    window: int = static(default=2)
    stride: int | None = static(default=None)  # None: the window (windows do not overlap)
    padding: int = static(default=0)

    @classmethod
    def _check(cls, dims, options) -> None:
        check_window(cls.__name__, options, "window", allow_none=True)
        if options["padding"] > options["window"] // 2:  # a window of padding alone
            raise LayerOptionError(
                f"`{cls.__name__}` padding is {options['padding']} with window "
                f"{options['window']}: a window could hold padding only",
                fix=f"use padding <= window // 2 = {options['window'] // 2}",
            )

    def __call__(self, x: Float[Array, "b c h w"]) -> Float[Array, "b c oh ow"]:
        """`[b c h w] -> [b c oh ow]`, `oh = (h + 2 * padding - window) // stride + 1`."""
        return _pool(self, x)


class MaxPool2d(_Pool):
    """The maximum of each `window x window` patch (padding never wins: it is -inf).

    Options: `window` (default 2), `stride` (default: the window), `padding` (default 0).

    Example:
        >>> pool: nn.MaxPool2d = sm.submodel(nn.MaxPool2d.of(window=2))
    """


class AvgPool2d(_Pool):
    """The mean of each `window x window` patch; zero padding counts in the mean (as PyTorch's
    default `count_include_pad=True`).

    Options: `window` (default 2), `stride` (default: the window), `padding` (default 0).
    """


@shaped
def _pool(m: _Pool, x: Float[Array, "b c h w"]) -> Float[Array, "b c oh ow"]:
    w, p = m.window, m.padding
    s = w if m.stride is None else m.stride
    for n, axis in ((x.shape[2], "height"), (x.shape[3], "width")):
        out_size(type(m).__name__, n, w, s, p, axis)
    dims, strides, pads = (1, 1, w, w), (1, 1, s, s), ((0, 0), (0, 0), (p, p), (p, p))
    if isinstance(m, MaxPool2d):
        return lax.reduce_window(x, -jnp.inf, lax.max, dims, strides, pads)
    total = lax.reduce_window(x, 0.0, lax.add, dims, strides, pads)
    return total / (w * w)
