"""Per-device bytes of params + optimizer state, and step time, for each rule table vs replicated.

Runs on 4 forced host CPU devices (set here, before JAX starts, unless XLA_FLAGS is already set).
For each table the bytes are counted from the placed arrays (each device's shards), checked
against `sm.memory_report`, and divided by the replicated layout's bytes: a table that splits
every field over an axis of size n should hold 1/n (plus the replicated step count). Step times
on forced host devices are reported, with no budget: CPU "devices" share the same cores, so
splitting buys no speed here, only memory.

    python benchmarks/shard_step.py
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from _timing import interleaved  # noqa: E402

import shapeml as sm  # noqa: E402
from shapeml import optim  # noqa: E402
from shapeml import sharding as sh  # noqa: E402
from shapeml.zoo import spotter, transformer  # noqa: E402

# name: (model, mesh, rules, batch axis); each model's first table is its replicated baseline
TABLES = {
    "spotter": [
        ("replicated", "data=4", {}, "data"),
        ("fsdp", "data=4", {"D": "data", "Dt": "data"}, "data"),
        ("tp", "model=4", {"Dt": "model", "Dc": "model"}, None),
        ("fsdp+tp", "data=2,model=2", {"D": "data", "Dt": "model", "Dc": "model"}, "data"),
    ],
    "transformer": [
        ("replicated", "data=4", {}, "data"),
        ("fsdp", "data=4", {"V": "data", "T": "data", "L": "data"}, "data"),
        ("tp", "model=4", {"H": "model", "F": "model"}, None),
    ],
}


def _device_bytes(tree) -> int:
    """The most bytes any one device holds of the tree's arrays, counted from their shards."""
    per: dict[int, int] = {}
    for a in jax.tree.leaves(tree):
        for s in a.addressable_shards:
            per[s.device.id] = per.get(s.device.id, 0) + s.data.nbytes
    return max(per.values())


def _step(loss):
    def step(m, opt, *batch):
        value, g = sm.value_and_grad(loss, m, *batch)
        m, opt = optim.update(m, opt, g)
        return m, opt, value

    return step


def main() -> None:
    assert jax.device_count() >= 4, "needs 4 devices (XLA_FLAGS set before JAX starts)"
    rng = np.random.default_rng(0)
    models = {
        "spotter": (
            spotter.Spotter.init(seed=0, D=128, Dt=256, Dc=512),
            spotter.loss,
            (
                rng.integers(0, 256, (64, 1, 16, 16), dtype=np.uint8),
                rng.integers(0, 4, 64).astype(np.int32),
            ),
        ),
        "transformer": (
            transformer.Transformer.init(seed=0, V=256, D=128, F=512, L=4),
            transformer.loss,
            (rng.integers(0, 256, (16, 64)).astype(np.int32),),
        ),
    }
    fsdp: list[float] = []
    for name, (m, loss, batch) in models.items():
        opt = optim.adamw(m, lr=1e-3)
        steps, held, base = {}, {}, None
        for table, mesh_text, rules, axis in TABLES[name]:
            mesh = sh.make_mesh(mesh_text)
            s = sh.step_shardings(m, opt, mesh, rules, batch_axis=axis)
            placed = (sh.shard(m, mesh, rules), jax.device_put(opt, s.opt))
            measured = _device_bytes(placed)
            report = sh.memory_report(m, mesh, rules, opt=opt, file=None)
            assert measured == report.device_bytes, (name, table, measured, report.device_bytes)
            base = measured if base is None else base
            if table != "replicated":
                print(
                    f"{name} {table} ({mesh_text}, {rules}): {measured:,} bytes per device of "
                    f"params + adamw state = {measured / base:.3f} of replicated ({base:,})"
                )
            if table == "fsdp":  # every field split over the 4-device data axis
                fsdp.append(measured / base)
            jitted = jax.jit(
                _step(loss),
                in_shardings=(s.model, s.opt) + (s.batch,) * len(batch),
                out_shardings=(s.model, s.opt, s.replicated),
            )
            xs = sh.place_batch(batch, mesh, axis)
            held[table] = placed

            def call(table=table, jitted=jitted, xs=xs, held=held):
                m_, o_, value = jitted(*held[table], *xs)
                held[table] = (m_, o_)
                return value

            steps[table] = call
        t = interleaved(steps, rounds=5, number=5)
        for table in steps:
            print(
                f"{name} {table}: {t[table] / 1e3:.2f} ms/step = "
                f"{t[table] / t['replicated']:.2f}x replicated (forced host devices, no budget)"
            )
    print(f"shard_memory_ratio: ratio={max(fsdp):.3f} (budget {1 / 4 + 0.05:.3f})")


if __name__ == "__main__":
    main()
