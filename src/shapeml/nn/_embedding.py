"""`nn.Embedding`: a table of `V` vectors of width `D`, looked up by token id; `logits` ties a
head to it (`x @ w.T`)."""

from __future__ import annotations

import typing
from typing import Any

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from .. import _jax_internals as jxi
from .._shaped import shaped
from .._traceback import api_boundary
from ..models import Dims, param
from ._dense import dense
from ._errors import LayerInputError
from ._init import fan_in
from ._layer import Layer

__all__ = ["Embedding"]


@api_boundary
class Embedding(Layer):
    """A lookup table: `w [V D]`, drawn with `nn.fan_in(axes=(1,))` (std `1 / sqrt(D)`).

    Example:
        >>> emb = nn.Embedding.init(seed=0, V=100, D=32)
        >>> x = emb(jnp.array([[1, 2, 3]]))       # [1 3 32]
        >>> logits = emb.logits(x)                # [1 3 100]: a head tied to the table
    """

    dims = Dims(V=256, D=32)
    w: Float[Array, "V D"] = param(fan_in(axes=(1,)))

    @classmethod
    @typing.no_type_check  # validates its arguments itself, with coded errors
    def init(
        cls, seed: Any = 0, *, V: int = 256, D: int = 32, max_bytes: int | None = None
    ) -> Embedding:
        """A new `Embedding` drawn from `seed`.

        Args:
            seed: a whole number, a `jax.random.key` or an int array (as `sm.Model.init`).
            V: vocabulary size (rows of the table).
            D: width of each vector.
            max_bytes: the most the layer may hold (default 16 GiB).
        """
        return super().init(seed, max_bytes=max_bytes, V=V, D=D)

    @shaped
    def __call__(self, ids: Int[Array, "*b"]) -> Float[Array, "*b D"]:
        """The rows of `ids`: `[*b] -> [*b D]`. Concrete ids outside `0 .. V-1` raise E1803."""
        v = self.dims.V
        if not jxi.is_tracer(ids):
            arr = np.asarray(ids)
            if arr.size and (arr.min() < 0 or arr.max() >= v):
                bad = int(arr.min()) if arr.min() < 0 else int(arr.max())
                raise LayerInputError(
                    f"token id {bad} is outside the vocabulary of V={v} ids",
                    fix=f"pass ids in 0..{v - 1}",
                )
        # Ids traced inside a user's jit cannot be checked on the host: a bad one reads NaN,
        # never a clamped row that would pass for a real token. `take` wraps negative ids, so
        # they are sent out of range first.
        ids = jnp.where(ids < 0, self.w.shape[0], ids)
        return jnp.take(self.w, ids, axis=0, mode="fill", fill_value=jnp.nan)

    @shaped
    def logits(self, x: Float[Array, "*b D"]) -> Float[Array, "*b V"]:
        """`x @ w.T`: the scores of every token, a head tied to the table."""
        return dense(x, self.w.T)  # x @ w.T, with a weight gradient XLA:CPU runs well
