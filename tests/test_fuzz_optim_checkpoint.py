"""Property tests of the optimizer checkpoint reader: a checkpoint with random or mutated optimizer
metadata, or mutated tensors, loads correctly or raises a coded `ShapemlError`, never a raw
exception. Each test counts the inputs it tried and what became of them."""

import collections
import json
import warnings

import jax
import numpy as np
import pytest
import safetensors.numpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jaxtyping import Array, Float

import shapeml as sm
from shapeml import optim


class Net(sm.Model):
    dims = sm.Dims(I=3, H=4)
    w: Float[Array, "I H"] = sm.param(sm.normal(std=0.5))
    b: Float[Array, " H"] = sm.param(sm.zeros, decay=False)


def make_opt(m):
    lr = optim.warmup(2, optim.cosine(1e-2, 10))
    return optim.adamw(
        m, lr=lr, transforms=[optim.clip_norm(1.0)], mask=~optim.mask("b"), ema=0.9, accumulate=2
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    m = Net.init(seed=0)
    path = sm.save_checkpoint(tmp_path_factory.mktemp("fuzz") / "c.safetensors", m, make_opt(m))
    arrays = safetensors.numpy.load_file(str(path))
    with safetensors.safe_open(str(path), "numpy") as f:
        return arrays, f.metadata()


def outcome(path, like=None) -> str:
    """Loads `path`; the name of what happened (a coded error's code, or "loaded")."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", sm.ShapemlWarning)  # W1301 on NaN is expected
            m, opt = sm.load_checkpoint(path, Net, like=like)
    except sm.ShapemlError as e:
        assert str(e).startswith(f"[{e.code}]") and "help:" in str(e)
        return e.code
    assert isinstance(m, Net) and isinstance(opt, optim.Optimizer[Net])
    return "loaded"


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=10,
)


def paths_of(tree, prefix=()):
    """Every path to a value inside a JSON tree (dict keys and list indices)."""
    yield prefix
    items = (
        tree.items()
        if isinstance(tree, dict)
        else enumerate(tree)
        if isinstance(tree, list)
        else ()
    )
    for k, v in items:
        yield from paths_of(v, (*prefix, k))


def mutated(cfg, path, action, value):
    if not path:
        return value
    parent = cfg
    for k in path[:-1]:
        parent = parent[k]
    if action == "delete" and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return cfg


def test_mutated_optimizer_metadata_loads_or_raises_a_coded_error(saved, tmp_path):
    arrays, meta = saved
    tried = collections.Counter()
    path = tmp_path / "m.safetensors"

    @settings(
        max_examples=80,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(data=st.data())
    def check(data):
        cfg = json.loads(meta["shapeml.optimizer"])
        kind = data.draw(st.sampled_from(["replace", "delete", "text", "truncate", "drop"]))
        new_meta = dict(meta)
        if kind in ("replace", "delete"):
            where = data.draw(st.sampled_from(list(paths_of(cfg))))
            cfg = mutated(cfg, where, kind, data.draw(JSON))
            new_meta["shapeml.optimizer"] = json.dumps(cfg)
        elif kind == "text":
            new_meta["shapeml.optimizer"] = data.draw(st.text(max_size=40))
        elif kind == "truncate":
            text = meta["shapeml.optimizer"]
            new_meta["shapeml.optimizer"] = text[: data.draw(st.integers(0, len(text) - 1))]
        else:
            del new_meta["shapeml.optimizer"]
        safetensors.numpy.save_file(arrays, str(path), metadata=new_meta)
        tried[outcome(path)] += 1

    check()
    print(f"optimizer metadata: {sum(tried.values())} inputs tried: {dict(tried)}")
    assert sum(tried.values()) >= 80 and set(tried) - {"loaded"}


DTYPES = [np.float16, np.float32, np.float64, np.int32, np.int64, np.bool_, np.uint8]


def test_mutated_tensors_load_or_raise_a_coded_error(saved, tmp_path):
    arrays, meta = saved
    names = sorted(arrays)
    like = make_opt(Net.init(seed=0))
    tried = collections.Counter()
    path = tmp_path / "t.safetensors"

    @settings(
        max_examples=80,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(data=st.data())
    def check(data):
        new = dict(arrays)
        for _ in range(data.draw(st.integers(1, 3))):
            name = data.draw(st.sampled_from(names))
            action = data.draw(
                st.sampled_from(["drop", "dtype", "shape", "rename", "values", "add"])
            )
            a = arrays[name]
            if action == "drop":
                new.pop(name, None)
            elif action == "dtype":
                new[name] = a.astype(data.draw(st.sampled_from(DTYPES)))
            elif action == "shape":
                new[name] = np.zeros((*a.shape, data.draw(st.integers(0, 2))), a.dtype)
            elif action == "rename":
                new[name + data.draw(st.sampled_from(["x", ".0", "_"]))] = new.pop(name, a)
            elif action == "values":
                fills = [-1, 0, 2**31 - 1] + ([np.nan, np.inf] if a.dtype.kind == "f" else [])
                new[name] = np.full(a.shape, data.draw(st.sampled_from(fills))).astype(a.dtype)
            else:
                new["opt." + data.draw(st.text("abc.0", min_size=1, max_size=8))] = a
        safetensors.numpy.save_file(new, str(path), metadata=meta)
        template = like if data.draw(st.booleans()) else None
        tried[outcome(path, template)] += 1

    check()
    print(f"optimizer tensors: {sum(tried.values())} inputs tried: {dict(tried)}")
    assert sum(tried.values()) >= 80 and "E1301" in tried


def test_the_unmutated_file_restores_bit_for_bit(saved, tmp_path):
    arrays, meta = saved
    path = tmp_path / "same.safetensors"
    safetensors.numpy.save_file(arrays, str(path), metadata=meta)
    m, opt = sm.load_checkpoint(path, Net)
    m2, opt2 = sm.load_checkpoint(path, Net, like=make_opt(Net.init(seed=1)))
    for a, b in zip(jax.tree.leaves((m, opt)), jax.tree.leaves((m2, opt2))):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(m.w, arrays["model.w"])
    np.testing.assert_array_equal(opt.step, arrays["opt.step"])
    assert opt.settings == make_opt(m).settings
