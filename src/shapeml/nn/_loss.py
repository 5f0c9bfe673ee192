"""`nn.cross_entropy`: softmax cross-entropy from logits and integer labels, as one fused
log-sum-exp (never a materialized log-softmax), computed in float32 whatever the logits' dtype."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from .._shaped import shaped
from .._validate import choice

__all__ = ["cross_entropy"]


@shaped
def cross_entropy(
    logits: Float[Array, "*b V"], labels: Int[Array, "*b"], *, reduction: str = "mean"
) -> Float[Array, "..."]:
    """`logsumexp(logits) - logits[label]` at each position, averaged (or summed) over all.

    The picked logit is a dot with the label's one-hot row rather than a gather, so the backward
    pass is `softmax - one_hot` in one elementwise fusion (no scatter); the sum runs in float32
    even for bfloat16 or float16 logits. A label outside `0 .. V-1` gives NaN, never a silently
    clamped class.

    Args:
        logits: `[*b V]` unnormalized scores.
        labels: `[*b]` class ids.
        reduction: `"mean"` (a scalar, the default), `"sum"` (a scalar) or `"none"` (`[*b]`).

    Returns:
        The loss, float32.

    Example:
        >>> loss = nn.cross_entropy(m.emb.logits(h), tokens[:, 1:])   # [b t V], [b t] -> []
    """
    reduction = choice("reduction", reduction, ("mean", "sum", "none"))
    z = logits.astype(jnp.float32)
    v = z.shape[-1]
    picked = jnp.sum(z * jax.nn.one_hot(labels, v, dtype=z.dtype), axis=-1)
    per = jax.nn.logsumexp(z, axis=-1) - picked
    per = jnp.where((labels >= 0) & (labels < v), per, jnp.nan)
    if reduction == "none":
        return per
    return jnp.mean(per) if reduction == "mean" else jnp.sum(per)
