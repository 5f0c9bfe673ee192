"""Optimizer state placed by structure on 4 forced host devices: AdamW's and Adafactor's state
leaves sit where their params are, a `TrainStep` on the mesh equals the one-device run, and the
bytes each device holds shrink as the specs say.

The expected specs are written out from what each leaf is: AdamW's `mu`/`nu`, the accumulated
gradients and the moving average copy their param; Adafactor's row statistics of a matrix are its
mean over its largest axis (`v_row`), its column statistics the mean over the other (`v_col`), so
each keeps the spec of the axis it keeps; its unfactored vectors keep a full second moment (`v`).
"""

from __future__ import annotations

import math
import textwrap

import jax
import optax
import pytest
from _forced_devices import result_of
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Float

import shapeml as sm
from shapeml import optim, sharding
from shapeml.state import KVCache

SCRIPT = textwrap.dedent(
    """
    import json, warnings
    warnings.simplefilter("error")
    import jax
    jax.config.update("jax_numpy_rank_promotion", "raise")
    import jax.numpy as jnp
    import numpy as np
    from jaxtyping import Array, Float
    import shapeml as sm
    from shapeml import optim, sharding
    from shapeml.training import TrainStep

    class Wide(sm.Model):  # Adafactor factors matrices whose two axes are >= 128
        dims = sm.Dims(D=128, F=256)
        w1: Float[Array, "D F"] = sm.param(sm.normal(std=0.05))
        w2: Float[Array, "F D"] = sm.param(sm.normal(std=0.05))
        b: Float[Array, " F"] = sm.param(sm.normal(std=0.1))

    def loss(m, x, y):
        h = jnp.tanh(x @ m.w1 + m.b[None, :])
        return jnp.mean((h @ m.w2 - y) ** 2)

    def named(tree):
        return {jax.tree_util.keystr(p, simple=True, separator="."): x
                for p, x in jax.tree_util.tree_leaves_with_path(tree)}

    def spec_list(spec):
        return [list(s) if isinstance(s, tuple) else s for s in spec]

    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 128)).astype(np.float32)
    y = rng.standard_normal((8, 128)).astype(np.float32)
    m = Wide.init(seed=0)
    mesh = sharding.make_mesh("data=2,model=2")
    rules = {"D": "data", "F": "model"}
    out = {}
    for name, make in {
        # eps near the gradients' size: Adam's first updates are g / |g|, which would turn float
        # rounding in a near-zero gradient entry into a full step of that entry
        "adamw": lambda m: optim.adamw(m, lr=1e-3, eps=1e-3, accumulate=2, ema=0.9),
        "adafactor": lambda m: optim.adafactor(m, lr=1e-2),
    }.items():
        res = out[name] = {}
        steps = {}
        for where, kw in {"one": {"devices": 1}, "mesh": {"mesh": mesh, "rules": rules}}.items():
            step = steps[where] = TrainStep(loss, m, make(m), **kw)
            for i in range(4):
                step(x, y)
        one, sharded = steps["one"], steps["mesh"]
        res["params"] = max(
            float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b))))
            for a, b in zip(jax.tree.leaves(sharded.model), jax.tree.leaves(one.model)))
        res["state"] = max(
            float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))
            for a, b in zip(*(map(lambda x: np.asarray(x, np.float64), jax.tree.leaves(s.opt))
                              for s in (sharded, one))))
        res["compiled"] = sharded.compiled_count()
        # where each state leaf is, as placed and trained, and as planned without placing
        opt = sharded.opt
        planned = named(sharding.step_shardings(m, make(m), mesh, rules).opt)
        res["specs"] = {k: spec_list(a.sharding.spec) for k, a in named(opt).items()}
        res["planned"] = all(a.sharding.is_equivalent_to(planned[k], np.ndim(a))
                             for k, a in named(opt).items())
        res["blocks"] = all(
            s.data.shape == a.sharding.shard_shape(a.shape)
            for a in jax.tree.leaves(opt) for s in a.addressable_shards)
        # bytes on device 0, counted from the arrays, and as the report computes them
        res["device_bytes"] = sum(
            s.data.nbytes for a in jax.tree.leaves(opt) for s in a.addressable_shards
            if s.device == jax.devices()[0])
        res["total_bytes"] = sum(a.nbytes for a in jax.tree.leaves(opt))
        res["shapes"] = {k: [list(a.shape), a.dtype.itemsize] for k, a in named(opt).items()}
        report = sharding.memory_report(m, mesh, rules, opt=make(m), file=None)
        res["report"] = sum(r.device_bytes for r in report.rows if r.name.startswith("opt."))
    print("RESULT" + json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def result():
    return result_of(SCRIPT, 4)


W = {"w1": ["data", "model"], "w2": ["model", "data"], "b": ["model"]}  # the params' specs
FLAGS = {f"state.{k}": [] for k in ("notfinite_count", "last_finite", "total_notfinite")}
ADAMW = {
    **FLAGS,
    "state.inner_state.mini_step": [],
    "state.inner_state.gradient_step": [],
    "state.inner_state.inner_opt_state.0.0.count": [],
    **{f"state.inner_state.inner_opt_state.0.0.{s}.{k}": v for s in ("mu", "nu") for k, v in W.items()},
    "state.inner_state.inner_opt_state.1.count": [],
    **{f"state.inner_state.inner_opt_state.1.ema.{k}": v for k, v in W.items()},
    **{f"state.inner_state.acc_grads.{k}": v for k, v in W.items()},
    "step": [],
}  # fmt: skip
ADAFACTOR = {
    **FLAGS,
    "state.inner_state.0.count": [],
    # w1 [D F]: rows reduce F (its largest axis) and keep D; columns reduce D and keep F
    "state.inner_state.0.v_row.w1": ["data"],
    "state.inner_state.0.v_col.w1": ["model"],
    # w2 [F D]: rows reduce F and keep D; columns reduce D and keep F
    "state.inner_state.0.v_row.w2": ["data"],
    "state.inner_state.0.v_col.w2": ["model"],
    # a vector is not factored: (1,) placeholders for its statistics, a full second moment `v`
    "state.inner_state.0.v_row.b": [None],
    "state.inner_state.0.v_col.b": [None],
    "state.inner_state.0.v.b": ["model"],
    "state.inner_state.0.v.w1": [None],
    "state.inner_state.0.v.w2": [None],
    "step": [],
}
EXPECTED = {"adamw": ADAMW, "adafactor": ADAFACTOR}
AXIS = {"data": 2, "model": 2}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_state_leaves_placed_where_their_params_are(result, name):
    res = result[name]
    assert res["specs"] == EXPECTED[name]
    assert res["planned"] and res["blocks"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_train_step_on_the_mesh_equals_one_device(result, name):
    assert result[name]["params"] < 1e-6
    assert result[name]["state"] < 1e-5
    assert result[name]["compiled"] == 1


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bytes_per_device_shrink_as_the_specs_say(result, name):
    res = result[name]
    expected = 0  # each leaf's bytes over the sizes of the mesh axes its expected spec names
    for key, (shape, itemsize) in res["shapes"].items():
        parts = math.prod(AXIS[a] for a in EXPECTED[name][key] if a)
        expected += math.prod(shape) * itemsize // parts
    assert res["device_bytes"] == res["report"] == expected
    # AdamW's state splits 4 ways; Adafactor's statistics each over the one axis they keep
    ratio = res["device_bytes"] / res["total_bytes"]
    assert ratio < {"adamw": 0.26, "adafactor": 0.51}[name], ratio


# -- no devices needed ----------------------------------------------------------------------------


class Tiny(sm.Model):
    dims = sm.Dims(D=4, F=8)
    w: Float[Array, "D F"] = sm.param(sm.normal(std=0.1))


class Other(sm.Model):
    dims = sm.Dims(D=4)
    w: Float[Array, "D D"] = sm.param(sm.normal(std=0.1))


def test_a_kv_cache_is_placed_by_the_same_table():
    rules = {"H": "tp", "F": "tp"}
    assert sharding.partition_spec(KVCache.AXES, rules) == P(None, None, None, "tp", None)
    assert sharding.partition_spec(("B", "T"), rules) == P(None, None)
    assert sharding.partition_spec(["H", "Dh"], {"Dh": ("x", "y")}) == P(None, ("x", "y"))


@pytest.mark.parametrize(
    "axes, rules, error, words",
    [
        ("LBTHD", {"H": "tp"}, sm.ArgumentError, ["sequence of dim names"]),
        (("H", 3), {"H": "tp"}, sm.ArgumentError, ["not a dim name"]),
        (("H*Dh",), {"H": "tp"}, sm.ArgumentError, ["not a dim name"]),
        (("H", "F"), {"H": "tp", "F": "tp"}, sharding.AxisReusedError, ["`H` and `F`"]),
        (("H",), ["H"], sharding.RuleTableError, ["mapping"]),
    ],
)
def test_partition_spec_errors_are_coded(axes, rules, error, words):
    with pytest.raises(error) as info:
        sharding.partition_spec(axes, rules)
    for w in words:
        assert w in str(info.value)


def test_optimizer_of_another_model_or_no_optimizer_is_refused():
    m, mesh = Tiny.init(seed=0), sharding.make_mesh("data=1")
    with pytest.raises(sm.ShapemlError) as info:
        sharding.step_shardings(m, optim.sgd(Other.init(seed=0), 0.1), mesh, {"F": "data"})
    assert info.value.code == "E1201"
    with pytest.raises(sm.ArgumentTypeError, match=r"sharding\.shardings\(m, mesh, rules\)"):
        sharding.shardings_like({"mu": {"w": m.w}}, m, mesh, {"F": "data"})


def test_a_transformation_optax_cannot_pair_is_placed_by_its_init():
    # L-BFGS's init reads a param's dtype, which optax's placeholder has not: nothing pairs, and
    # each leaf takes the spec its init gives it from the params' specs
    m, mesh = Tiny.init(seed=0), sharding.make_mesh("data=1")
    opt = optim.from_optax(m, optax.lbfgs())
    s = sharding.step_shardings(m, opt, mesh, {"F": "data"})
    specs = {
        jax.tree_util.keystr(p, simple=True, separator="."): x.spec
        for p, x in jax.tree_util.tree_leaves_with_path(s.opt)
    }
    assert specs["state.inner_state.0.params.w"] == P(None, "data")
    assert specs["state.inner_state.0.count"] == P()
    assert specs["state.inner_state.0.diff_params_memory.w"] == P(None, None, None)
