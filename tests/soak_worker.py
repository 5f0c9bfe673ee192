"""One process of the soak job (tests/test_soak.py, benchmarks/soak.py), under `shapeml launch`.

    python soak_worker.py OUT_DIR MODEL STEPS

Trains a small zoo model (`gpt2`, `transformer` or `spotter`) for STEPS steps with `train`, an
`eval_fn` and a `CheckpointManager` (what hung in the field), its params and optimizer state
split by `sharding.fsdp` over every device of the job; then saves the model with `sm.save` from
every process. Process 0 writes `OUT_DIR/result.json` (losses, the per-device memory ratio),
`OUT_DIR/final.npz` (the model, gathered) and `OUT_DIR/model.safetensors` (the one file).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax  # importing JAX starts nothing: `initialize` below still comes first
import numpy as np
from jax.experimental import multihost_utils

import shapeml as sm
from shapeml import distributed, optim
from shapeml import sharding as sh
from shapeml.data import batches
from shapeml.training import train
from shapeml.zoo import gpt2, spotter, transformer


def setup(name: str):
    """The model, its loss and its data (the same in every process and in the test's reference)."""
    rng = np.random.default_rng(0)
    if name == "gpt2":
        m = gpt2.GPT2.init(seed=0, V=64, T=16, D=32, H=4, L=1)
        return m, gpt2.loss, (rng.integers(0, 64, (64, 16)).astype(np.int32),)
    if name == "transformer":
        m = transformer.Transformer.init(seed=0, V=32, T=16)
        return m, transformer.loss, (rng.integers(0, 32, (64, 16)).astype(np.int32),)
    images = rng.integers(0, 256, (64, 1, 16, 16), dtype=np.uint8)
    return (
        spotter.Spotter.init(seed=0),
        spotter.loss,
        (images, rng.integers(0, 4, 64).astype(np.int32)),
    )


def main(out: Path, model: str, steps: int, collective_timeout: float) -> None:
    info = distributed.initialize(collective_timeout=collective_timeout)  # before any JAX call
    m, loss, arrays = setup(model)
    opt = optim.sgd(m, lr=0.05, momentum=0.9)
    mesh = sh.make_mesh(f"data={jax.device_count()}")
    rules = sh.fsdp("data")
    report = sh.memory_report(m, mesh, rules, opt=opt, file=None)
    data = batches(*arrays, batch_size=8, seed=1, part=sh.batch_part(mesh), epochs=None)
    held = [a[:8] for a in arrays]  # numpy: replicated over the job
    evaluate = jax.jit(loss)
    r = train(loss, m, opt, data, steps=steps, log_every=1, mesh=mesh, rules=rules, progress=False,
              eval_fn=lambda model: {"eval": float(evaluate(model, *held))}, eval_every=3,
              checkpoint=distributed.CheckpointManager(out / "ckpt", keep=2),
              checkpoint_every=4)  # fmt: skip
    path = sm.save(out / "model.safetensors", r.model)  # in every process: one file
    leaves = jax.tree_util.tree_leaves_with_path(r.model)
    whole = multihost_utils.process_allgather([x for _, x in leaves], tiled=True)
    # data parallel: a replicated model is whole in every process, saved by process 0 alone (as
    # torch.save under `if rank == 0:`), no collective
    rep = jax.device_put(r.model, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    if info.is_main:
        sm.save(out / "replicated.safetensors", rep)
        np.savez(out / "final.npz", **{
            jax.tree_util.keystr(p, simple=True, separator="."): np.asarray(v)
            for (p, _), v in zip(leaves, whole, strict=True)
        })  # fmt: skip
        result = {
            "losses": [h["loss"] for h in r.history if "loss" in h],
            "ratio": report.ratio,
            "info": [info.index, info.count, info.local_devices, info.devices],
            "path": str(path),
        }
        (out / "result.json").write_text(json.dumps(result))
    print("SOAK DONE", info.index, flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
