"""`nn.Linear`: `y = x @ w + b` over the last axis, `w [In Out]` fan-in scaled, `b [Out]`."""

from __future__ import annotations

import typing
from typing import Any

from jaxtyping import Array, Float

from .._shaped import shaped
from .._traceback import api_boundary
from ..models import Dims, param, static, zeros
from ._dense import dense
from ._errors import LayerOptionError
from ._init import fan_in
from ._layer import Layer

__all__ = ["Linear"]


@api_boundary
class Linear(Layer):
    """A dense layer: `y = x @ w + b`, `[*b In] -> [*b Out]`.

    Dims: `In`, `Out`. Fields: `w [In Out]` (`nn.fan_in()`), `b [Out]` (zeros, no weight decay),
    present when `bias` is True (the default); with `bias=False`, `b` is None and no
    checkpoint, optimizer or rule table lists it.

    Example:
        >>> class Block(sm.Model):
        ...     dims = sm.Dims(D=32, F="4 * D")
        ...     up: nn.Linear = sm.submodel(nn.Linear, In="D", Out="F")
        ...     proj: nn.Linear = sm.submodel(nn.Linear, In="F", Out="D", bias=False)
        >>> y = block.up(x)                       # x [b D] -> y [b F]
    """

    dims = Dims(In=32, Out=32)
    w: Float[Array, "In Out"] = param(fan_in())
    b: Float[Array, " Out"] | None = param(zeros, decay=False, when="bias")
    bias: bool = static(default=True)

    @classmethod
    @typing.no_type_check  # validates its arguments itself, with coded errors
    def init(
        cls,
        seed: Any = 0,
        *,
        In: int = 32,
        Out: int = 32,
        bias: bool = True,
        max_bytes: int | None = None,
    ) -> Linear:
        """A new `Linear` drawn from `seed`.

        Args:
            seed: a whole number, a `jax.random.key` or an int array (as `sm.Model.init`).
            In: input width.
            Out: output width.
            bias: whether the layer has the bias `b [Out]`.
            max_bytes: the most the layer may hold (default 16 GiB).

        Example:
            >>> nn.Linear.init(seed=0, In=4, Out=3, bias=False).b is None
            True
        """
        return super().init(seed, max_bytes=max_bytes, In=In, Out=Out, bias=bias)

    @classmethod
    def _check(cls, dims, options) -> None:
        if not isinstance(options["bias"], bool):
            raise LayerOptionError(
                f"`Linear` bias is {options['bias']!r}; it must be True or False",
                fix="use `nn.Linear.of(bias=False)` for a layer without bias",
            )

    @shaped
    def __call__(self, x: Float[Array, "*b In"]) -> Float[Array, "*b Out"]:
        """`x @ w (+ b)`: `[*b In] -> [*b Out]`, checked against the layer's dims."""
        y = dense(x, self.w)  # x @ w, with a weight gradient XLA:CPU runs well (see _dense)
        if self.b is None:
            return y
        return y + self.b.reshape((1,) * (y.ndim - 1) + self.b.shape)  # explicit: no rank promotion
