"""`nn.Dropout`: zeroes each element with probability `rate` and scales the rest by
`1 / (1 - rate)`; an explicit key turns it on, no key (evaluation) is the identity."""

from __future__ import annotations

import typing
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from .._shaped import shaped
from .._traceback import api_boundary
from ..models import static
from ._errors import LayerOptionError
from ._layer import Layer

__all__ = ["Dropout"]


@api_boundary
class Dropout(Layer):
    """Dropout with a rate in `[0, 1)` (option `rate`, default 0.1); it has no fields to train.

    Example:
        >>> drop: nn.Dropout = sm.submodel(nn.Dropout, rate=0.2)
        >>> y = net.drop(x, key=key)      # training: a fresh key per step
        >>> y = net.drop(x)               # evaluation: y is x
        >>> nn.Dropout(rate=0.2)          # on its own
    """

    rate: float = static(default=0.1)

    @classmethod
    @typing.no_type_check  # validates its arguments itself, with coded errors
    def init(cls, seed: Any = 0, *, rate: float = 0.1, max_bytes: int | None = None) -> Dropout:
        """A new `Dropout` (it has no tensors: `seed` draws nothing; keys come per call).

        Args:
            seed: accepted as by every `init`; unused.
            rate: the probability of zeroing each element, in `[0, 1)`.
            max_bytes: as for `sm.Model.init`.
        """
        return super().init(seed, max_bytes=max_bytes, rate=rate)

    @classmethod
    def _check(cls, dims, options) -> None:
        r = options["rate"]
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 <= r < 1:
            raise LayerOptionError(
                f"`{cls.__name__}` rate is {r!r}; it must be a number in [0, 1)",
                fix="use e.g. `nn.Dropout(rate=0.1)` (rate 1 would drop everything)",
            )

    @shaped
    def __call__(
        self, x: Float[Array, "*s"], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, "*s"]:
        """`x` with dropout drawn from `key`; `key=None` (evaluation) returns `x` unchanged."""
        if key is None or self.rate == 0:
            return x
        keep = jax.random.bernoulli(key, 1.0 - self.rate, x.shape)
        return jnp.where(keep, x / (1.0 - self.rate), jnp.zeros((), x.dtype))
