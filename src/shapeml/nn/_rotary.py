"""Rotary position embedding (RoPE): each pair `(x[i], x[i + Dh/2])` of a head of width `Dh` is
rotated by the angle `pos * base ** (-2i / Dh)`, so a query-key product depends on their distance
only."""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

__all__ = ["rotate"]

BASE = 10_000.0


def rotate(
    x: Float[Array, "b t h k"], positions: Int[Array, " t"], base: float = BASE
) -> Float[Array, "b t h k"]:
    """Rotates the heads `x [b t h k]` at `positions [t]` (`k` even; the half-split layout that
    `transformers` calls rotate-half). `base` is the checkpoint's `rope_theta`."""
    half = x.shape[-1] // 2
    freq = base ** (-jnp.arange(half, dtype=jnp.float32) * 2.0 / x.shape[-1])
    angle = positions.astype(jnp.float32)[:, None] * freq[None, :]  # [t half]
    cos = jnp.cos(angle)[None, :, None, :].astype(x.dtype)
    sin = jnp.sin(angle)[None, :, None, :].astype(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
