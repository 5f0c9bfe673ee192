"""`sm.Precision` and `TrainStep(precision=, remat=)`: float32 params under a bfloat16 or float16
loss, float16's loss scaling, and coded errors for names that are not policies."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shapeml as sm
from shapeml import nn, optim
from shapeml.training import TrainStep


def loss(m, x, y):
    return ((m(x) - y) ** 2).mean()


def _data(rows=16):
    x = np.random.default_rng(0).normal(size=(rows, 4)).astype(np.float32)
    return x, np.sin(x)


def test_cast_touches_float32_arrays_only():
    p = sm.Precision("bfloat16")
    tree = {"w": jnp.ones(3), "ids": jnp.arange(3), "h": jnp.ones(2, jnp.float16)}
    out = p.cast(tree)
    assert out["w"].dtype == jnp.bfloat16 and out["ids"].dtype == jnp.int32
    assert out["h"].dtype == jnp.float16
    assert sm.Precision("float32").cast(tree) is tree


@pytest.mark.parametrize("precision", ["bfloat16", sm.Precision("float16", loss_scale=None)])
def test_half_precision_losses_stay_close_and_params_stay_float32(precision):
    m = nn.MLP.init(seed=0, D=4, F=8)
    x, y = _data()
    ref = TrainStep(loss, m, optim.adam(m, lr=1e-2), devices=1)
    half = TrainStep(loss, m, optim.adam(m, lr=1e-2), devices=1, precision=precision)
    for _ in range(20):
        want, got = float(ref(x, y)), half(x, y)
        assert got.dtype == jnp.float32 and np.isfinite(float(got))
        assert float(got) == pytest.approx(want, rel=0.05)
    assert {a.dtype for a in jax.tree.leaves(half.model)} == {jnp.dtype("float32")}
    assert half.loss_scale is None


def test_float16_scales_the_loss_skips_overflowing_steps_and_halves_the_scale():
    m = nn.MLP.init(seed=0, D=4, F=8)
    x, y = _data()
    big = 3e4 * y  # the scaled gradient overflows float16 at the starting scale of 2**15
    step = TrainStep(loss, m, optim.sgd(m, lr=1e-9), devices=1, precision="float16")
    assert step.loss_scale == 2.0**15
    before = {k: np.asarray(v) for k, v in sm.params(step.model).items()}  # donated next
    step(x, big)
    assert step.loss_scale == 2.0**14
    for k, v in sm.params(step.model).items():
        np.testing.assert_array_equal(np.asarray(v), np.asarray(before[k]))
    for _ in range(30):
        step(x, big)
    assert step.loss_scale < 2.0**14 and all(
        np.isfinite(np.asarray(v)).all() for v in sm.params(step.model).values()
    )


def test_a_fixed_loss_scale_gives_the_unscaled_gradient():
    m = nn.MLP.init(seed=0, D=4, F=8)
    x, y = _data()
    ref = TrainStep(loss, m, optim.sgd(m, lr=0.1), devices=1, precision="float16")
    fixed = TrainStep(
        loss, m, optim.sgd(m, lr=0.1), devices=1, precision=sm.Precision("float16", loss_scale=8)
    )
    for _ in range(3):
        assert float(fixed(x, y)) == pytest.approx(float(ref(x, y)), rel=1e-3)
    assert fixed.loss_scale == 8.0


@pytest.mark.parametrize(
    ("make", "code"),
    [
        (lambda: sm.Precision("float8"), "E0002"),
        (lambda: sm.Precision("float16", loss_scale=-1.0), "E0002"),
        (lambda: sm.Precision("float16", period=0), "E0002"),
        (lambda: nn.remat(lambda x: x, "some"), "E0002"),
    ],
)
def test_bad_policies_are_coded_errors(make, code):
    with pytest.raises(sm.ShapemlError) as e:
        make()
    assert e.value.code == code


def test_train_step_rejects_bad_policies_and_a_remat_that_does_nothing():
    m = nn.MLP.init(seed=0, D=4, F=8)
    x, y = _data()
    for kw in (dict(precision=3), dict(precision="int8"), dict(remat="most")):
        with pytest.raises(sm.ShapemlError) as e:
            TrainStep(loss, m, optim.sgd(m, lr=0.1), devices=1, **kw)
        assert e.value.code.startswith("E")
    step = TrainStep(loss, m, optim.sgd(m, lr=0.1), devices=1, remat="full")
    with pytest.raises(sm.ArgumentError, match="had no effect") as e:
        step(x, y)
    assert e.value.code == "E0002"
