"""`nn.Linear`: `y = x @ w + b` over the last axis, `w [In Out]` fan-in scaled, `b [Out]`."""

from __future__ import annotations

from typing import Any

from jaxtyping import Array, Float

from .._shaped import shaped
from ..models import Dims, param, zeros
from ._init import fan_in
from ._layer import Layer

__all__ = ["Linear"]


class _Weight(Layer):
    """The bias-free projection `y = x @ w` (what `Linear.of(bias=False)` builds on)."""

    dims = Dims(In=32, Out=32)
    w: Float[Array, "In Out"] = param(fan_in())

    def __call__(self, x: Float[Array, "*b In"]) -> Float[Array, "*b Out"]:
        """`x @ w (+ b)`: `[*b In] -> [*b Out]`, checked against the layer's dims."""
        return _linear(self, x)


class Linear(_Weight):
    """A dense layer: `y = x @ w + b`.

    Dims: `In`, `Out`. Fields: `w [In Out]` (`nn.fan_in()`), `b [Out]` (zeros, no weight decay).
    `Linear.of(bias=False)` drops the bias; it shares the forward, but is a sibling class of
    `Linear` (both derive from the same base), so test for it with `"b" in sm.params(layer)`.

    Example:
        >>> class Block(sm.Model):
        ...     dims = sm.Dims(D=32, F="4 * D")
        ...     up: nn.Linear = sm.submodel(nn.Linear.of(In="D", Out="F"))
        >>> y = block.up(x)                       # x [b D] -> y [b F]
    """

    b: Float[Array, " Out"] = param(zeros, decay=False)
    _variant_options = {"bias": (True, False)}

    @classmethod
    def _variant(cls, **variant: Any) -> type:
        return cls if variant.get("bias", True) else _Weight


@shaped
def _linear(m: _Weight, x: Float[Array, "*b In"]) -> Float[Array, "*b Out"]:
    y = x @ m.w
    if not isinstance(m, Linear):
        return y
    return y + m.b.reshape((1,) * (y.ndim - 1) + m.b.shape)  # explicit: no rank promotion
