"""`nn.MLP`: two Linears with an activation between, `D -> F -> D`, with or without biases."""

from __future__ import annotations

import typing
from typing import Any

import jax
from jaxtyping import Array, Float

from .._shaped import shaped
from .._traceback import api_boundary
from .._validate import shorten
from ..models import Dims, static, submodel
from ..models._mapped import Inherit
from ._errors import LayerOptionError
from ._layer import Layer
from ._linear import Linear

__all__ = ["MLP"]

# By PyTorch's names: "gelu" is torch.nn.GELU() (exact, erf), "gelu_tanh" its approximate="tanh"
# (transformers' gelu_new, GPT-2's).
_ACTIVATIONS = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "tanh": jax.numpy.tanh,
}


@api_boundary
class MLP(Layer):
    """`down(act(up(x)))`: `[*b D] -> [*b F] -> [*b D]`.

    Dims: `D`, `F`. Sub-models: `up` (`Linear` `D -> F`), `down` (`Linear` `F -> D`), both with
    biases unless `bias=False` (then `up.b` and `down.b` are None). Option: `activation`, one of
    `"gelu_tanh"` (the tanh form, `torch.nn.GELU(approximate="tanh")`, GPT-2's; the default),
    `"gelu"` (exact, with erf: `torch.nn.GELU()`), `"relu"`, `"silu"`, `"tanh"`. A rule table
    reaches the sub-layers by these names: `{"F": "model"}` splits `up.w`'s `Out` axis and
    `down.w`'s `In` axis.

    Example:
        >>> mlp: nn.MLP = sm.submodel(nn.MLP, F="4 * D")     # parent dims: D
        >>> mlp: nn.MLP = sm.submodel(nn.MLP, F="4 * D", activation="gelu", bias=False)
    """

    dims = Dims(D=32, F=128)
    up: Linear = submodel(Linear, In="D", Out="F", bias=Inherit("bias"))
    down: Linear = submodel(Linear, In="F", Out="D", bias=Inherit("bias"))
    activation: str = static(default="gelu_tanh")
    bias: bool = static(default=True)

    @classmethod
    @typing.no_type_check  # validates its arguments itself, with coded errors
    def init(
        cls,
        seed: Any = 0,
        *,
        D: int = 32,
        F: int = 128,
        activation: str = "gelu_tanh",
        bias: bool = True,
        max_bytes: int | None = None,
    ) -> MLP:
        """A new `MLP` drawn from `seed`.

        Args:
            seed: a whole number, a `jax.random.key` or an int array (as `sm.Model.init`).
            D: input and output width.
            F: hidden width.
            activation: `"gelu_tanh"` (tanh form), `"gelu"` (exact, erf), `"relu"`, `"silu"`
                or `"tanh"`.
            bias: whether `up` and `down` have biases.
            max_bytes: the most the layer may hold (default 16 GiB).

        Example:
            >>> nn.MLP.init(seed=0, D=4, F=16, bias=False).up.b is None
            True
        """
        return super().init(seed, max_bytes=max_bytes, D=D, F=F, activation=activation, bias=bias)

    @classmethod
    def _check(cls, dims, options) -> None:
        act = options["activation"]
        if not isinstance(act, str) or act not in _ACTIVATIONS:
            raise LayerOptionError(
                f"`MLP` activation is {shorten(act)}; it must be one of {', '.join(_ACTIVATIONS)}",
                fix='use e.g. `sm.submodel(nn.MLP, activation="relu")`',
            )
        if not isinstance(options["bias"], bool):
            raise LayerOptionError(
                f"`MLP` bias is {options['bias']!r}; it must be True or False",
                fix="use e.g. `sm.submodel(nn.MLP, bias=False)`",
            )

    @shaped
    def __call__(self, x: Float[Array, "*b D"]) -> Float[Array, "*b D"]:
        """`[*b D] -> [*b D]` through the hidden width `F`."""
        return self.down(_ACTIVATIONS[self.activation](self.up(x)))
