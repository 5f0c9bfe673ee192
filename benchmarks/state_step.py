"""An Accumulate step on a Graph state of 16 rows vs 1,000,000 rows (same width): per-call time.

The state is donated to each call and updated in place, so a call should cost the same whatever the
state's size. The same step written naively (`jax.jit`, no donation) copies the whole state every
call: its line shows the copy the Graph avoids. A plain `jax.jit` with donation shows what the
Graph's own dispatch adds, including the bounds check of `pos`, which the shell runs on the host
before it dispatches (`pos` is an input; a bad index writes nothing): `graph_call_vs_jit` is that
ratio.
Run: python benchmarks/state_step.py
"""

import itertools
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _timing import interleaved  # noqa: E402

from shapeml.state import Graph, state  # noqa: E402

WIDTH = 16
SMALL, LARGE = 16, 1_000_000


class Accumulate(Graph):
    def __init__(self, rows: int):
        self.total = state((rows, WIDTH), name="total")

    def body(self, x, *, pos):
        new = x + self.total[pos]
        self.total[pos] = new
        return new


def _step(total, x, pos):
    new = x + jax.lax.dynamic_index_in_dim(total, pos, keepdims=False)
    return jax.lax.dynamic_update_index_in_dim(total, new, pos, 0), new


def main() -> None:
    x = np.ones(WIDTH, np.float32)
    small, large = Accumulate(SMALL), Accumulate(LARGE)
    pos_small = itertools.cycle(range(0, SMALL, 3))
    pos_large = itertools.cycle(range(0, LARGE, 99_991))

    naive = jax.jit(_step)
    donated = jax.jit(_step, donate_argnums=0)
    held = {"naive": jnp.zeros((LARGE, WIDTH)), "donated": jnp.zeros((LARGE, WIDTH))}

    def run(name, fn):
        def call():
            held[name], new = fn(held[name], x, np.int32(next(pos_large)))
            return new

        return call

    t = interleaved(
        {
            "small": lambda: small(x, pos=next(pos_small)),
            "large": lambda: large(x, pos=next(pos_large)),
            "jit_donated": run("donated", donated),
        },
        rounds=15,
        number=200,
    )
    t.update(interleaved({"jit_naive": run("naive", naive)}, rounds=5, number=10))
    assert small.compile_count == 1 and large.compile_count == 1
    print(f"Graph step, {SMALL} x {WIDTH} state: {t['small']:.1f} us/call")
    print(f"Graph step, {LARGE:,} x {WIDTH} state: {t['large']:.1f} us/call")
    print(f"jax.jit + donation, {LARGE:,} rows (no Graph): {t['jit_donated']:.1f} us/call")
    print(
        f"naive jax.jit without donation, {LARGE:,} rows (copies the state): "
        f"{t['jit_naive']:.1f} us/call = {t['jit_naive'] / t['large']:.1f}x the Graph step"
    )
    print(f"state_step_size_ratio: ratio={t['large'] / t['small']:.3f} (budget 1.2)")
    print(f"graph_call_vs_jit: ratio={t['large'] / t['jit_donated']:.3f} (budget 1.5)")


if __name__ == "__main__":
    main()
