"""Optimizers against optax applied by hand, schedules against their formulas, clip_norm,
typing and mismatch errors, buffers untouched, non-finite skips, checkpoints and resume."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jaxtyping import Array, Float

import shapeml as sm
from shapeml import optim


class Net(sm.Model):
    dims = sm.Dims(I=4, H=8, O=3)
    w1: Float[Array, "I H"] = sm.param(sm.normal(std=0.5))
    w2: Float[Array, "H O"] = sm.param(sm.normal(std=0.5))
    running: Float[Array, " H"] = sm.buffer(sm.ones)


class Other(sm.Model):
    dims = sm.Dims(I=4, H=8, O=3)
    w1: Float[Array, "I H"] = sm.param(sm.normal(std=0.5))
    w2: Float[Array, "H O"] = sm.param(sm.normal(std=0.5))


def loss(m, x, y):
    h = jnp.tanh(x @ m.w1) * m.running[None]
    return jnp.mean((h @ m.w2 - y) ** 2)


def dict_loss(p, running, x, y):
    h = jnp.tanh(x @ p["w1"]) * running[None]
    return jnp.mean((h @ p["w2"] - y) ** 2)


def data(i):
    k1, k2 = jax.random.split(jax.random.key(100 + i))
    return jax.random.normal(k1, (16, 4)), jax.random.normal(k2, (16, 3))


@jax.jit
def _step(m, opt, x, y):
    return optim.update(m, opt, sm.grad(loss, m, x, y))


def run_shapeml(m, opt, steps):
    step = _step
    for i in range(steps):
        m, opt = step(m, opt, *data(i))
    return m, opt


def run_optax(tx, m, steps):
    p = {"w1": m.w1, "w2": m.w2}
    state = tx.init(p)

    @jax.jit
    def step(p, state, x, y):
        g = jax.grad(dict_loss)(p, m.running, x, y)
        updates, state = tx.update(g, state, p)
        return optax.apply_updates(p, updates), state

    for i in range(steps):
        p, state = step(p, state, *data(i))
    return p


SCHEDULE = optim.warmup(5, optim.cosine(0.05, 15))
OPTAX_SCHEDULE = optax.join_schedules(
    [optax.linear_schedule(0.0, 0.05, 5), optax.cosine_decay_schedule(0.05, 15)], [5]
)


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (
            lambda m: optim.adamw(m, lr=SCHEDULE, weight_decay=0.1),
            optax.adamw(OPTAX_SCHEDULE, weight_decay=0.1),
        ),
        (
            lambda m: optim.adamw(m, lr=3e-2, b1=0.8, b2=0.99, eps=1e-6),
            optax.adamw(3e-2, b1=0.8, b2=0.99, eps=1e-6, weight_decay=0.01),
        ),
        (lambda m: optim.sgd(m, lr=0.1), optax.sgd(0.1)),
        (
            lambda m: optim.sgd(m, lr=SCHEDULE, momentum=0.9, nesterov=True),
            optax.sgd(OPTAX_SCHEDULE, momentum=0.9, nesterov=True),
        ),
        (
            lambda m: optim.sgd(m, lr=0.1, momentum=0.5, weight_decay=0.01),
            optax.chain(optax.add_decayed_weights(0.01), optax.sgd(0.1, momentum=0.5)),
        ),
        (
            lambda m: optim.adamw(m, lr=0.01, transforms=[optim.clip_norm(0.1)]),
            optax.chain(optax.clip_by_global_norm(0.1), optax.adamw(0.01, weight_decay=0.01)),
        ),
    ],
)
def test_matches_optax_applied_by_hand_for_20_steps(ours, theirs):
    m = Net.init(seed=0)
    trained, opt = run_shapeml(m, ours(m), 20)
    ref = run_optax(theirs, m, 20)
    np.testing.assert_allclose(trained.w1, ref["w1"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(trained.w2, ref["w2"], rtol=1e-6, atol=1e-7)
    assert int(opt.step) == 20


def test_schedules_match_their_formulas_at_every_step():
    t = np.arange(0, 140)
    cos = optim.cosine(3e-3, 100)
    expected_cos = 3e-3 * 0.5 * (1 + np.cos(np.pi * np.minimum(t, 100) / 100))
    np.testing.assert_allclose(cos(jnp.asarray(t)), expected_cos, rtol=1e-5, atol=1e-9)
    w = optim.warmup(20, cos)
    expected = np.where(
        t < 20, cos(0) * t / 20, 3e-3 * 0.5 * (1 + np.cos(np.pi * np.minimum(t - 20, 100) / 100))
    )
    np.testing.assert_allclose(w(jnp.asarray(t)), expected, rtol=1e-5, atol=1e-9)
    assert [float(w(i)) for i in (0, 10)] == [0.0, pytest.approx(1.5e-3)]
    np.testing.assert_allclose(optim.constant(0.3)(jnp.arange(4)), [0.3] * 4, rtol=1e-7)
    assert repr(w) == "warmup(20, cosine(0.003, 100))"
    assert optim.warmup(3, 0.1)(jnp.arange(5)).tolist() == pytest.approx(
        [0, 0.1 / 3, 0.2 / 3, 0.1, 0.1]
    )


def test_clip_norm_matches_optax():
    m = Net.init(seed=0)
    g = sm.grad(loss, m, *data(0)) * 100.0
    clipped = optim.clip_norm(1.0)(g)
    ref, _ = optax.clip_by_global_norm(1.0).update({"w1": g.w1, "w2": g.w2}, optax.EmptyState())
    np.testing.assert_allclose(clipped.w1, ref["w1"], rtol=1e-6)
    assert float(sm.norm(clipped)) == pytest.approx(1.0, rel=1e-5)
    small = g * (0.5 / float(sm.norm(g)))
    np.testing.assert_allclose(optim.clip_norm(1.0)(small).w2, small.w2)  # below: unchanged
    halve = lambda g: g * 0.5  # a user's own transform
    np.testing.assert_allclose(halve(g).w1, g.w1 * 0.5)


def test_buffers_never_change_even_with_weight_decay():
    m = Net.init(seed=0).replace(running=jnp.full(8, 2.0))
    trained, _ = run_shapeml(m, optim.adamw(m, lr=0.1, weight_decay=0.5), 5)
    np.testing.assert_array_equal(trained.running, m.running)
    # The usual equinox recipe (optimize every inexact array) decays the buffer too:
    leaky_opt = optax.adamw(0.1, weight_decay=0.5)
    params = eqx.filter(m, eqx.is_inexact_array)
    state = leaky_opt.init(params)
    zero_grads = jax.tree.map(jnp.zeros_like, params)
    updates, _ = leaky_opt.update(zero_grads, state, params)
    assert not np.allclose(eqx.apply_updates(m, updates).running, m.running)


def test_optimizers_are_typed_by_their_model():
    m = Net.init()
    opt = optim.adamw(m, lr=1e-3)
    assert isinstance(opt, optim.AdamW[Net]) and isinstance(opt, optim.AdamW)
    assert not isinstance(opt, optim.AdamW[Other]) and not isinstance(opt, optim.SGD)
    assert type(optim.sgd(m, lr=0.1)).__name__ == "SGD[Net]"
    moments = [x for x in jax.tree.leaves(opt.state) if x.ndim > 0]
    assert sum(x.size for x in moments) == 2 * sm.count_params(m)  # mu and nu, params only
    assert int(opt.step) == 0 and type(optim.from_optax(m, optax.sgd(0.1))).__name__ == (
        "Optimizer[Net]"
    )


def test_mismatch_errors():
    m = Net.init()
    other = Other.init()
    g = sm.grad(loss, m, *data(0))
    with pytest.raises(TypeError, match="E1201") as e:
        optim.update(other, optim.adamw(m, lr=0.1), g)
    assert "`AdamW[Net]` updates a `Net`, but was given a `Other`" in str(e.value)
    with pytest.raises(TypeError, match="E1202"):
        optim.update(m, optax.adamw(0.1), g)
    other_g = sm.grad(lambda m, x, y: jnp.sum(x @ m.w1 @ m.w2), other, *data(0))
    with pytest.raises(sm.ShapemlError, match="E1203") as e:
        optim.update(m, optim.adamw(m, lr=0.1), other_g)
    assert "needs a Grad[Net], got Grad[Other]" in str(e.value)
    with pytest.raises(sm.ShapemlError, match="E1203"):
        optim.update(m, optim.adamw(m, lr=0.1), {"w1": g.w1, "w2": g.w2})
    wide = Net.init(H=9)
    with pytest.raises(ValueError, match="E1204") as e:
        optim.update(wide, optim.adamw(m, lr=0.1), sm.grad(loss, wide, *data(0)))
    assert "`w1`: optimizer [4 8] float32, model [4 9] float32" in str(e.value)
    with pytest.raises(ValueError, match="E1203") as e:
        optim.update(m, optim.adamw(m, lr=0.1), sm.grad(loss, wide, *data(0)))
    assert "`w2`: optimizer [8 3] float32, gradient [9 3] float32" in str(e.value)


def test_nonfinite_gradient_is_skipped_and_counted_by_default():
    m = Net.init()
    opt = optim.adamw(m, lr=0.1)
    g = sm.grad(loss, m, *data(0))
    bad = g.__class__(jax.tree.map(lambda x: x.at[0].set(jnp.nan), g.tree))
    m2, opt2 = jax.jit(optim.update)(m, opt, bad)
    np.testing.assert_array_equal(m2.w1, m.w1)
    assert int(opt2.skipped) == 1 and int(opt2.step) == 0
    m3, opt3 = optim.update(m2, opt2, g)
    assert int(opt3.step) == 1 and not np.array_equal(m3.w1, m.w1)
    unguarded = optim.adamw(m, lr=0.1, skip_nonfinite=False)
    m4, _ = optim.update(m, unguarded, bad)  # only when asked for: NaN propagates
    assert math.isnan(float(m4.w1[0, 0]))


def test_resume_from_checkpoint_is_bit_identical(tmp_path):
    m = Net.init(seed=3)
    make = lambda m: optim.adamw(m, lr=SCHEDULE, transforms=[optim.clip_norm(1.0)])
    straight, straight_opt = run_shapeml(m, make(m), 100)

    half, half_opt = run_shapeml(m, make(m), 50)
    path = sm.save_checkpoint(tmp_path / "ckpt.safetensors", half, half_opt)
    loaded, loaded_opt = sm.load_checkpoint(path, Net)
    assert type(loaded_opt) is type(half_opt) and int(loaded_opt.step) == 50
    assert loaded_opt.lr == half_opt.lr and loaded_opt.transforms == half_opt.transforms

    @jax.jit
    def step(m, opt, x, y):
        return optim.update(m, opt, sm.grad(loss, m, x, y))

    for i in range(50, 100):
        loaded, loaded_opt = step(loaded, loaded_opt, *data(i))
    np.testing.assert_array_equal(loaded.w1, straight.w1)
    np.testing.assert_array_equal(loaded.w2, straight.w2)
    for a, b in zip(jax.tree.leaves(loaded_opt), jax.tree.leaves(straight_opt)):
        np.testing.assert_array_equal(a, b)


def test_checkpoint_errors(tmp_path):
    m = Net.init()
    path = sm.save_checkpoint(tmp_path / "c.safetensors", m, optim.adamw(m, lr=0.1))
    with pytest.raises(TypeError, match="E1202") as e:
        sm.load_checkpoint(path, Net, like=optim.sgd(m, lr=0.1))
    assert "saved with adamw" in str(e.value)
    custom = optim.adamw(m, lr=0.1, transforms=[lambda g: g * 0.5])
    path2 = sm.save_checkpoint(tmp_path / "custom.safetensors", m, custom)
    with pytest.raises(sm.ShapemlError, match="E1301") as e:
        sm.load_checkpoint(path2, Net)
    assert "like=opt" in str(e.value)
    _, restored = sm.load_checkpoint(path2, Net, like=custom)
    assert restored.transforms == custom.transforms
    plain = sm.save(tmp_path / "model.safetensors", m)
    with pytest.raises(sm.ShapemlError, match="E1301"):
        sm.load_checkpoint(plain, Net)


def test_grads_and_optimizers_pickle():
    import pickle

    m = Net.init()
    g = sm.grad(loss, m, *data(0))
    opt = optim.adamw(m, lr=SCHEDULE, transforms=[optim.clip_norm(1.0)])
    g2, opt2 = pickle.loads(pickle.dumps((g, opt)))
    assert type(g2) is type(g) and type(opt2) is type(opt) and opt2.lr == opt.lr
    np.testing.assert_array_equal(g2.w1, g.w1)
    m2, _ = optim.update(m, opt2, g2)
    np.testing.assert_array_equal(m2.w1, optim.update(m, opt, g)[0].w1)


@pytest.mark.parametrize(
    "build",
    [
        lambda m: optim.adamw(m, lr=-1e-3),
        lambda m: optim.adamw(m, lr=float("nan")),
        lambda m: optim.sgd(m, lr=float("inf")),
        lambda m: optim.adamw(m, lr=1e-3, b1=1.5),
        lambda m: optim.adamw(m, lr=1e-3, b2=-0.1),
        lambda m: optim.adamw(m, lr=1e-3, eps=-1),
        lambda m: optim.adamw(m, lr=1e-3, weight_decay=-0.01),
        lambda m: optim.sgd(m, lr=0.1, momentum=-0.9),
        lambda m: optim.lion(m, lr=1e-4, b2=1.0),
        lambda m: optim.rmsprop(m, lr=1e-3, decay=2.0),
        lambda m: optim.adafactor(m, lr=1e-3, clipping_threshold=0.0),
        lambda m: optim.adamw(m, lr=optim.cosine(1e-3, 10.7)),
        lambda m: optim.adamw(m, lr=optim.warmup(2.5, 1e-3)),
        lambda m: optim.adamw(m, lr=optim.warmup(0, 1e-3)),
        lambda m: optim.adamw(m, lr=optim.constant(-1)),
        lambda m: optim.adamw(m, lr=1e-3, transforms=[optim.clip_norm(0)]),
        lambda m: optim.adamw(m, lr=1e-3, ema=1.5),
        lambda m: optim.adamw(m, lr=1e-3, accumulate=0),
        lambda m: optim.adamw(m, lr=1e-3, accumulate=2.0),
        lambda m: optim.sgd(m, lr=0.1, nesterov=1),
        lambda m: optim.adamw(m, lr="3e-3"),
        lambda m: optim.adamw(m, lr=1e-3, skip_nonfinite="yes"),
        lambda m: optim.adamw(m, lr=1e-3, transforms=[3]),
        lambda m: optim.adamw(m, lr=1e-3, mask=[True, False]),
    ],
)
def test_every_hyperparameter_is_checked_before_anything_is_built(build):
    with pytest.raises(sm.ShapemlError) as e:
        build(Net.init())
    assert e.value.code in ("E0002", "E0003")
    assert "`" in str(e.value)  # names the argument


@pytest.mark.parametrize(
    "make", [optim.sgd, optim.adam, optim.lion, optim.adafactor, optim.rmsprop]
)
def test_every_convenience_restores_from_its_checkpoint_without_a_template(make, tmp_path):
    m = Net.init(seed=1)
    opt = make(m, lr=optim.warmup(2, optim.cosine(1e-2, 10)), ema=0.9, accumulate=2)
    m, opt = run_shapeml(m, opt, 5)
    path = sm.save_checkpoint(tmp_path / "c.safetensors", m, opt)
    m2, opt2 = sm.load_checkpoint(path, Net)
    assert type(opt2) is type(opt) and opt2.kind == opt.kind and opt2.settings == opt.settings
    assert jax.tree.structure(opt2) == jax.tree.structure(opt)
    for a, b in zip(jax.tree.leaves((m, opt)), jax.tree.leaves((m2, opt2))):
        np.testing.assert_array_equal(a, b)


def test_nonfinite_state_is_refused_unless_asked_for(tmp_path):
    m = Net.init()
    opt = optim.sgd(m, lr=0.1)
    broken = m.replace(w1=m.w1.at[0, 0].set(jnp.inf))
    path = tmp_path / "c.safetensors"
    with pytest.raises(ValueError, match="E1307") as e:
        sm.save_checkpoint(path, broken, opt)
    assert "model.w1" in str(e.value) and not path.exists()
    sm.save_checkpoint(path, broken, opt, allow_nonfinite=True)
    with pytest.warns(sm.ShapemlWarning, match="W1301"):
        sm.load_checkpoint(path, Net)
    loaded, _ = sm.load_checkpoint(path, Net, allow_nonfinite=True)
    assert math.isinf(float(loaded.w1[0, 0]))


def test_a_state_that_does_not_fit_the_template_is_one_report_of_every_difference(tmp_path):
    m = Net.init()
    path = sm.save_checkpoint(tmp_path / "c.safetensors", m, optim.adamw(m, lr=0.1))
    with pytest.raises(sm.ShapemlError, match="E1301") as e:
        sm.load_checkpoint(path, Net, like=optim.adamw(m, lr=0.1, accumulate=2, ema=0.9))
    text = str(e.value)
    assert "accumulate=2" in text and "accumulate=1" in text
    assert text.count("missing:") >= 3  # acc_grads, mini_step, the average: all listed at once


def test_a_template_with_other_options_of_the_same_structure_is_refused(tmp_path):
    m = Net.init()
    path = sm.save_checkpoint(
        tmp_path / "c.safetensors", m, optim.adamw(m, lr=0.1, accumulate=2, ema=0.9)
    )
    with pytest.raises(sm.ShapemlError, match=r"E1207[\s\S]*accumulate=2[\s\S]*accumulate=4"):
        sm.load_checkpoint(path, Net, like=optim.adamw(m, lr=0.1, accumulate=4, ema=0.5))
    sm.load_checkpoint(path, Net, like=optim.adamw(m, lr=0.1, accumulate=2, ema=0.9))


def test_resuming_into_a_template_of_other_dims_names_the_dims_first(tmp_path):
    wide = Net.init(seed=0, H=16)
    path = sm.save_checkpoint(tmp_path / "h16.safetensors", wide, optim.adamw(wide, lr=0.1))
    with pytest.raises(ValueError, match="E1303") as e:
        sm.load_checkpoint(path, Net, like=optim.adamw(Net.init(seed=0), lr=0.1))
    first = str(e.value).splitlines()[0]
    assert first.endswith("given as like= (H: file 16, model 8): 4 entries of its state differ:")
    assert "Net.init(seed=0, H=16)" in str(e.value) and len(str(e.value).splitlines()) <= 8
    m, opt = sm.load_checkpoint(path, Net, like=optim.adamw(Net.init(seed=1, H=16), lr=0.1))
    assert m.dims.H == 16 and opt.shapes == optim.adamw(m, lr=0.1).shapes
    # shapes that no dims explain (another optimizer's state) keep the entry-by-entry report
    with pytest.raises(ValueError, match="E1301"):
        sm.load_checkpoint(path, Net, like=optim.adamw(wide, lr=0.1, accumulate=2))
