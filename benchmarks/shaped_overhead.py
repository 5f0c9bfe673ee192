"""A jitted `@sm.shaped` Spotter forward vs the same forward undecorated: per-call time.

The shape check runs at trace time only, so the compiled calls should cost the same.
Run: python benchmarks/shaped_overhead.py
"""

import inspect
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).parent))
from _timing import interleaved  # noqa: E402

from shapeml.data import shapes  # noqa: E402
from shapeml.zoo import spotter  # noqa: E402


def main() -> None:
    m = spotter.Spotter.init(seed=0)
    img = jnp.asarray(shapes.draw(64, seed=0)[0])
    plain = inspect.unwrap(spotter.forward)  # the same function without the shape check
    shaped_fwd = jax.jit(spotter.forward)
    plain_fwd = jax.jit(plain)
    t = interleaved(
        {"shaped": lambda: shaped_fwd(m, img), "plain": lambda: plain_fwd(m, img)}, number=200
    )
    print(
        f"jit(@sm.shaped forward): {t['shaped']:.1f} us/call, jit(forward): {t['plain']:.1f} us/call"
    )
    print(f"shaped_overhead: ratio={t['shaped'] / t['plain']:.3f} (budget 1.05)")


if __name__ == "__main__":
    main()
