"""Fan-in initializers: weights scaled by `1 / sqrt(fan_in)`, so activations keep their scale."""

from __future__ import annotations

import dataclasses
import math

import jax

from .._errors import ArgumentTypeError
from .._traceback import api_boundary
from .._validate import choice, integer, real, shorten
from ..models._initializers import Initializer, draw_flat

__all__ = ["fan_in"]


@dataclasses.dataclass(frozen=True, repr=False)
class _FanIn(Initializer):
    axes: tuple[int, ...]
    gain: float
    distribution: str
    random = True
    floating_only = True

    def __call__(self, key, shape, dtype):
        fan = math.prod(shape[a] for a in self.axes) if shape else 1
        std = self.gain / math.sqrt(max(fan, 1))
        if self.distribution == "normal":
            return std * draw_flat(jax.random.normal, key, shape, dtype)
        # uniform on [-a, a] has std a / sqrt(3): the same std as the normal rule
        bound = std * math.sqrt(3.0)
        return draw_flat(jax.random.uniform, key, shape, dtype, minval=-bound, maxval=bound)

    def __repr__(self) -> str:
        args = [] if self.axes == (0,) else [f"axes={self.axes}"]
        args += [] if self.gain == 1.0 else [f"gain={self.gain}"]
        args += [] if self.distribution == "normal" else [f"distribution={self.distribution!r}"]
        return f"fan_in({', '.join(args)})"


@api_boundary
def fan_in(
    gain: float = 1.0, *, axes: tuple[int, ...] = (0,), distribution: str = "normal"
) -> Initializer:
    """Draws with standard deviation `gain / sqrt(fan_in)`, `fan_in` the product of `axes`' sizes.

    `gain=1` is LeCun scaling (the default of every `nn` weight); `gain=sqrt(2)` is He scaling for
    ReLU networks. `distribution="uniform"` draws from `[-a, a]` with the same standard deviation.

    Args:
        gain: the scale, > 0.
        axes: the axes of the field's shape that are summed over in the layer's product (a
            Linear's `w [In Out]`: `(0,)`; a Conv2d's `w [Co Ci K K]`: `(1, 2, 3)`).
        distribution: `"normal"` or `"uniform"`.

    Example:
        >>> w: Float[Array, "In Out"] = sm.param(nn.fan_in(gain=2 ** 0.5))
    """
    gain = real("gain", gain, low=0.0, low_open=True)
    if not isinstance(axes, tuple) or not axes:
        raise ArgumentTypeError(
            f"`axes` must be a non-empty tuple of axis numbers, got {shorten(axes)}",
            fix="pass e.g. axes=(0,) for a [In Out] weight",
        )
    axes = tuple(integer("axes", a, low=0) for a in axes)
    return _FanIn(axes, gain, choice("distribution", distribution, ("normal", "uniform")))
