"""Integer numerics shared by every decode path: requant, the exp table, fixed-point multipliers.

The rule (docs/int8.md, "Requant"): `y = clip((x*M + 2**(S-1)) >> S, -128, 127)`, computed in
int64 with an arithmetic shift, i.e. `x*M / 2**S` rounded half up. The numpy and the JAX versions
here are the only two implementations; every decode path calls one of them.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "EXP_TABLE_MAX",
    "MAX_SHIFT",
    "MAX_MULTIPLIER",
    "exp_table",
    "requant",
    "requant_jax",
    "requant_pair",
]

MAX_MULTIPLIER = 2**31 - 1
MAX_SHIFT = 62
EXP_TABLE_MAX = 32767  # entries fit int16, so (254 + ctx) * entry stays far below 2**31


def requant(x, m: int, s: int) -> np.ndarray:
    """The requant rule on the host: `clip((x*m + 2**(s-1)) >> s, -128, 127)` in int64.

    Args:
        x: integer array of any shape (int32 accumulators; anything with |x| < 2**31).
        m: multiplier, 1 <= m <= 2**31 - 1.
        s: shift, 1 <= s <= 62.

    Returns:
        int8 array of `x`'s shape.
    """
    x64_ = np.asarray(x).astype(np.int64)
    y = (x64_ * np.int64(m) + np.int64(1 << (s - 1))) >> np.int64(s)
    return np.clip(y, -128, 127).astype(np.int8)


def requant_jax(x: jax.Array, m: int, s: int) -> jax.Array:
    """The requant rule in JAX, usable inside any `jit`, `shard_map` or loop.

    Only the requant's own ops run in 64-bit mode (a `jax.enable_x64` scope around them, so the
    traced program holds real int64 ops here); the global x64 setting and the rest of the program
    are untouched, and the result is int8 again.

    Args:
        x: int32 array of any shape.
        m: multiplier (Python int, baked into the program).
        s: shift (Python int).

    Returns:
        int8 array of `x`'s shape.
    """
    with jax.enable_x64(True):
        y = (x.astype(jnp.int64) * jnp.int64(m) + jnp.int64(1 << (s - 1))) >> jnp.int64(s)
        return jnp.clip(y, -128, 127).astype(jnp.int8)


def requant_pair(scale: float, *, max_shift: int = 40) -> tuple[int, int]:
    """The (M, S) whose M / 2**S best approximates a positive real `scale`, M < 2**31.

    The shift is the largest one (up to `max_shift`) that keeps M below 2**31, so M carries about
    31 significant bits; scales too small for `max_shift` give the smallest positive M (1).
    """
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"requant scale must be a positive finite float, got {scale!r}")
    s = max_shift
    while s > 1 and scale * 2.0**s > MAX_MULTIPLIER:
        s -= 1
    m = int(math.floor(scale * 2.0**s + 0.5))
    return max(1, min(m, MAX_MULTIPLIER)), s


def exp_table(step: float, *, length: int = 128, one: int = EXP_TABLE_MAX) -> list[int]:
    """`table[i] = floor(one * exp(-i * step) + 0.5)`: the softmax weight of a score `i` table steps
    below the row maximum. Non-increasing, starts at `one`, at most 128 entries.
    """
    if not (1 <= length <= 128) or step <= 0:
        raise ValueError(f"exp_table needs 1 <= length <= 128 and step > 0, got {length}, {step}")
    return [int(math.floor(one * math.exp(-i * step) + 0.5)) for i in range(length)]
