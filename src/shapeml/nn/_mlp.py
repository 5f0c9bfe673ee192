"""`nn.MLP`: two Linears with an activation between, `D -> F -> D`."""

from __future__ import annotations

import jax
from jaxtyping import Array, Float

from .._shaped import shaped
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


class MLP(Layer):
    """`down(act(up(x)))`: `[*b D] -> [*b F] -> [*b D]`.

    Dims: `D`, `F`. Sub-models: `up` (`Linear` `D -> F`), `down` (`Linear` `F -> D`), both with
    biases. Option: `activation`, one of `"gelu"` (tanh form, the default), `"relu"`, `"silu"`,
    `"tanh"`.

    Example:
        >>> mlp: nn.MLP = sm.submodel(nn.MLP.of(F="4 * D"))     # parent dims: D
    """

    dims = Dims(D=32, F=128)
    up: Linear = submodel(Linear.of(In="D", Out="F"))
    down: Linear = submodel(Linear.of(In="F", Out="D"))
    activation: str = static(default="gelu")

    @classmethod
    def _check(cls, dims, options) -> None:
        act = options["activation"]
        if not isinstance(act, str) or act not in _ACTIVATIONS:
            raise LayerOptionError(
                f"`MLP` activation is {shorten(act)}; it must be one of {', '.join(_ACTIVATIONS)}",
                fix='use e.g. `nn.MLP.of(activation="relu")`',
            )

    def __call__(self, x: Float[Array, "*b D"]) -> Float[Array, "*b D"]:
        """`[*b D] -> [*b D]` through the hidden width `F`."""
        return _mlp(self, x)


@shaped
def _mlp(m: MLP, x: Float[Array, "*b D"]) -> Float[Array, "*b D"]:
    return m.down(_ACTIVATIONS[m.activation](m.up(x)))
