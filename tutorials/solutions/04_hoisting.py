"""Solutions to the exercises of tutorials/04_hoisting.ipynb. Run: python tutorials/solutions/04_hoisting.py"""

import jax
import jax.numpy as jnp
import numpy as np

import shapeml as sm

D, T = 16, 8
rng = np.random.default_rng(0)
weights = {"w": jnp.asarray(rng.standard_normal((D, D)), jnp.float32)}
x = jnp.asarray(rng.standard_normal((2, T, D)), jnp.float32)


# 1. A RoPE-style table depends on no input: it is built once, in prepare.
def rope_forward(m, x):
    positions = jnp.arange(T, dtype=jnp.float32)
    freqs = 1.0 / (10000.0 ** (jnp.arange(0, D // 2, dtype=jnp.float32) / (D // 2)))
    angle = positions[:, None] * freqs[None, :]
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    h = x @ m["w"]
    h1, h2 = h[..., : D // 2], h[..., D // 2 :]
    return jnp.concatenate([h1 * cos - h2 * sin, h1 * sin + h2 * cos], axis=-1)


fast = sm.hoist(rope_forward)
np.testing.assert_allclose(
    fast(weights, x), jax.jit(rope_forward)(weights, x), rtol=1e-5, atol=1e-5
)
report = fast.report()
assert report.prepare_ops["cos"] == 1 and report.prepare_ops["sin"] == 1
assert "cos" not in report.main_ops and "sin" not in report.main_ops


# 2. Two sets of weights in turn: with cache_size=2 each is prepared once (2 runs); with the
#    default cache_size=1 every switch re-prepares (4 runs for 4 alternating calls).
def dense(m, x):
    return jnp.tanh(x @ (m["w"] * 2.0))


other = {"w": weights["w"] + 1.0}
for size, expected in ((2, 2), (1, 4)):
    f = sm.hoist(dense, cache_size=size)
    for m in (weights, other, weights, other):
        f(m, x)
    assert f.report().prepare_runs == expected, (size, f.report().prepare_runs)


# 3. Dropout with a per-call key: random bits are never cached.
def dropout_forward(m, x, key):
    h = x @ (m["w"] * 2.0)
    keep = jax.random.bernoulli(key, 0.9, h.shape)
    return jnp.where(keep, h / 0.9, 0.0)


drop = sm.hoist(dropout_forward)
a = drop(weights, x, jax.random.key(0))
b = drop(weights, x, jax.random.key(1))
assert not np.array_equal(a, b)
assert "random_bits" in drop.report().main_ops
assert "random_bits" not in drop.report().prepare_ops
print("04_hoisting: all solutions check out")
