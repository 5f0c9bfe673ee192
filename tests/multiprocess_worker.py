"""One process of the jobs tests/test_multiprocess.py runs (under `shapeml launch`, or alone).

    python multiprocess_worker.py MODE OUT_DIR [JOB_DIR]

Modes: `train` (the training runs this job's process layout is given; in the 2-process job also a
sharded checkpoint of its Spotter run and the errors that need several processes; in a single
process also the one-device references and, from the 2-process job's JOB_DIR, its checkpoint
restored onto another table, mesh kind and process count), `kill` (the 2-process Spotter run
again, with checkpoints, whose process 1 dies once checkpoint 4 is complete), `resume` (the same
command again). Process 0 writes `OUT_DIR/MODE.json` and `OUT_DIR/MODE.npz`; every array is
gathered from all processes first.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from shapeml import distributed

INFO = distributed.initialize()  # first: before anything starts JAX

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

import shapeml as sm  # noqa: E402
from shapeml import nn, optim  # noqa: E402
from shapeml import sharding as sh  # noqa: E402
from shapeml.data import batches  # noqa: E402
from shapeml.training import train  # noqa: E402
from shapeml.zoo import spotter  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
MODE, OUT = sys.argv[1], Path(sys.argv[2])
MULTI = jax.process_count() > 1


class Tiny(sm.Model):
    """A one-block transformer built from `shapeml.nn` layers (the documented spellings)."""

    dims = sm.Dims(V=32, T=16, D=32, H=4, F="2 * D")
    embed: nn.Embedding = sm.submodel(nn.Embedding)
    ln1: nn.LayerNorm = sm.submodel(nn.LayerNorm)
    attn: nn.MultiHeadAttention = sm.submodel(
        nn.MultiHeadAttention.of(causal=True, positions="learned")
    )
    ln2: nn.LayerNorm = sm.submodel(nn.LayerNorm)
    up: nn.Linear = sm.submodel(nn.Linear.of(In="D", Out="F"))
    down: nn.Linear = sm.submodel(nn.Linear.of(In="F", Out="D"))


def tiny_loss(m: Tiny, tok):
    x = m.embed(tok[:, :-1])
    x = x + m.attn(m.ln1(x))
    x = x + m.down(jax.nn.gelu(m.up(m.ln2(x))))
    logp = jax.nn.log_softmax(m.embed.logits(x), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, tok[:, 1:, None], axis=-1))


def filled(cls: type, seed: int) -> sm.Model:
    """A model of `cls` with seeded values drawn here (`init` would compile a program)."""
    rng = np.random.default_rng(seed)
    abstract = jax.eval_shape(lambda: cls.init(seed=0))
    return jax.tree.map(
        lambda s: jnp.asarray((rng.standard_normal(s.shape) * 0.2).astype(s.dtype)), abstract
    )


RNG = np.random.default_rng(0)
IMG = RNG.integers(0, 256, (96, 1, 16, 16), dtype=np.uint8)
LABELS = RNG.integers(0, 4, 96).astype(np.int32)
TOKENS = RNG.integers(0, 32, (96, 16)).astype(np.int32)
MODELS = {
    "spotter": (spotter.Spotter, 1, spotter.loss, (IMG, LABELS)),
    "tiny": (Tiny, 2, tiny_loss, (TOKENS,)),
}
MESHES = {"fsdp": "data=4", "2d": "data=2,model=2"}


def tables(model: str) -> dict:
    """FSDP over `data` and tensor parallelism over `model`, in one table on a 2 x 2 mesh (and
    FSDP alone on 4 devices, the table a checkpoint is restored onto)."""
    if model == "spotter":
        return {
            "fsdp": {"D": "data", "Dt": "data"},
            "2d": {"D": "data", "Dt": "model", "Dc": "model"},
        }
    m = filled(Tiny, 2)
    # The MLP's hidden width F reaches `up.w` and `down.w` through their dim mappings where the
    # rules do (rules by the names the user wrote); else the layers' own `Out` is ruled.
    reaches = any(any(s) for s in jax.tree.leaves(sh.partition_specs(m, {"F": "model"})))
    return {"fsdp": {"D": "data"}, "2d": {"D": "data", "F" if reaches else "Out": "model"}}


# (model, table, mesh kind): what each process layout runs; together both models on both kinds
RUNS = {
    "2x2": [("spotter", "2d", "auto"), ("tiny", "2d", "explicit")],
    "1x4": [("spotter", "2d", "explicit"), ("tiny", "2d", "auto")],
}


def gathered(tree) -> dict[str, np.ndarray]:
    """Every leaf by dotted path, whole, on the host of every process."""
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    values = (
        multihost_utils.process_allgather([x for _, x in leaves], tiled=True)
        if MULTI
        else [np.asarray(x) for _, x in leaves]
    )
    return {
        jax.tree_util.keystr(p, simple=True, separator="."): np.asarray(v)
        for (p, _), v in zip(leaves, values, strict=True)
    }


def run(model: str, table: str | None, kind: str, **kw):
    """Six steps of `train` (SGD with momentum: linear in the gradient, so layouts agree up to
    float rounding), on a mesh unless `table` is None (one device)."""
    cls, seed, loss, arrays = MODELS[model]
    m = filled(cls, seed)
    opt = optim.sgd(m, lr=0.05, momentum=0.9)
    mesh = rules = None
    part = (0, 1)
    if table is not None:
        mesh = sh.make_mesh(MESHES[table], axis_types=kind)
        rules = tables(model)[table]
        part = sh.batch_part(mesh)
    data = kw.pop("data", None) or batches(*arrays, batch_size=16, seed=3, part=part, epochs=None)
    r = train(loss, m, opt, data, steps=6, log_every=1, mesh=mesh, rules=rules, progress=False,
              **kw)  # fmt: skip
    out = {"losses": [h["loss"] for h in r.history if "loss" in h]}
    if mesh is not None:
        specs = {
            jax.tree_util.keystr(p, simple=True, separator="."): s
            for p, s in jax.tree_util.tree_leaves_with_path(sh.partition_specs(m, rules))
        }
        placed = {
            jax.tree_util.keystr(p, simple=True, separator="."): a
            for p, a in jax.tree_util.tree_leaves_with_path(r.model)
        }
        out["layout"] = all(placed[k].sharding.spec == specs[k] for k in specs)
        out["specs"] = [[a for s in spec for a in ((s,) if isinstance(s, str) else s or ())]
                        for spec in specs.values()]  # fmt: skip
        out["kinds"] = sorted({t.name for a in placed.values() for t in a.sharding.mesh.axis_types})
        out["rules"] = rules
    return r, out


def code(f) -> str | None:
    try:
        f()
    except sm.ShapemlError as e:
        return e.code
    return None


def write(name: str, results: dict, arrays: dict[str, np.ndarray]) -> None:
    if INFO.index == 0:
        np.savez(OUT / f"{name}.npz", **arrays)
        (OUT / f"{name}.json").write_text(json.dumps(results))


def mode_train() -> None:
    layout = "2x2" if MULTI else "1x4"
    results: dict = {"info": [INFO.index, INFO.count, INFO.local_devices, INFO.devices]}
    arrays = {}
    if not MULTI:  # the one-device references
        for model in MODELS:
            r, res = run(model, None, "auto")
            results[f"ref/{model}"] = res
            arrays.update({f"ref/{model}/{k}": v for k, v in gathered(r.model).items()})
    for model, table, kind in RUNS[layout]:
        r, res = run(model, table, kind)
        name = f"{model}/{table}/{kind}"
        results[name] = res
        arrays.update({f"{name}/{k}": v for k, v in gathered(r.model).items()})
        if MULTI and model == "spotter":  # saved by 2 processes
            with distributed.CheckpointManager(OUT / "ckpt", keep=2) as ckpt:
                ckpt.save(6, r.model, r.opt)
            arrays.update({f"saved/{k}": v for k, v in gathered((r.model, r.opt)).items()})
    if MULTI:
        m = filled(spotter.Spotter, 1)
        mesh = sh.make_mesh("data=4")
        devices = mesh.devices.reshape(-1)
        shuffled = jax.sharding.Mesh(devices[[0, 2, 1, 3]], ("data",))
        results["errors"] = {
            "file_checkpoint": code(lambda: train(spotter.loss, m, optim.sgd(m, 0.1), [],
                                                  steps=1, mesh=mesh, checkpoint="x.safetensors",
                                                  progress=False)),
            "layout": code(lambda: sh.batch_part(shuffled)),
            "restore_without_mesh": code(
                lambda: distributed.CheckpointManager(OUT / "ckpt").restore(spotter.Spotter)),
        }  # fmt: skip
    else:
        results["restore"] = restore(Path(sys.argv[3]))
    write("train", results, arrays)


def restore(job: Path) -> dict:
    """The 2-process job's checkpoint (its Spotter run: the 2-d table, Auto axes), read by one
    process onto the FSDP table on Explicit axes, and onto one device; then `sm.shard`, `sm.save`
    and `sharding.load` on that Explicit mesh."""
    saved = dict(np.load(job / "train.npz"))
    saved = {k[len("saved/") :]: v for k, v in saved.items() if k.startswith("saved/")}
    ckpt = distributed.CheckpointManager(job / "ckpt")
    mesh = sh.make_mesh("data=4", axis_types="explicit")
    rules = tables("spotter")["fsdp"]
    m, opt = ckpt.restore_training(spotter.Spotter, mesh=mesh, rules=rules)
    back = gathered((m, opt))
    one = gathered(ckpt.restore(spotter.Spotter))
    specs = jax.tree.leaves(sh.partition_specs(m, rules))
    results = {
        "steps": ckpt.steps(),
        "bit_for_bit": sorted(back) == sorted(saved)
        and all(np.array_equal(back[k], saved[k]) for k in saved),
        "one_device": all(np.array_equal(v, saved[f"0.{k}"]) for k, v in one.items()),
        "layout": all(a.sharding.spec == s for a, s in zip(jax.tree.leaves(m), specs)),
        "kinds": sorted({t.name for a in jax.tree.leaves(m) for t in a.sharding.mesh.axis_types}),
        "opt_step": int(opt.step),
    }
    explicit = sh.make_mesh("data=2,model=2", axis_types="explicit")
    table = tables("spotter")["2d"]
    path = OUT / "m.safetensors"
    sm.save(path, sm.shard(m, explicit, table))
    loaded = sh.load(path, spotter.Spotter, mesh=explicit, rules=table)
    results["load"] = {
        "kinds": sorted({t.name for a in jax.tree.leaves(loaded) for t in a.sharding.mesh.axis_types}),
        "layout": all(
            a.sharding.spec == s
            for a, s in zip(jax.tree.leaves(loaded), jax.tree.leaves(sh.partition_specs(m, table)))
        ),
        "values": all(
            np.array_equal(np.asarray(a), np.asarray(b))
            for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(m))
        ),
    }  # fmt: skip
    return results


def killing(data, ckpt):
    """The batches; process 1 dies when asked for the fifth, once checkpoint 4 is complete."""
    for i, b in enumerate(data):
        if i == 4 and INFO.index == 1 and MODE == "kill":
            deadline = time.monotonic() + 120
            while ckpt.latest_step() != 4 and time.monotonic() < deadline:
                time.sleep(0.1)
            os.kill(os.getpid(), signal.SIGKILL)
        yield b


def mode_kill_or_resume() -> None:
    """The 2-process Spotter run of `train`, checkpointed every 2 steps (`kill`: process 1 dies
    once checkpoint 4 is complete; `resume`: the same, resumed from the last complete one)."""
    ckpt = distributed.CheckpointManager(OUT / "ckpt_kill", keep=2)
    mesh = sh.make_mesh(MESHES["2d"])
    data = batches(IMG, LABELS, batch_size=16, seed=3, part=sh.batch_part(mesh), epochs=None)
    try:
        r, res = run("spotter", "2d", "auto", data=killing(data, ckpt), checkpoint=ckpt,
                     checkpoint_every=2, resume=True)  # fmt: skip
    except sm.ShapemlError as e:
        (OUT / f"{MODE}_error_{INFO.index}.txt").write_text(f"{e.code}\n{e}")
        raise
    res["steps"] = ckpt.steps()
    write(MODE, res, {f"final/{k}": v for k, v in gathered(r.model).items()})


if __name__ == "__main__":
    mode_train() if MODE == "train" else mode_kill_or_resume()
