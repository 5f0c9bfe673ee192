"""Per-device bytes of params + optimizer state, and step time, for each rule table vs replicated;
then the same per process in a job of 2 processes x 2 devices, and the checkpoint bytes each writes.

Runs on 4 CPU devices (`sm.use_cpu_devices(4)`, called first).
For each table the bytes are counted from the placed arrays (each device's shards), checked
against `sm.memory_report`, and divided by the replicated layout's bytes: a table that splits
every field over an axis of size n should hold 1/n (plus the replicated step count). Step times
on forced host devices are reported, with no budget: CPU "devices" share the same cores, so
splitting buys no speed here, only memory.

The multi-process part launches this script again as 2 processes of 2 forced CPU devices each
(`distributed.launch`, gloo collectives): each process places the Spotter and its AdamW state on
a `data=4` mesh replicated and by the FSDP table, counts the bytes its own devices hold, and
writes the FSDP state as a sharded checkpoint (`distributed.CheckpointManager`, orbax), whose
bytes per process are read from each process's own files. Its last line is the per-process
ratio, FSDP over replicated (budget 1/4 + 5%).

    python benchmarks/shard_step.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import jax
import numpy as np
from _timing import interleaved

import shapeml as sm
from shapeml import distributed, optim
from shapeml import sharding as sh
from shapeml.zoo import spotter, transformer

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
    assert jax.device_count() >= 4, "needs 4 devices (sm.use_cpu_devices(4) before JAX starts)"
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
    multiprocess()


def _process_bytes(tree) -> int:
    """Bytes this process's devices hold of the tree's arrays."""
    return sum(s.data.nbytes for a in jax.tree.leaves(tree) for s in a.addressable_shards)


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def process_worker(out: Path) -> None:
    """One process of the 2 x 2 job: its bytes per table, and the checkpoint files it writes."""
    info = distributed.initialize()
    m = spotter.Spotter.init(seed=0, D=128, Dt=256, Dc=512)
    opt = optim.adamw(m, lr=1e-3)
    mesh = sh.make_mesh("data=4")
    result = {"process": info.index}
    for table, rules in (("replicated", {}), ("fsdp", {"D": "data", "Dt": "data"})):
        s = sh.step_shardings(m, opt, mesh, rules)
        placed = (sh.shard(m, mesh, rules), jax.device_put(opt, s.opt))
        result[table] = _process_bytes(placed)
        if table == "fsdp":
            # what this process writes: one copy of each shard (replica 0), its devices' only
            result["own"] = sum(
                s.data.nbytes
                for a in jax.tree.leaves(placed)
                for s in a.addressable_shards
                if s.replica_id == 0
            )
            with distributed.CheckpointManager(out / "ckpt") as ckpt:
                ckpt.save(1, *placed)
    arrays = out / "ckpt" / "1" / "arrays"
    result["checkpoint"] = _dir_bytes(arrays / f"ocdbt.process_{info.index}")
    result["state"] = sum(a.nbytes for a in jax.tree.leaves((m, opt)))
    (out / f"process_{info.index}.json").write_text(json.dumps(result))


def multiprocess() -> None:
    """Launches the 2 x 2 job and prints what each process held and wrote."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        distributed.launch(
            [sys.executable, __file__, "--process-worker", str(out)],
            processes=2,
            devices_per_process=2,
            timeout=600,
            out=sys.stderr,  # their own lines, tagged [i]: what went wrong if one fails
        )
        rows = [json.loads((out / f"process_{i}.json").read_text()) for i in range(2)]
    ratios = [r["fsdp"] / r["replicated"] for r in rows]
    for r, ratio in zip(rows, ratios):
        print(
            f"2 processes x 2 devices, process {r['process']}: {r['fsdp']:,} bytes of params + "
            f"adamw state under fsdp = {ratio:.3f} of replicated ({r['replicated']:,}); it "
            f"writes {r['own']:,} bytes of shards = {r['own'] / r['state']:.3f} of the whole "
            f"state ({r['state']:,}), as {r['checkpoint']:,} bytes of checkpoint files"
        )
    print(
        "(orbax compresses what it writes: the AdamW moments of a fresh optimizer are zeros, so "
        "the files hold less than the shards)"
    )
    print(f"multiprocess_memory_ratio: ratio={max(ratios):.3f} (budget {1 / 4 + 0.05:.2f})")


if __name__ == "__main__":
    jax.config.update("jax_platforms", "cpu")  # host devices, whatever accelerator is present
    if sys.argv[1:2] == ["--process-worker"]:
        process_worker(Path(sys.argv[2]))  # the launcher gave it 2 CPU devices
    else:
        sm.use_cpu_devices(4)
        main()
