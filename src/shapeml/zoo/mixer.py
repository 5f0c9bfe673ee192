"""MLP-mixer blocks: mixing across tokens, then across channels, each a residual MLP.

The Spotter's blocks. Every matmul is written as one 2-D product over the flattened batch, which
XLA:CPU runs faster than the batched einsum (forward and backward), with the batch the major axis so
a batch sharded across devices stays sharded. Measured and not kept (benchmarks/train_step.py):
a token-major `[N b D]` layout (5-10% faster steps at b=256, 10% slower at b=64), hand-written VJPs
for the norm and the GELU (no gain beyond noise; XLA:CPU 0.10.2 miscompiles the norm's at b >= 256).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from .. import _jax_internals as jxi
from .._traceback import api_boundary
from .._validate import real

__all__ = ["mix_channels", "mix_tokens", "norm"]


@api_boundary
def norm(x: Float[Array, "*b D"], eps: float = 1e-5) -> Float[Array, "*b D"]:
    """Normalises each token to zero mean and unit variance over its channels (no scale/shift).

    Raises:
        ArgumentError: (E0002) for a concrete `eps` that is not a finite number > 0 (a negative
            one turns every constant token into NaN).
    """
    if not jxi.is_tracer(eps):
        real("eps", eps, low=0.0, low_open=True)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    centered = x - mean
    var = jnp.mean(centered * centered, axis=-1, keepdims=True)
    return centered * jax.lax.rsqrt(var + eps)


@api_boundary
def mix_tokens(
    x: Float[Array, "b N D"], w1: Float[Array, "N Dt"], w2: Float[Array, "Dt N"]
) -> Float[Array, "b N D"]:
    """`x + mlp(norm(x))` applied along the tokens, the same MLP for every channel."""
    b, n, d = x.shape
    h = jnp.swapaxes(norm(x), 1, 2).reshape(b * d, n)  # one row per (image, channel)
    h = jax.nn.gelu(h @ w1) @ w2
    return x + jnp.swapaxes(h.reshape(b, d, n), 1, 2)


@api_boundary
def mix_channels(
    x: Float[Array, "b N D"], w1: Float[Array, "D Dc"], w2: Float[Array, "Dc D"]
) -> Float[Array, "b N D"]:
    """`x + mlp(norm(x))` applied along the channels, the same MLP for every token."""
    b, n, d = x.shape
    h = norm(x).reshape(b * n, d)
    h = jax.nn.gelu(h @ w1) @ w2
    return x + h.reshape(b, n, d)
