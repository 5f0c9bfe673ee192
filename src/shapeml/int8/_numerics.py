"""Integer numerics shared by every decode path: requant, the exp table, fixed-point multipliers,
and the int32 accumulator bounds they imply.

The rule (docs/int8.md, "Requant"): `y = clip((x*M + 2**(S-1)) >> S, -128, 127)`, computed in
int64 with an arithmetic shift, i.e. `x*M / 2**S` rounded half up. The numpy and the JAX versions
here are the only two implementations; every decode path calls one of them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "EXP_TABLE_MAX",
    "INT32_MAX",
    "MAX_SHIFT",
    "MAX_MULTIPLIER",
    "REQUANT_POINTS",
    "accumulator_bounds",
    "exp_table",
    "requant",
    "requant_jax",
    "requant_pair",
]

INT32_MAX = 2**31 - 1
MAX_MULTIPLIER = 2**31 - 1
MAX_SHIFT = 62
EXP_TABLE_MAX = 32767  # entries fit int16, so (254 + ctx) * entry stays far below 2**31
# In the order the decode step applies them (docs/int8.md); row i of a model's `requant_pairs`.
REQUANT_POINTS = ("q", "k", "v", "score", "attn", "wo", "res1", "w1", "w2", "res2")


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


def requant_jax(
    x: jax.Array, m: int | np.integer | jax.Array, s: int | np.integer | jax.Array
) -> jax.Array:
    """The requant rule in JAX, usable inside any `jit`, `shard_map` or loop.

    Only the requant's own ops run in 64-bit mode (a `jax.enable_x64` scope around them, so the
    traced program holds real int64 ops here); the global x64 setting and the rest of the program
    are untouched, and the result is int8 again.

    Args:
        x: int32 array of any shape.
        m: multiplier: a Python or numpy int (a compile-time constant: the compiled decode
            programs fold a model's `requant_pairs` in), or a traced integer scalar array.
        s: shift, the same kinds.

    Returns:
        int8 array of `x`'s shape.
    """
    with jax.enable_x64(True):
        m64, s64 = jnp.asarray(m, jnp.int64), jnp.asarray(s, jnp.int64)
        y = (x.astype(jnp.int64) * m64 + (jnp.int64(1) << (s64 - 1))) >> s64
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


def accumulator_bounds(dims: Mapping[str, int], table0: int) -> dict[str, tuple[int, str]]:
    """Worst-case magnitude of every int32 accumulator of the decode step, with its formula.

    Activations are int8 (|a| <= 128), attention weights and ReLU outputs lie in [0, 127].

    Args:
        dims: the model's dims (D, H, F, T; `Int8Model.dims`).
        table0: the exp table's first (largest) entry.
    """
    d, dh, d_ff, ctx = dims["D"], dims["D"] // dims["H"], dims["F"], dims["T"]
    return {
        "q/k/v (x @ Wq|Wk|Wv)": (d * 128 * 128, "d * 128 * 128"),
        "score distance (max - score)": (2 * dh * 128 * 128, "2 * (d / heads) * 128 * 128"),
        "softmax (254 * e + sum e)": ((254 + ctx) * table0, "(254 + ctx) * exp_table[0]"),
        "attention (p @ V)": (ctx * 127 * 128, "ctx * 127 * 128"),
        "wo (a @ Wo)": (d * 128 * 128, "d * 128 * 128"),
        "w1 (x @ W1)": (d * 128 * 128, "d * 128 * 128"),
        "w2 (h @ W2)": (d_ff * 127 * 128, "d_ff * 127 * 128"),
        "logits (x @ Eq^T)": (d * 128 * 128, "d * 128 * 128"),
    }
