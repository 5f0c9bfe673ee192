"""`nn.Dropout`: zeroes each element with probability `rate` and scales the rest by
`1 / (1 - rate)`; an explicit key turns it on, no key (evaluation) is the identity."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from .._shaped import shaped
from ..models import static
from ._errors import LayerOptionError
from ._layer import Layer

__all__ = ["Dropout"]


class Dropout(Layer):
    """Dropout with a rate in `[0, 1)` (option `rate`, default 0.1); it has no fields to train.

    Example:
        >>> drop: nn.Dropout = sm.submodel(nn.Dropout.of(rate=0.2))
        >>> y = net.drop(x, key=key)      # training: a fresh key per step
        >>> y = net.drop(x)               # evaluation: y is x
    """

    rate: float = static(default=0.1)

    @classmethod
    def _check(cls, dims, options) -> None:
        r = options["rate"]
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 <= r < 1:
            raise LayerOptionError(
                f"`{cls.__name__}` rate is {r!r}; it must be a number in [0, 1)",
                fix="use e.g. `nn.Dropout.of(rate=0.1)` (rate 1 would drop everything)",
            )

    def __call__(
        self, x: Float[Array, "*s"], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, "*s"]:
        """`x` with dropout drawn from `key`; `key=None` (evaluation) returns `x` unchanged."""
        return _dropout(self, x, key)


@shaped
def _dropout(m: Dropout, x: Float[Array, "*s"], key: PRNGKeyArray | None) -> Float[Array, "*s"]:
    if key is None or m.rate == 0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - m.rate, x.shape)
    return jnp.where(keep, x / (1.0 - m.rate), jnp.zeros((), x.dtype))
