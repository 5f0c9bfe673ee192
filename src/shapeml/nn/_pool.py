"""`nn.MaxPool2d` and `nn.AvgPool2d`: windows over `[b c h w]` images, no parameters."""

from __future__ import annotations

import typing
from typing import Any

import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float

from .._shaped import shaped
from .._traceback import api_boundary
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

    @shaped
    def __call__(self, x: Float[Array, "b c h w"]) -> Float[Array, "b c oh ow"]:
        """`[b c h w] -> [b c oh ow]`, `oh = (h + 2 * padding - window) // stride + 1`."""
        w, p = self.window, self.padding
        s = w if self.stride is None else self.stride
        for n, axis in ((x.shape[2], "height"), (x.shape[3], "width")):
            out_size(type(self).__name__, n, w, s, p, axis)
        dims, strides, pads = (1, 1, w, w), (1, 1, s, s), ((0, 0), (0, 0), (p, p), (p, p))
        if isinstance(self, MaxPool2d):
            return lax.reduce_window(x, -jnp.inf, lax.max, dims, strides, pads)
        total = lax.reduce_window(x, 0.0, lax.add, dims, strides, pads)
        return total / (w * w)


@api_boundary
class MaxPool2d(_Pool):
    """The maximum of each `window x window` patch (padding never wins: it is -inf).

    Options: `window` (default 2), `stride` (default: the window), `padding` (default 0).

    Example:
        >>> pool: nn.MaxPool2d = sm.submodel(nn.MaxPool2d, window=2)
        >>> pool = nn.MaxPool2d(window=3, stride=1, padding=1)     # on its own
    """

    @classmethod
    @typing.no_type_check  # validates its arguments itself, with coded errors
    def init(
        cls,
        seed: Any = 0,
        *,
        window: int = 2,
        stride: int | None = None,
        padding: int = 0,
        max_bytes: int | None = None,
    ) -> MaxPool2d:
        """A new `MaxPool2d` (it has no tensors: `seed` draws nothing).

        Args:
            seed: accepted as by every `init`; unused.
            window: the side of each `window x window` patch, >= 1.
            stride: the step between patches, >= 1; None (the default) is the window.
            padding: -inf added on each side of the height and width, at most `window // 2`.
            max_bytes: as for `sm.Model.init`.
        """
        return super().init(
            seed, window=window, stride=stride, padding=padding, max_bytes=max_bytes
        )


@api_boundary
class AvgPool2d(_Pool):
    """The mean of each `window x window` patch; zero padding counts in the mean (as PyTorch's
    default `count_include_pad=True`).

    Options: `window` (default 2), `stride` (default: the window), `padding` (default 0).
    """

    @classmethod
    @typing.no_type_check  # validates its arguments itself, with coded errors
    def init(
        cls,
        seed: Any = 0,
        *,
        window: int = 2,
        stride: int | None = None,
        padding: int = 0,
        max_bytes: int | None = None,
    ) -> AvgPool2d:
        """A new `AvgPool2d` (it has no tensors: `seed` draws nothing).

        Args:
            seed: accepted as by every `init`; unused.
            window: the side of each `window x window` patch, >= 1.
            stride: the step between patches, >= 1; None (the default) is the window.
            padding: zeros added on each side of the height and width (counted in the mean),
                at most `window // 2`.
            max_bytes: as for `sm.Model.init`.
        """
        return super().init(
            seed, window=window, stride=stride, padding=padding, max_bytes=max_bytes
        )
