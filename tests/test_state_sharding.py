"""shapeml.state on a mesh: sharded state stays sharded, each shard on its device, in place.

Runs in a subprocess with forced host devices (the flag must be set before JAX starts, and it slows
single-device work down, so it is never set for the rest of the suite).
"""

from __future__ import annotations

import textwrap

from _forced_devices import run_forced

SCRIPT = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from shapeml.state import Graph, KVCache, param, state

    assert jax.device_count() == 4, jax.devices()
    mesh = Mesh(np.array(jax.devices()), ("x",))
    by_rows = NamedSharding(mesh, P("x", None))
    by_cols = NamedSharding(mesh, P(None, "x"))

    class Accumulate(Graph):
        def __init__(self):
            self.scale = param(np.full(8, 2.0, np.float32), sharding=NamedSharding(mesh, P("x")))
            self.rows = state((16, 8), name="rows", sharding=by_rows)
            self.cols = state((16, 8), name="cols", sharding=by_cols)
            self.cache = state(KVCache(1, 16, 4, 2), name="cache",
                               sharding=NamedSharding(mesh, P(None, None, None, "x", None)))

        def body(self, x, *, pos):
            new = self.rows[pos] + x * self.scale
            self.rows[pos] = new
            self.cols[pos] = self.cols[pos] + x
            kv = x.reshape(1, 4, 2)
            self.cache = self.cache.write(0, pos, kv, -kv)
            return new

    def layout(a):
        return sorted((s.device.id, s.index, s.data.shape) for s in a.addressable_shards)

    def pointers(a):
        return sorted((s.device.id, s.data.unsafe_buffer_pointer()) for s in a.addressable_shards)

    g = Accumulate()
    rng = np.random.default_rng(0)
    rows = np.zeros((16, 8), np.float32)
    cols = np.zeros((16, 8), np.float32)
    keys = np.zeros((16, 8), np.float32)
    for i, pos in enumerate([0, 3, 3, 15, 7, 0]):
        x = rng.standard_normal(8).astype(np.float32)
        rows[pos] += 2 * x
        cols[pos] += x
        keys[pos] = x
        np.testing.assert_allclose(np.asarray(g(x, pos=pos)), rows[pos], rtol=1e-6)
        if i == 0:
            first = {n: (layout(getattr(g, n).device), pointers(getattr(g, n).device))
                     for n in ("rows", "cols")}
            cache_layout = layout(g.cache.device.k)
        for n in ("rows", "cols"):
            a = getattr(g, n).device
            assert a.sharding.is_equivalent_to(by_rows if n == "rows" else by_cols, 2), a.sharding
            assert layout(a) == first[n][0]
            assert pointers(a) == first[n][1], n  # every shard updated in place, on its device
        assert layout(g.cache.device.k) == cache_layout
    for n, spec in (("rows", (4, 8)), ("cols", (16, 2))):
        lay = layout(getattr(g, n).device)
        assert [d for d, _, _ in lay] == [0, 1, 2, 3] and all(s == spec for _, _, s in lay), lay
    assert [s for _, _, s in cache_layout] == [(1, 1, 16, 1, 2)] * 4, cache_layout
    np.testing.assert_allclose(g.read("rows"), rows, rtol=1e-6)
    np.testing.assert_allclose(g.read("cols"), cols, rtol=1e-6)
    np.testing.assert_allclose(g.read("cache").k[0, 0].reshape(16, 8), keys, rtol=1e-6)
    try:
        g(np.ones(8, np.float32), pos=16)
    except IndexError as e:
        assert "`rows`" in str(e) and "16" in str(e)
    else:
        raise AssertionError("pos=16 did not raise")
    assert g.compile_count == 1
    print("OK")
    """
)


def test_sharded_state_keeps_each_shard_on_its_device():
    proc = run_forced(SCRIPT, 4, timeout=300)
    assert proc.stdout.strip().endswith("OK")
