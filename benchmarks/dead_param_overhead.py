"""`sm.value_and_grad` (with its dead-param analysis) vs `jax.value_and_grad` on the same loss.

Both are jitted; the analysis runs while tracing, so once traced the two compiled calls should cost
the same. The baseline splits the model into params and the rest by hand, as `sm.value_and_grad`
does, and differentiates with respect to the params.
Run: python benchmarks/dead_param_overhead.py
"""

import sys
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).parent))
from _timing import interleaved  # noqa: E402

import shapeml as sm  # noqa: E402
from shapeml.data import shapes  # noqa: E402
from shapeml.zoo import spotter  # noqa: E402


def main() -> None:
    m = spotter.Spotter.init(seed=0)
    img, y = (jnp.asarray(a) for a in shapes.draw(64, seed=0))
    # The Spotter's float arrays are exactly its params (it has no buffers).
    params, rest = eqx.partition(m, eqx.is_inexact_array)
    assert len(jax.tree.leaves(params)) == len(sm.params(m))

    @jax.jit
    def with_analysis(m, img, y):
        return sm.value_and_grad(spotter.loss, m, img, y)

    @jax.jit
    def plain(params, img, y):
        return jax.value_and_grad(lambda p: spotter.loss(eqx.combine(p, rest), img, y))(params)

    (v1, g1), (v2, g2) = with_analysis(m, img, y), plain(params, img, y)
    assert float(v1) == float(v2)
    assert all(bool(jnp.all(a == b)) for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)))
    t = interleaved(
        {"sm": lambda: with_analysis(m, img, y), "jax": lambda: plain(params, img, y)},
        rounds=15,
        number=100,
    )
    assert with_analysis._cache_size() == 1 and plain._cache_size() == 1
    print(
        f"jit(sm.value_and_grad): {t['sm']:.1f} us/call, jit(jax.value_and_grad): {t['jax']:.1f} us/call"
    )
    print(f"dead_param_overhead: ratio={t['sm'] / t['jax']:.3f} (budget 1.05)")


if __name__ == "__main__":
    main()
