"""Sharding by named dims on 4 and 8 forced host devices: specs, bytes, numerics, checkpoints, errors.

Everything that needs several devices runs in one subprocess per device count (the XLA flag must
be set before JAX starts and slows single-device work, so it is never set in this process). The
reference for every numeric check is the same computation on one device.
"""

from __future__ import annotations

import json
import textwrap

import jax
import pytest
from _forced_devices import result_of, run_forced
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Float

import shapeml as sm
from shapeml import sharding
from shapeml.zoo.spotter import Spotter
from shapeml.zoo.transformer import Transformer

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, tempfile, warnings
    from pathlib import Path
    warnings.simplefilter("error")
    import jax
    jax.config.update("jax_numpy_rank_promotion", "raise")
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    import shapeml as sm
    from shapeml import optim, sharding as sh, _jax_internals as jxi
    from shapeml.int8 import Int8Model
    from shapeml.zoo import spotter, transformer

    N = jax.device_count()
    data_model = "data=2,model=2" if N == 4 else "data=2,model=4"
    out = {"devices": N}
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (16, 1, 16, 16), dtype=np.uint8)
    y = rng.integers(0, 4, 16).astype(np.int32)
    tok = rng.integers(0, 32, (8, 16)).astype(np.int32)
    CASES = {  # name: (model, loss, forward, batch, mesh, rules)
        "spotter_fsdp": ("spotter", f"data={N}", {"D": "data", "Dt": "data"}),
        "spotter_tp": ("spotter", data_model, {"Dt": "model", "Dc": "model"}),
        "spotter_2d": ("spotter", data_model, {"D": "data", "Dt": "model", "Dc": "model"}),
        "transformer_fsdp": ("transformer", f"data={N}", {"V": "data", "T": "data", "L": "data"}),
        "transformer_tp": ("transformer", data_model, {"H": "model", "F": "model"}),
    }
    # Each table's numerics run on one device count (compiling is what costs time here).
    NUMERICS = {4: ["spotter_fsdp", "transformer_fsdp", "transformer_tp"],
                8: ["spotter_tp", "spotter_2d"]}[N]
    def normal(*shape, std=0.2):  # drawn here: Model.init would compile an init program
        return (rng.standard_normal(shape) * std).astype(np.float32)

    L = N  # the transformer's FSDP table splits its layers over the data axis
    MODELS = {
        "spotter": (spotter.Spotter(w_e=normal(16, 32), tw1=normal(2, 16, 64),
                                    tw2=normal(2, 64, 16), cw1=normal(2, 32, 64),
                                    cw2=normal(2, 64, 32), w_h=normal(32, 4)),
                    spotter.loss, spotter.forward, (img, y)),
        "transformer": (transformer.Transformer(
            dims=dict(L=L), embed=normal(32, 32, std=0.3), pos=normal(64, 32, std=0.1),
            **{k: normal(L, 32, 32, std=0.1) for k in ("wq", "wk", "wv", "wo")},
            w1=normal(L, 32, 64, std=0.1), w2=normal(L, 64, 32, std=0.1)),
            transformer.loss, transformer.forward, (tok,)),
    }

    def named(tree):  # leaves by dotted name (`blocks.0.w1`), paired by path
        return {jax.tree_util.keystr(p, simple=True, separator="."): x
                for p, x in jax.tree_util.tree_leaves_with_path(tree)}

    def file_parts(path):
        # safetensors writes its metadata map in no fixed order, so two saves of one model can
        # differ in bytes: compare the parsed header and the tensor bytes after it
        raw = Path(path).read_bytes()
        n = int.from_bytes(raw[:8], "little")
        return json.loads(raw[8 : 8 + n]), raw[8 + n :]

    def spec_list(spec):
        return [list(s) if isinstance(s, tuple) else s for s in spec]

    def train(m, opt, loss, fwd, batch, shardings=None):
        # six steps of one compiled step; the first step returns the forward output too
        def with_logits(m, *batch):
            return loss(m, *batch), fwd(m, batch[0])

        def step(m, opt, *batch):
            (value, logits), g = sm.value_and_grad(with_logits, m, *batch, has_aux=True)
            m, opt = optim.update(m, opt, g)
            return m, opt, value, logits
        if shardings is None:
            jitted = jax.jit(step)
        else:
            s = shardings
            jitted = jax.jit(step, in_shardings=(s.model, s.opt) + (s.batch,) * len(batch),
                             out_shardings=(s.model, s.opt, s.replicated, s.batch))
        losses = []
        for i in range(6):
            m, opt, value, logits = jitted(m, opt, *batch)
            losses.append(float(value))
            first = np.asarray(logits) if i == 0 else first
        return m, opt, losses, first, jxi.compiled_count(jitted)

    def make_opt(m):
        # SGD with momentum: its update is linear in the gradient, so the one-device and sharded
        # runs stay within float rounding (Adam's first steps are g / |g|, which turns rounding
        # noise in a near-zero gradient entry into a full step)
        return optim.sgd(m, lr=0.02, momentum=0.9, weight_decay=1e-3)

    ref = {}
    for name, (m, loss, fwd, batch) in MODELS.items():
        if any(c.startswith(name) for c in NUMERICS):
            ref[name] = train(m, make_opt(m), loss, fwd, batch)

    for case, (model, mesh_text, rules) in CASES.items():
        m, loss, fwd, batch = MODELS[model]
        mesh = sh.make_mesh(mesh_text)
        res = out[case] = {}
        res["specs"] = {k: spec_list(v) for k, v in
                        named(sh.partition_specs(m, rules)).items()}
        placed = sh.shard(m, mesh, rules)
        plans = sh.field_plans(m, rules)
        report = sh.memory_report(m, mesh, rules, file=None)
        res["layout"] = all(
            a.sharding.spec == plans[k].spec and len(a.addressable_shards) == N and all(
                s.data.shape == plans[k].local_shape(dict(mesh.shape))
                for s in a.addressable_shards)
            for k, a in sm.params(placed).items())
        # bytes on each device, counted from the placed arrays (the report computes them)
        per_device = {}
        for a in sm.params(placed).values():
            for s in a.addressable_shards:
                per_device[s.device.id] = per_device.get(s.device.id, 0) + s.data.nbytes
        res["device_bytes"] = sorted(set(per_device.values()))
        res["report"] = [report.device_bytes, report.total_bytes]
        res["field_bytes"] = {r.name: [r.total_bytes, r.device_bytes] for r in report.rows}
        res["axis"] = {k: int(v) for k, v in mesh.shape.items()}
        res["values"] = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
                            zip(jax.tree.leaves(placed), jax.tree.leaves(m)))
        if case not in NUMERICS:
            continue
        batch_axis = "data"
        xs = sh.place_batch(batch, mesh, batch_axis)
        opt = make_opt(m)
        s = sh.step_shardings(m, opt, mesh, rules, batch_axis)
        m6, opt6, losses, logits, compiled = train(
            placed, jax.device_put(opt, s.opt), loss, fwd, xs, s)
        rm, ropt, rlosses, rlogits, _ = ref[model]
        res["forward"] = float(np.max(np.abs(logits - rlogits)) / np.max(np.abs(rlogits)))
        res["compiled"] = compiled
        # errors relative to the reference's size (float rounding in another summation order)
        res["finite"] = bool(np.all(np.isfinite(losses)))
        res["losses"] = float(np.max(np.abs(np.array(losses) - rlosses) / np.abs(rlosses)))
        res["params"] = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))) /
                                  np.max(np.abs(np.asarray(b))))
                            for a, b in zip(jax.tree.leaves(m6), jax.tree.leaves(rm)))
        res["stays_sharded"] = all(
            a.sharding.spec == plans[k].spec for k, a in sm.params(m6).items())
        mu = sh.shardings_like(opt6, m, mesh, rules)
        res["opt_layout"] = all(
            a.sharding.is_equivalent_to(b, np.ndim(a)) for a, b in
            zip(jax.tree.leaves(opt6), jax.tree.leaves(mu)))
        res["opt_split"] = sum(not a.sharding.is_fully_replicated
                               for a in jax.tree.leaves(opt6))
        # checkpoints: a sharded save writes the unsharded file; a load lands on the shards
        with tempfile.TemporaryDirectory() as tmp:
            a, b = os.path.join(tmp, "a.safetensors"), os.path.join(tmp, "b.safetensors")
            sm.save(a, m6)
            sm.save(b, jax.device_get(m6))
            res["same_file"] = file_parts(a) == file_parts(b)
            back = sh.load(a, type(m), mesh=mesh, rules=rules)
            res["load_layout"] = all(
                x.sharding.spec == plans[k].spec and all(
                    s.data.shape == plans[k].local_shape(dict(mesh.shape))
                    for s in x.addressable_shards)
                for k, x in sm.params(back).items())
            res["load_values"] = all(np.array_equal(np.asarray(x), np.asarray(z)) for x, z in
                                     zip(jax.tree.leaves(back), jax.tree.leaves(m6)))
            like = sh.load(a, like=m6, mesh=mesh, rules={})
            res["load_replicated"] = all(x.sharding.is_fully_replicated
                                         for x in jax.tree.leaves(like))
            plain = sm.load(a, type(m))
            res["load_plain"] = all(np.array_equal(np.asarray(x), np.asarray(z)) for x, z in
                                    zip(jax.tree.leaves(plain), jax.tree.leaves(back)))

    # int8: heads and FFN width on `tp` by the same rules reproduce its tensor-parallel placement
    q = Int8Model.random(0)
    tp = q.tp_params(4)
    rules = {"H": "tp", "F": "tp"}
    specs = named(sh.partition_specs(q, rules))
    out["int8"] = {k: a.sharding.is_equivalent_to(NamedSharding(a.sharding.mesh, specs[k]),
                                                   np.ndim(a))
                   for k, a in sm.buffers(tp).items()}
    out["int8_split"] = sorted(k for k, s in specs.items() if any(s))

    # errors that need a mesh
    def code(f):
        try:
            f()
        except sm.ShapemlError as e:
            return [e.code, str(e)]
        return None

    m = MODELS["spotter"][0]
    mesh = sh.make_mesh(data_model)
    saved = os.path.join(tempfile.mkdtemp(), "s.safetensors")
    sm.save(saved, m)
    two_heads = Int8Model.random(1, heads=2)  # H*Dh = 32 splits 4 or 8 ways, H = 2 does not
    out["errors"] = {
        "axis": code(lambda: sh.shard(m, mesh, {"D": "modle"})),
        "axis_tuple": code(lambda: sh.shardings(m, mesh, {"D": ("data", "pipe")})),
        "indivisible": code(lambda: sh.shard(m, mesh, {"L": ("data", "model")})),
        "indivisible_factor": code(
            lambda: sh.memory_report(two_heads, sh.make_mesh(f"tp={N}"), {"H": "tp"}, file=None)),
        "batch_axis": code(lambda: sh.step_shardings(m, optim.sgd(m, 0.1), mesh, {}, "batch")),
        "batch_rows": code(lambda: sh.place_batch((img[:3],), mesh)),
        "mesh_devices": code(lambda: sh.make_mesh(f"data={2 * N}")),
        "load_rules": code(lambda: sh.load(saved, spotter.Spotter, mesh=mesh,
                                           rules={"Dtt": "model"})),
        "load_indivisible": code(lambda: sh.load(saved, spotter.Spotter, mesh=mesh,
                                                 rules={"L": ("data", "model")})),
    }
    print("RESULT" + json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def result4():
    return result_of(SCRIPT, 4)


@pytest.fixture(scope="module")
def result8():
    return result_of(SCRIPT, 8)


@pytest.fixture(params=[4, 8], ids=["4dev", "8dev"])
def result(request):
    out = request.getfixturevalue(f"result{request.param}")
    assert out["devices"] == request.param
    return out


NUMERICS = [(4, "spotter_fsdp"), (4, "transformer_fsdp"), (4, "transformer_tp"),
            (8, "spotter_tp"), (8, "spotter_2d")]  # fmt: skip


FSDP_SPOTTER = {
    "w_e": [None, "data"],
    "tw1": [None, None, "data"],
    "tw2": [None, "data", None],
    "cw1": [None, "data", None],
    "cw2": [None, None, "data"],
    "w_h": ["data", None],
}
SPECS = {
    "spotter_fsdp": FSDP_SPOTTER,
    "spotter_tp": {
        "w_e": [None, None],
        "tw1": [None, None, "model"],
        "tw2": [None, "model", None],
        "cw1": [None, None, "model"],
        "cw2": [None, "model", None],
        "w_h": [None, None],
    },
    "spotter_2d": {
        "w_e": [None, "data"],
        "tw1": [None, None, "model"],
        "tw2": [None, "model", None],
        "cw1": [None, "data", "model"],
        "cw2": [None, "model", "data"],
        "w_h": ["data", None],
    },
    # FSDP splits the float transformer by vocabulary, positions and layers; tensor parallelism
    # splits attention by heads (its weights are spelled `L D H*Dh`) and the FFN by width.
    "transformer_fsdp": {
        "embed": ["data", None],
        "pos": ["data", None],
        **{k: ["data", None, None] for k in ("wq", "wk", "wv", "wo", "w1", "w2")},
    },
    "transformer_tp": {
        "embed": [None, None],
        "pos": [None, None],
        **{k: [None, None, "model"] for k in ("wq", "wk", "wv")},
        "wo": [None, "model", None],
        "w1": [None, None, "model"],
        "w2": [None, "model", None],
    },
}
CASES = sorted(SPECS)


@pytest.mark.parametrize("case", CASES)
def test_spec_of_every_field(result, case):
    assert result[case]["specs"] == SPECS[case]


@pytest.mark.parametrize("case", CASES)
def test_placed_as_planned_and_values_kept(result, case):
    assert result[case]["layout"]
    assert result[case]["values"]


@pytest.mark.parametrize("case", CASES)
def test_bytes_per_device_shrink_by_the_axis_size(result, case):
    res, axis = result[case], result[case]["axis"]
    for name, spec in SPECS[case].items():
        parts = 1
        for a in spec:
            parts *= axis[a] if a else 1
        total, device = res["field_bytes"][name]
        assert device * parts == total, name
    device, total = res["report"]
    # every device holds the same bytes, and the placed arrays hold what the report says
    assert res["device_bytes"] == [device]
    if case.endswith("fsdp"):
        assert device * result["devices"] == total


@pytest.mark.parametrize("devices, case", NUMERICS)
def test_forward_and_six_steps_equal_one_device(request, devices, case):
    res = request.getfixturevalue(f"result{devices}")[case]
    assert res["finite"]
    assert res["forward"] < 1e-5
    assert res["losses"] < 1e-5
    assert res["params"] < 1e-5
    assert res["compiled"] == 1
    assert res["stays_sharded"]


@pytest.mark.parametrize("devices, case", NUMERICS)
def test_optimizer_state_placed_like_params(request, devices, case):
    res = request.getfixturevalue(f"result{devices}")[case]
    assert res["opt_layout"]
    # the momentum of every split param is split with it; the step count is replicated
    assert res["opt_split"] == sum(any(s) for s in SPECS[case].values())


@pytest.mark.parametrize("devices, case", NUMERICS)
def test_checkpoint_round_trip(request, devices, case):
    res = request.getfixturevalue(f"result{devices}")[case]
    assert res["same_file"]
    assert res["load_layout"] and res["load_values"]
    assert res["load_replicated"] and res["load_plain"]


def test_int8_tp_placement_by_the_same_rules(result):
    assert result["int8"] and all(result["int8"].values()), result["int8"]
    assert result["int8_split"] == ["w1", "w2", "wk", "wo", "wq", "wv"]


@pytest.mark.parametrize(
    "name, code, words",
    [
        ("axis", "E1902", ["modle", "similar name exists: `model`"]),
        ("axis_tuple", "E1902", ["pipe"]),
        ("indivisible", "E1903", ["`L` = 2", "model"]),
        ("indivisible_factor", "E1903", ["`H` = 2 in `H*Dh`"]),
        ("batch_axis", "E1902", ["batch"]),
        ("batch_rows", "E1903", ["3 rows"]),
        ("mesh_devices", "E1906", ["devices"]),
        ("load_rules", "E1901", ["Dtt", "similar name exists: `Dt`"]),
        ("load_indivisible", "E1903", ["`L` = 2"]),
    ],
)
def test_mesh_errors_are_coded(result, name, code, words):
    got = result["errors"][name]
    assert got is not None, name
    assert got[0] == code, got
    for w in words:
        assert w in got[1], got[1]


# -- no devices needed: plans, rule tables, parsing ----------------------------------------------


def _named(tree) -> dict:
    return {
        jax.tree_util.keystr(p, simple=True, separator="."): x
        for p, x in jax.tree_util.tree_leaves_with_path(tree)
    }


def _specs(m, rules) -> dict:
    return {k: list(v) for k, v in _named(sharding.partition_specs(m, rules)).items()}


def test_partition_specs_need_no_mesh():
    assert _specs(Spotter.init(seed=0), {"D": "data", "Dt": "data"}) == FSDP_SPOTTER


def test_derived_dims_and_expressions():
    m = Spotter.init(seed=0)
    # a derived dim is a dim like any other; an expression is replicated unless ruled (by its
    # spelling, or through its first factor)
    assert _specs(m, {"N": "x"})["tw1"] == [None, "x", None]
    assert _specs(m, {"P * P": "x"})["w_e"] == ["x", None]
    assert _specs(m, {"P": "x"})["w_e"] == ["x", None]
    with pytest.raises(sharding.UnknownRuleDimError, match="no field's axis is spelled with"):
        _specs(m, {"S": "x"})  # `S` is a dim, but it places nothing: a mistake in the table
    assert _specs(m, {"D": ("x", "y")})["w_h"] == [("x", "y"), None]


@pytest.mark.parametrize(
    "rules, code, words",
    [
        ({"Dtt": "model"}, "E1901", ["Dtt", "`Dt`"]),
        ({"heads": "model"}, "E1901", ["dims: C, D, Dc, Dt, L, N, P, S"]),
        ({"D": "model", "Dc": "model"}, "E1904", ["`cw1`", "`D`", "`Dc`"]),
        ({"D": 2}, "E1905", ["rule `D`"]),
        ({"D": ()}, "E1905", ["rule `D`"]),
        ({"D": ("x", "x")}, "E1905", ["twice"]),
        ({3: "x"}, "E1905", ["not a dim name"]),
        ({"P*P": "x", "P * P": "y"}, "E1905", ["`P * P`"]),
        (["D"], "E1905", ["mapping"]),
    ],
)
def test_rule_errors_are_coded(rules, code, words):
    with pytest.raises(sm.ShapemlError) as info:
        sharding.partition_specs(Spotter.init(seed=0), rules)
    assert info.value.code == code
    for w in words:
        assert w in str(info.value)


class Square(sm.Model):
    dims = sm.Dims(D=8, H=2, Dh="D // H")
    w: Float[Array, "D D"] = sm.param(sm.normal(std=0.1))


def test_a_field_reading_a_dim_twice_names_the_fix():
    with pytest.raises(sharding.AxisReusedError, match="reads `D` twice") as info:
        sharding.partition_specs(Square.init(seed=0), {"D": "model"})
    assert "H*Dh" in str(info.value)
    # spelled by heads, the same weights split by one rule
    assert sharding.partition_specs(Transformer.init(seed=0), {"D": "model"}).wq == P(
        None, "model", None
    )


def test_parse_mesh_and_rules():
    assert sharding.mesh_shape("data=2, model=4") == {"data": 2, "model": 4}
    assert sharding.parse_rules(["D=model", "F=data+model"]) == {
        "D": "model",
        "F": ("data", "model"),
    }
    assert sharding.parse_rules("D=data,F=model") == {"D": "data", "F": "model"}
    mesh = sharding.make_mesh("data=1")
    assert dict(mesh.shape) == {"data": 1}


@pytest.mark.parametrize(
    "text", ["data", "data=0", "data=2,data=2", "2=data", "data=x", "data=-1", ""]
)
def test_bad_mesh_text_is_coded(text):
    with pytest.raises(sharding.MeshSpecError):
        sharding.mesh_shape(text)


@pytest.mark.parametrize("text", ["D", "D=", "D=a,D=b", "D=a b", "D=a+"])
def test_bad_rule_text_is_coded(text):
    with pytest.raises(sharding.RuleTableError):
        sharding.parse_rules(text)


def test_load_without_mesh_is_sm_load(tmp_path):
    m = Spotter.init(seed=3)
    sm.save(tmp_path / "m.safetensors", m)
    back = sharding.load(tmp_path / "m.safetensors", Spotter)
    assert all(
        (a == b).all() for a, b in zip(sm.params(back).values(), sm.params(m).values(), strict=True)
    )
    with pytest.raises(sm.ArgumentError, match="no mesh"):
        sharding.load(tmp_path / "m.safetensors", Spotter, rules={"D": "data"})


TRAIN_SCRIPT = textwrap.dedent(
    """
    import json
    import jax, numpy as np
    import shapeml as sm
    from shapeml import cli, optim, sharding
    from shapeml.apps.spotter_job import spotter_loss
    from shapeml.data import batches, shapes
    from shapeml.training import TrainStep, train
    from shapeml.zoo.spotter import Spotter

    img, y = shapes.draw(64, seed=0)
    m = Spotter.init(seed=0)
    rules = {"D": "data", "Dc": "model", "Dt": "model"}
    mesh = sharding.make_mesh("data=2,model=2")
    out = {}
    runs = {}
    for name, kw in {"one": {"devices": 1}, "mesh": {"mesh": mesh, "rules": rules}}.items():
        opt = optim.sgd(m, lr=0.05, momentum=0.9)
        r = train(spotter_loss, m, opt, batches(img, y, batch_size=16, seed=0), steps=6,
                  has_aux=True, progress=False, **kw)
        runs[name] = r
    out["max_diff"] = max(
        float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
        for a, b in zip(jax.tree.leaves(runs["one"].model), jax.tree.leaves(runs["mesh"].model))
    )
    out["cw1_spec"] = list(runs["mesh"].model.cw1.sharding.spec)
    step = TrainStep(spotter_loss, m, optim.adamw(m, lr=1e-3), has_aux=True, mesh=mesh,
                     rules=rules)
    for i in range(3):
        step(img[16 * i : 16 * i + 16], y[16 * i : 16 * i + 16])
    out["compiled"] = step.compiled_count()
    out["opt_mu_spec"] = [
        list(x.sharding.spec) for x in jax.tree.leaves(step.opt) if x.shape == m.cw1.shape
    ][0]
    out["cli"] = cli.main([
        "train", "--steps", "4", "--train-size", "64", "--batch-size", "16", "--test-size", "16",
        "--mesh", "data=2,model=2", "--shard", "Dc=model", "--accumulate", "2",
        "--ema", "0.5", "--no-progress", "--out", "OUT",
    ])
    loaded = sm.load("OUT", Spotter)
    out["saved_is_finite"] = all(bool(np.isfinite(np.asarray(x)).all()) for x in jax.tree.leaves(loaded))
    print("RESULT" + json.dumps(out))
    """
)


def test_train_on_a_mesh_by_rules_equals_one_device(tmp_path):
    out_path = tmp_path / "spotter.safetensors"
    proc = run_forced(TRAIN_SCRIPT.replace("OUT", str(out_path)), 4)
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res["max_diff"] < 1e-5  # six steps on a 2x2 mesh (FSDP + TP) equal one device
    assert res["cw1_spec"] == [None, "data", "model"]
    assert res["opt_mu_spec"] == [None, "data", "model"]  # optimizer state placed like its param
    assert res["compiled"] == 1
    assert res["cli"] == 0 and res["saved_is_finite"]
    assert "held-out accuracy" in proc.stdout


def test_the_fsdp_preset_splits_each_field_along_its_largest_free_axis():
    from shapeml.zoo import gpt2

    m = Transformer.init(seed=0)  # wq [L D H*Dh], w1 [L D F], embed [V D], ...
    specs = sharding.partition_specs(m, sharding.fsdp("data"))
    for name in ("embed", "pos", "wq", "wo", "w1", "w2"):
        spec, shape = getattr(specs, name), getattr(m, name).shape
        largest = max(range(len(shape)), key=lambda i: (shape[i], -i))
        assert spec == P(*(("data" if i == largest else None) for i in range(len(shape)))), name
    # composed with a tensor-parallel table: the table first, then the largest axis left
    both = sharding.partition_specs(m, sharding.fsdp("data", {"F": "model"}))
    assert both.w1 == P(None, "data", "model") and both.w2 == P(None, "model", "data")
    # over two mesh axes at once, and what the table already uses for a field is left out
    two = sharding.partition_specs(m, sharding.fsdp(("data", "model"), {"F": "model"}))
    assert two.embed == P(None, ("data", "model")) or two.embed == P(("data", "model"), None)
    assert two.w1 == P(None, "data", "model")
    g = gpt2.GPT2.init(seed=0, V=64, T=16, D=32, H=4, L=1)
    mlp = sharding.partition_specs(g, sharding.fsdp("data", {"F": "model"})).h[0].mlp
    assert mlp.up.w == P("data", "model") and mlp.down.w == P("model", "data")
    assert repr(sharding.fsdp("data", {"F": "model"})) == "fsdp('data', {'F': 'model'})"


@pytest.mark.parametrize(
    "call, code",
    [
        (lambda: sharding.fsdp(3), "E0003"),
        (lambda: sharding.fsdp(("data", "data")), "E0003"),
        (lambda: sharding.fsdp("data", {"F": 3}), "E1905"),
        (
            lambda: sharding.partition_specs(
                Transformer.init(seed=0), sharding.fsdp("data", {"Q": "m"})
            ),
            "E1901",
        ),
    ],
)
def test_fsdp_preset_errors_are_coded(call, code):
    with pytest.raises(sm.ShapemlError) as e:
        call()
    assert e.value.code == code, str(e.value)
