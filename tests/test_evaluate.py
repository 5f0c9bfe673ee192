"""Evaluation on the step's devices: `TrainStep.evaluate` and `training.evaluate` split the batch
as the step does (checked on the input's sharding inside the program) and give the loss one device
gives, compile once per function and shape, and `train`'s `eval_fn` can use them."""

from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _forced_devices import result_of

import shapeml as sm
from shapeml import nn, optim, training
from shapeml.training import TrainStep

SPLIT = textwrap.dedent(
    """
    import json
    import jax, jax.numpy as jnp, numpy as np
    import shapeml as sm
    from shapeml import nn, optim, sharding, training
    from shapeml.training import TrainStep

    def loss(m, x, y):
        return jnp.mean((m(x) - y) ** 2)

    seen = []

    def spy(m, x, y):  # the loss, reporting how its input is split
        jax.debug.inspect_array_sharding(x, callback=lambda s: seen.append(
            (len(s.device_set), str(s.spec))))
        return loss(m, x, y)

    m = nn.MLP.init(seed=0, D=4, F=8)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 4)).astype(np.float32)
    y = np.sin(x)
    out = {"devices": jax.device_count()}
    step = TrainStep(loss, m, optim.adam(m, lr=1e-2))
    step(x, y)
    host = jax.device_get(step.model)
    out["one"] = float(jax.jit(loss)(host, x, y))  # the same model on one device
    out["step"] = float(step.evaluate(x, y))
    out["step_spy"] = float(step.evaluate(x, y, fn=spy))
    out["free"] = float(training.evaluate(spy, step.model, x, y))
    out["model_on"] = len(step.model.up.w.sharding.device_set)
    n = training._evaluate._run._cache_size()
    for _ in range(3):
        step.evaluate(x, y)
    out["recompiled"] = training._evaluate._run._cache_size() - n
    out["odd"] = float(step.evaluate(x[:15], y[:15]))  # rows the devices do not divide
    out["odd_one"] = float(jax.jit(loss)(host, x[:15], y[:15]))
    # on a mesh, placed by a rule table (FSDP over `data`), Explicit axes (make_mesh's default)
    mesh = sharding.make_mesh("data=2")
    fsdp = TrainStep(loss, m, optim.adam(m, lr=1e-2), mesh=mesh, rules={"F": "data"})
    fsdp(x, y)
    out["mesh"] = float(fsdp.evaluate(x, y, fn=spy))
    out["mesh_one"] = float(jax.jit(loss)(jax.device_get(fsdp.model), x, y))
    out["mesh_free"] = float(training.evaluate(loss, fsdp.model, x, y))
    out["seen"] = seen
    print("RESULT" + json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def split():
    return result_of(SPLIT, devices=2)


def test_the_batch_is_split_over_the_steps_devices_never_replicated(split):
    assert split["devices"] == 2 and split["model_on"] == 2
    # every traced evaluation saw its batch split by rows over both devices
    assert len(split["seen"]) >= 2  # the step's devices, and the FSDP mesh
    for devices, spec in split["seen"]:
        assert devices == 2 and spec.replace("PartitionSpec", "P") == "P('data',)"


def test_the_split_evaluation_is_the_one_device_loss(split):
    for got, want in (("step", "one"), ("step_spy", "one"), ("free", "one"), ("odd", "odd_one")):
        np.testing.assert_allclose(split[got], split[want], rtol=1e-6)
    np.testing.assert_allclose(split["mesh"], split["mesh_one"], rtol=1e-6)
    np.testing.assert_allclose(split["mesh_free"], split["mesh_one"], rtol=1e-6)


def test_evaluating_again_compiles_nothing(split):
    assert split["recompiled"] == 0


def _loss(m, x, y):
    return jnp.mean((m(x) - y) ** 2)


def test_on_one_device_it_is_the_jitted_loss_and_takes_any_fn():
    m = nn.Linear.init(seed=0, In=3, Out=2)
    step = TrainStep(_loss, m, optim.sgd(m, lr=0.1), devices=1)
    x, y = jnp.ones((4, 3)), jnp.zeros((4, 2))
    np.testing.assert_allclose(step.evaluate(x, y), _loss(step.model, x, y), rtol=1e-6)
    rows = step.evaluate(x, y, fn=lambda m, x, y: jnp.sum((m(x) - y) ** 2, axis=-1))
    assert rows.shape == (4,)
    np.testing.assert_allclose(training.evaluate(_loss, step.model, x, y), step.evaluate(x, y))
    with pytest.raises(sm.ShapemlError, match="E0003"):
        training.evaluate(_loss, {"w": 1}, x, y)


def test_a_loss_that_returns_the_model_evaluates_to_its_value_and_metrics():
    m = nn.Linear.init(seed=0, In=3, Out=2)

    def loss(m, x, y):
        value = _loss(m, x, y)
        return value, (m, {"err": value * 2})

    step = TrainStep(loss, m, optim.sgd(m, lr=0.1), has_aux=True, devices=1)
    x, y = jnp.ones((4, 3)), jnp.zeros((4, 2))
    value, metrics = step.evaluate(x, y)
    np.testing.assert_allclose(value, _loss(m, x, y), rtol=1e-6)
    np.testing.assert_allclose(metrics["err"], 2 * value, rtol=1e-6)


def test_under_bfloat16_it_computes_as_the_step_does():
    m = nn.Linear.init(seed=0, In=3, Out=2)
    step = TrainStep(_loss, m, optim.sgd(m, lr=0.0), devices=1, precision="bfloat16")
    x, y = jnp.linspace(0, 1, 12).reshape(4, 3), jnp.zeros((4, 2))
    value = step.evaluate(x, y)
    assert value.dtype == jnp.float32
    np.testing.assert_allclose(value, step(x, y), rtol=1e-6)  # the step's own loss value
    half = sm.Precision("bfloat16")
    ref = jax.jit(lambda m, x, y: _loss(half.cast(m), half.cast(x), half.cast(y)))(m, x, y)
    assert ref.dtype == jnp.bfloat16
    np.testing.assert_allclose(value, ref.astype(jnp.float32), rtol=1e-6)
    assert abs(float(value) - float(_loss(m, x, y))) > 1e-5  # not the float32 loss


def test_train_eval_fn_evaluates_on_the_steps_model():
    m = nn.Linear.init(seed=0, In=3, Out=2)
    x, y = jnp.ones((4, 3)), jnp.zeros((4, 2))
    seen = []

    def eval_fn(model):
        seen.append(jax.tree.map(np.asarray, model))
        return {"val": float(training.evaluate(_loss, model, x, y))}

    out = training.train(
        _loss,
        m,
        optim.sgd(m, lr=0.1),
        [(x, y)] * 4,
        steps=4,
        eval_fn=eval_fn,
        eval_every=2,
        progress=False,
        devices=1,
    )
    vals = [h["val"] for h in out.history if "val" in h]
    assert len(vals) == 2
    np.testing.assert_allclose(vals[-1], _loss(out.model, x, y), rtol=1e-6)
