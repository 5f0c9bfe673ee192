"""Integer numerics shared by every decode path: requant, the exp table, fixed-point multipliers,
and the int32 accumulator bounds they imply.

The rule (docs/int8.md, "Requant"): `y = clip((x*M + 2**(S-1)) >> S, -128, 127)`, computed in
int64 with an arithmetic shift, i.e. `x*M / 2**S` rounded half up. The numpy and the JAX versions
here are the only two implementations; every decode path calls one of them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._traceback import api_boundary
from .._validate import integer, real

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


@api_boundary
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


@api_boundary
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


@api_boundary
def requant_pair(scale: Any, *, max_shift: Any = 40) -> tuple[int, int]:
    """The fixed-point pair `(M, S)` of a positive real `scale` (docs/int8.md, "Quantization").

    With `scale` read exactly (a float64 value): `S` is the largest shift in `1..max_shift` with
    `scale * 2**S <= 2**31 - 1` (1 when there is none), and `M = floor(scale * 2**S + 1/2)`, the
    product rounded half up (ties up), then clamped to `[1, 2**31 - 1]`. So M carries about 31
    significant bits; a scale below `2**-(max_shift + 1)` gives M = 1, and one above `2**30` gives
    M = 2**31 - 1, S = 1 (a requant that saturates every nonzero input anyway). Every step is exact
    in float64: a product with a power of two is, and `x + 1/2` for x < 2**31 rounds only where
    the clamp to M >= 1 decides the result.

    Raises:
        ArgumentError / ArgumentTypeError (E0002 / E0003): `scale` not a positive finite number,
            `max_shift` not an integer in 1..62.
    """
    scale = real("scale", scale, low=0.0, low_open=True)
    max_shift = integer("max_shift", max_shift, low=1, high=MAX_SHIFT)
    s = max_shift
    while s > 1 and scale * 2.0**s > MAX_MULTIPLIER:
        s -= 1
    x = scale * 2.0**s  # may be inf for a scale near the float64 maximum: clamped, not floored
    m = MAX_MULTIPLIER if x > MAX_MULTIPLIER else int(math.floor(x + 0.5))
    return max(1, m), s


@api_boundary
def exp_table(step: Any, *, length: Any = 128, one: Any = EXP_TABLE_MAX) -> list[int]:
    """`table[i] = floor(one * exp(-i * step) + 0.5)`: the softmax weight of a score `i` table steps
    below the row maximum. Non-increasing, starts at `one`, at most 128 entries.

    Raises:
        ArgumentError / ArgumentTypeError (E0002 / E0003): `step` not a positive finite number,
            `length` not an integer in 1..128, `one` not an integer in 1..32767.
    """
    step = real("step", step, low=0.0, low_open=True)
    length = integer("length", length, low=1, high=128)
    one = integer("one", one, low=1, high=EXP_TABLE_MAX)
    return [int(math.floor(one * math.exp(-i * step) + 0.5)) for i in range(length)]


def accumulator_bounds(dims: Mapping[str, int], table0: int) -> dict[str, tuple[int, str]]:
    """Worst-case magnitude of every int32 intermediate of the decode step, with its formula.

    Activations are int8 (|a| <= 128), attention weights `p` and the ReLU output `h` lie in
    [0, 127], exp-table entries in [0, table0]. The names are the step's (docs/int8.md, "Overflow
    bounds", the same table); the formulas read `d`, `dh` (= d / heads), `F`, `T` (= ctx) and
    `exp_table[0]`, and evaluate to the bounds.

    Args:
        dims: the model's dims (D, H, F, T; `Int8Model.dims`).
        table0: the exp table's first (largest) entry.
    """
    d, dh, f, t = dims["D"], dims["D"] // dims["H"], dims["F"], dims["T"]
    mat = d * 128 * 128
    return {
        "x0 (embed + positions)": (2 * 128, "2 * 128"),
        "q_acc, k_acc, v_acc": (mat, "d * 128 * 128"),
        "scores": (dh * 128 * 128, "dh * 128 * 128"),
        "dist": (2 * dh * 128 * 128, "2 * dh * 128 * 128"),
        "z (sum of e)": (t * table0, "T * exp_table[0]"),
        "254 * e + z": ((254 + t) * table0, "(254 + T) * exp_table[0]"),
        "2 * z": (2 * t * table0, "2 * T * exp_table[0]"),
        "attn_acc": (t * 127 * 128, "T * 127 * 128"),
        "wo_acc": (mat, "d * 128 * 128"),
        "res1 + wo": (2 * 128, "2 * 128"),
        "w1_acc": (mat, "d * 128 * 128"),
        "w2_acc": (f * 127 * 128, "F * 127 * 128"),
        "res2 + w2": (2 * 128, "2 * 128"),
        "logits": (mat, "d * 128 * 128"),
    }
