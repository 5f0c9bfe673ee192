"""`nn.MLP`: two Linears with an activation between, `D -> F -> D`."""

from __future__ import annotations

import typing
from typing import Any

import jax
from jaxtyping import Array, Float

from .._shaped import shaped
from .._traceback import api_boundary
from .._validate import shorten
from ..models import Dims, static, submodel
from ._errors import LayerOptionError
from ._layer import Layer
from ._linear import Linear

__all__ = ["MLP"]

_ACTIVATIONS = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=True),  # the tanh form, as in GPT-2
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "tanh": jax.numpy.tanh,
}


@api_boundary
class MLP(Layer):
    """`down(act(up(x)))`: `[*b D] -> [*b F] -> [*b D]`.

    Dims: `D`, `F`. Sub-models: `up` (`Linear` `D -> F`), `down` (`Linear` `F -> D`), both with
    biases. Option: `activation`, one of `"gelu"` (tanh form, the default), `"relu"`, `"silu"`,
    `"tanh"`. A rule table reaches the sub-layers by these names: `{"F": "model"}` splits
    `up.w`'s `Out` axis and `down.w`'s `In` axis.

    Example:
        >>> mlp: nn.MLP = sm.submodel(nn.MLP, F="4 * D")     # parent dims: D
    """

    dims = Dims(D=32, F=128)
    up: Linear = submodel(Linear, In="D", Out="F")
    down: Linear = submodel(Linear, In="F", Out="D")
    activation: str = static(default="gelu")

    @classmethod
    @typing.no_type_check  # validates its arguments itself, with coded errors
    def init(
        cls,
        seed: Any = 0,
        *,
        D: int = 32,
        F: int = 128,
        activation: str = "gelu",
        max_bytes: int | None = None,
    ) -> MLP:
        """A new `MLP` drawn from `seed`.

        Args:
            seed: a whole number, a `jax.random.key` or an int array (as `sm.Model.init`).
            D: input and output width.
            F: hidden width.
            activation: `"gelu"` (tanh form), `"relu"`, `"silu"` or `"tanh"`.
            max_bytes: the most the layer may hold (default 16 GiB).
        """
        return super().init(seed, max_bytes=max_bytes, D=D, F=F, activation=activation)

    @classmethod
    def _check(cls, dims, options) -> None:
        act = options["activation"]
        if not isinstance(act, str) or act not in _ACTIVATIONS:
            raise LayerOptionError(
                f"`MLP` activation is {shorten(act)}; it must be one of {', '.join(_ACTIVATIONS)}",
                fix='use e.g. `sm.submodel(nn.MLP, activation="relu")`',
            )

    @shaped
    def __call__(self, x: Float[Array, "*b D"]) -> Float[Array, "*b D"]:
        """`[*b D] -> [*b D]` through the hidden width `F`."""
        return self.down(_ACTIVATIONS[self.activation](self.up(x)))
