"""Every `nn` layer and the zoo's models on an Explicit mesh (JAX's sharding in types, what
`jax.make_mesh` makes by default): placed by the names the user wrote, trained by `TrainStep`,
equal to one device; and each forward under the user's own plain `jax.jit`.

One subprocess of 4 forced host devices (the XLA flag must be set before JAX starts). The Spotter
on both mesh kinds, in one and in two processes, is in test_multiprocess.py.
"""

from __future__ import annotations

import textwrap

import pytest
from _forced_devices import result_of

SCRIPT = textwrap.dedent(
    """
    import json, warnings
    warnings.simplefilter("error")
    import jax
    jax.config.update("jax_numpy_rank_promotion", "raise")
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import AxisType
    import shapeml as sm
    from shapeml import nn, optim, sharding as sh
    from shapeml.training import TrainStep
    from jax.sharding import NamedSharding, PartitionSpec as P
    from shapeml.zoo import gpt2, spotter, transformer

    class Every(sm.Model):
        # every layer of shapeml.nn, declared in this model's names
        dims = sm.Dims(C=4, V=32, T=8, D=16, H=2, F="2 * D")
        conv: nn.Conv2d = sm.submodel(nn.Conv2d, Ci=1, Co="C", padding=1)
        bn: nn.BatchNorm = sm.submodel(nn.BatchNorm)
        maxpool: nn.MaxPool2d = sm.submodel(nn.MaxPool2d)
        avgpool: nn.AvgPool2d = sm.submodel(nn.AvgPool2d)
        proj: nn.Linear = sm.submodel(nn.Linear, In="4 * C", Out="D")
        embed: nn.Embedding = sm.submodel(nn.Embedding)
        ln: nn.LayerNorm = sm.submodel(nn.LayerNorm)
        attn: nn.MultiHeadAttention = sm.submodel(nn.MultiHeadAttention, causal=True)
        rms: nn.RMSNorm = sm.submodel(nn.RMSNorm)
        mlp: nn.MLP = sm.submodel(nn.MLP)
        drop: nn.Dropout = sm.submodel(nn.Dropout, rate=0.25)

    def every_loss(m, img, tok):
        x, bn = m.bn(m.conv(img), train=True)                      # [b C 8 8]
        x = m.avgpool(m.maxpool(jax.nn.relu(x)))                   # [b C 2 2]
        feat = m.proj(x.reshape(x.shape[0], -1))                   # [b D]
        h = m.embed(tok[:, :-1]) + feat[:, None, :]
        h = h + m.attn(m.ln(h))
        h = h + m.drop(m.mlp(m.rms(h)), key=jax.random.key(7))
        logp = jax.nn.log_softmax(m.embed.logits(h), axis=-1)
        nll = -jnp.mean(jnp.take_along_axis(logp, tok[:, 1:, None], axis=-1))
        return nll, m.replace(bn=bn)                               # the running statistics

    rng = np.random.default_rng(0)
    def filled(make):  # values drawn here: Model.init would compile an init program
        return jax.tree.map(
            lambda s: jnp.asarray((rng.standard_normal(s.shape) * 0.2).astype(s.dtype)),
            jax.eval_shape(make))

    every = filled(lambda: Every.init(seed=0))
    every = every.replace(bn=every.bn.replace(var=jnp.ones(4)))
    img = rng.standard_normal((8, 1, 8, 8)).astype(np.float32)
    tok = rng.integers(0, 32, (8, 9)).astype(np.int32)
    gpt_tok = rng.integers(0, 32, (8, 16)).astype(np.int32)
    CASES = {  # name: (model, loss, has_aux, batch, rules by the names the user wrote)
        "nn": (every, every_loss, True, (img, tok),
               {"C": "model", "D": "data", "H": "model", "F": "model"}),
        "transformer": (filled(lambda: transformer.Transformer.init(seed=0, T=16)),
                        transformer.loss, False, (gpt_tok,),
                        {"D": "data", "H": "model", "F": "model"}),
        "gpt2": (filled(lambda: gpt2.GPT2.init(seed=0, V=32, T=16, D=16, H=2, L=1)),
                 gpt2.loss, False, (gpt_tok,), {"V": "data", "F": "model"}),
    }
    mesh = sh.make_mesh("data=2,model=2", axis_types="explicit")
    out = {}
    for name, (m, loss, aux, batch, rules) in CASES.items():
        specs = jax.tree.leaves(sh.partition_specs(m, rules))
        placed = sm.shard(m, mesh, rules)
        runs = {}
        for where in ("mesh", "one"):
            kw = dict(mesh=mesh, rules=rules) if where == "mesh" else dict(devices=1)
            step = TrainStep(loss, m, optim.sgd(m, lr=0.05, momentum=0.9), has_aux=aux, **kw)
            losses = [float(step(*batch)) for _ in range(2)]
            runs[where] = (losses, step.model)
        (got, gm), (want, wm) = runs["mesh"], runs["one"]
        kinds = lambda t: sorted({a.name for x in jax.tree.leaves(t)
                                  for a in x.sharding.mesh.axis_types})
        diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                   for a, b in zip(jax.tree.leaves(gm), jax.tree.leaves(wm)))
        out[name] = {
            "split": sorted({a for s in specs for e in s
                             for a in ((e,) if isinstance(e, str) else e or ())}),
            "shard_kinds": kinds(placed),
            "shard_layout": all(x.sharding.spec == s for x, s in zip(jax.tree.leaves(placed), specs)),
            "step_kinds": kinds(gm),
            "step_layout": all(x.sharding.spec == s for x, s in zip(jax.tree.leaves(gm), specs)),
            "losses": [got, want],
            "params_diff": diff,
        }

    # A user's own plain `jax.jit` of each forward on `jax.make_mesh`'s (Explicit) mesh, with the
    # params placed by the rules (and by the FSDP preset) and the batch split over `data`, with
    # and without the mesh set as JAX's context: equal to one device.
    CASES["spotter"] = (filled(lambda: spotter.Spotter.init(seed=0)), None, False,
                        (rng.integers(0, 256, (8, 1, 16, 16), dtype=np.uint8),),
                        {"D": "data", "Dt": "model", "Dc": "model"})
    forwards = {"nn": lambda m, img, tok: every_loss(m, img, tok)[0],
                "transformer": transformer.forward, "gpt2": gpt2.forward,
                "spotter": spotter.forward}
    mesh = jax.make_mesh((2, 2), ("data", "model"))
    for name, (m, _, _, batch, rules) in CASES.items():
        want = np.asarray(forwards[name](m, *batch))
        runs = []
        for table in (rules, sh.fsdp("data")):
            placed = sm.shard(m, mesh, table)
            xs = [jax.device_put(b, NamedSharding(mesh, P("data"))) for b in batch]
            for context in (False, True):
                if context:
                    with jax.set_mesh(mesh):
                        got = jax.jit(forwards[name])(placed, *xs)
                else:
                    got = jax.jit(forwards[name])(placed, *xs)
                runs.append({
                    "diff": float(np.max(np.abs(np.asarray(got) - want))),
                    "kinds": sorted({a.name for a in got.sharding.mesh.axis_types}),
                })
        out.setdefault(name, {})["jit"] = runs
    print("RESULT" + json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def result() -> dict:
    return result_of(SCRIPT, 4)


@pytest.mark.parametrize("case", ["nn", "transformer", "gpt2"])
def test_on_an_explicit_mesh_placed_by_the_rules_and_trained_like_one_device(result, case):
    r = result[case]
    # the rules split both mesh axes, sm.shard and the step keep the layout and the mesh kind
    assert r["split"] == ["data", "model"], r
    assert r["shard_kinds"] == r["step_kinds"] == ["Explicit"], r
    assert r["shard_layout"] and r["step_layout"], r
    got, want = r["losses"]
    assert all(abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in zip(got, want)), r["losses"]
    assert got[0] != got[1]  # the step changed the model
    assert r["params_diff"] < 1e-5, r["params_diff"]


@pytest.mark.parametrize("case", ["nn", "transformer", "gpt2", "spotter"])
def test_a_users_own_jit_of_the_forward_on_an_explicit_mesh_equals_one_device(result, case):
    # by the rules and by the FSDP preset, with and without `jax.set_mesh`
    runs = result[case]["jit"]
    assert len(runs) == 4, runs
    for r in runs:
        assert r["diff"] <= 1e-5, runs
        assert r["kinds"] == ["Explicit"], runs
