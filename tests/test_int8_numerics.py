"""Requant edge vectors against an exact rational rule; requant pairs and exp tables."""

import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shapeml import int8


def exact(x: int, m: int, s: int) -> int:
    """The requant rule in exact rationals: x*m / 2**s rounded half up, clipped to int8."""
    v = Fraction(x * m, 2**s) + Fraction(1, 2)
    return max(-128, min(127, math.floor(v)))


def _xs():
    xs = {0, 2**31 - 1, -(2**31), -(2**31) + 1, 2**31 - 2}
    for e in range(31):
        for dx in range(-2, 3):
            for sign in (1, -1):
                v = sign * (2**e + dx)
                if -(2**31) <= v < 2**31:
                    xs.add(v)
    xs |= {-3, 3, -1, 1, -2, 2, -5, 5, -127, 127, -128, 128, -129, 255, -256}
    return np.array(sorted(xs), dtype=np.int64)


MS = [1, 2, 3, 5, 127, 2**15, 2**30 - 1, 2**30, 2**30 + 1, 2**31 - 2, 2**31 - 1, 1518500250]
SS = [1, 2, 3, 7, 8, 15, 16, 30, 31, 32, 33, 40, 47, 61, 62]
XS = _xs()


@pytest.mark.parametrize("m", MS)
def test_requant_matches_exact_rule(m):
    for s in SS:
        want = np.array([exact(int(x), m, s) for x in XS], dtype=np.int8)
        got_np = int8.requant(XS.astype(np.int32), m, s)
        assert got_np.dtype == np.int8
        np.testing.assert_array_equal(got_np, want, err_msg=f"numpy M={m} S={s}")
        got_jax = np.asarray(int8.requant_jax(jnp.asarray(XS, dtype=jnp.int32), m, s))
        np.testing.assert_array_equal(got_jax, want, err_msg=f"jax M={m} S={s}")


@pytest.mark.parametrize(
    "x,m,s,y",
    [
        (-3, 2**30, 31, -1),  # -1.5 rounds half up to -1
        (3, 2**30, 31, 2),  # 1.5 -> 2
        (-1, 1, 1, 0),  # -0.5 -> 0
        (1, 1, 1, 1),  # 0.5 -> 1
        (-(2**31), 2**31 - 1, 62, -1),  # largest |x*M|: -(1 - 2**-31) -> -1
        (-(2**30), 2**31 - 1, 62, 0),  # -(0.5 - 2**-32), just above the tie -> 0
        (-(2**30), 2**30, 61, 0),  # -0.5 exactly -> 0
        (2**31 - 1, 2**31 - 1, 31, 127),  # saturates high
        (-(2**31), 2**31 - 1, 31, -128),  # saturates low
        (255, 1, 1, 127),  # 127.5 -> 128 -> clipped
        (-257, 1, 1, -128),  # -128.5 -> -128
        (-259, 1, 1, -128),  # -129.5 -> -129 -> clipped
    ],
)
def test_requant_named_vectors(x, m, s, y):
    assert exact(x, m, s) == y
    assert int(int8.requant(np.array([x], np.int32), m, s)[0]) == y
    assert int(int8.requant_jax(jnp.array([x], jnp.int32), m, s)[0]) == y
    assert (
        int(jax.jit(int8.requant_jax, static_argnums=(1, 2))(jnp.array([x], jnp.int32), m, s)[0])
        == y
    )


def test_tie_rounds_half_up_not_to_even():
    # 2.5 -> 3 and -2.5 -> -2 (np.round would give 2 and -2; floor would give 2 and -3).
    assert int8.requant(np.array([5, -5], np.int32), 1, 1).tolist() == [3, -2]


def test_requant_jax_is_int64_inside_and_leaves_x64_off():
    # the product needs 64 bits: int32 arithmetic would wrap 2**31 - 1 times 3
    assert int(int8.requant_jax(jnp.array([2**31 - 1], jnp.int32), 3, 33)[0]) == 1
    jaxpr = str(jax.make_jaxpr(lambda x: int8.requant_jax(x, 3, 33))(jnp.array([1], jnp.int32)))
    assert "i64" in jaxpr
    assert jnp.asarray(np.int64(1)).dtype == jnp.int32  # the global setting is untouched


@pytest.mark.parametrize("scale", [1.0, 0.5, 1 / 127, 3.3e-5, 1e-9, 0.7071])
def test_requant_pair_approximates_scale(scale):
    m, s = int8.requant_pair(scale)
    assert 1 <= m < 2**31 and 1 <= s <= 62
    if scale > 1e-8:
        assert abs(m / 2**s - scale) / scale < 1e-6


def test_exp_table_is_non_increasing_and_starts_at_one():
    t = int8.exp_table(0.1, length=128)
    assert len(t) == 128 and t[0] == 32767
    assert all(a >= b for a, b in zip(t, t[1:]))
    assert t[10] == math.floor(32767 * math.exp(-1.0) + 0.5)
