"""Weights and state: a graph that holds a weight, and one that keeps a running total on the device.

`Scale` multiplies its input by a weight uploaded once. `Accumulate` adds its input into row `pos`
of a state that lives on the device across calls; `pos` is a per-call value, so moving it never
recompiles, and a `pos` outside the state raises instead of being clamped. The state is an
`sm.Model` (`acc.states`), saved with `sm.save` and loaded into a fresh graph.
Run: python examples/weights_and_state.py
"""

import tempfile
from pathlib import Path

import jax.numpy as jnp
import numpy as np

import shapeml as sm
from shapeml.state import Graph, StateIndexError, param, state


class Scale(Graph):
    """`x * weight`, elementwise, against a weight this graph holds."""

    def __init__(self, weight):
        self.weight = param(weight)

    def body(self, x):
        return x * self.weight


class Accumulate(Graph):
    """A running total per row: each call adds `x` into `total[pos]` and returns the new row."""

    def __init__(self, rows, width):
        self.total = state((rows, width), jnp.float32, name="total")

    def body(self, x, *, pos):
        new = x + self.total[pos]
        self.total[pos] = new
        return new


def main() -> None:
    rng = np.random.default_rng(0)
    width = 8

    weight = rng.standard_normal(width).astype(np.float32)
    scale = Scale(weight)
    x = rng.standard_normal(width).astype(np.float32)
    np.testing.assert_allclose(np.asarray(scale(x)), x * weight, rtol=1e-6)
    print("Scale matches numpy")

    acc = Accumulate(rows=4, width=width)
    expect = np.zeros((4, width), np.float32)
    for pos in (0, 0, 2, 3):  # the same row twice, then two others: one compile for all
        x = rng.standard_normal(width).astype(np.float32)
        expect[pos] += x
        np.testing.assert_allclose(np.asarray(acc(x, pos=pos)), expect[pos], rtol=1e-6)
    np.testing.assert_allclose(acc.read("total"), expect, rtol=1e-6)
    print(f"Accumulate matches numpy after 4 calls at 3 positions ({acc.compile_count} compile)")

    # The reference path runs the same body eagerly on the host, against a host mirror.
    for pos in (0, 0, 2, 3):
        acc.reference(np.ones(width, np.float32), pos=pos)
    print("host mirror after 4 reference calls:\n", acc.total.host)

    before = acc.read("total")
    try:
        acc(np.ones(width, np.float32), pos=4)
    except StateIndexError as e:
        print("pos=4 is refused:", e.message)
    np.testing.assert_array_equal(acc.read("total"), before)  # and changed nothing

    # The states are one sm.Model: saved and loaded like any model's buffers.
    with tempfile.TemporaryDirectory() as folder:
        path = sm.save(Path(folder) / "accumulate.safetensors", acc.states)
        again = Accumulate(rows=4, width=width)
        again.load_states(sm.load(path, like=again.states))
    np.testing.assert_array_equal(again.read("total"), acc.read("total"))
    print(f"saved {list(sm.buffers(acc.states))} with sm.save and loaded them into a new graph")


if __name__ == "__main__":
    main()
