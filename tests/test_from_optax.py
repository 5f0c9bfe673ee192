"""`optim.from_optax`: any optax transformation, run for twelve steps through `optim.update` with a
checkpoint save/load in the middle, equals the same transformation applied by hand to a dict of
the same params. Also masks from `decay=False` declarations and globs, accumulation and EMA."""

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
    b: Float[Array, " H"] = sm.param(sm.normal(std=0.1), decay=False)
    w2: Float[Array, "H O"] = sm.param(sm.normal(std=0.5))
    running: Float[Array, " H"] = sm.buffer(sm.ones)


NAMES = ("w1", "b", "w2")
STEPS, SAVE_AT = 12, 6


def loss(m, x, y):
    h = jnp.tanh(x @ m.w1 + m.b[None]) * m.running[None]
    return jnp.mean((h @ m.w2 - y) ** 2)


def dict_loss(p, running, x, y):
    h = jnp.tanh(x @ p["w1"] + p["b"][None]) * running[None]
    return jnp.mean((h @ p["w2"] - y) ** 2)


def data(i):
    k1, k2 = jax.random.split(jax.random.key(200 + i))
    return jax.random.normal(k1, (16, 4)), jax.random.normal(k2, (16, 3))


def poison(i, bad_steps):
    return jnp.float32(jnp.nan) if i in bad_steps else jnp.float32(1.0)


@jax.jit
def step(m, opt, x, y, factor=1.0):
    g = sm.grad(loss, m, x, y)
    g = type(g)(jax.tree.map(lambda a: a * factor, g.tree))
    return optim.update(m, opt, g)


def run_shapeml(m, opt, tmp_path=None, bad_steps=()):
    for i in range(STEPS):
        if i == SAVE_AT and tmp_path is not None:  # stop, save, load into the template, go on
            path = sm.save_checkpoint(tmp_path / "mid.safetensors", m, opt)
            loaded_m, loaded = sm.load_checkpoint(path, Net, like=opt)
            for a, b in zip(jax.tree.leaves((m, opt)), jax.tree.leaves((loaded_m, loaded))):
                np.testing.assert_array_equal(a, b)
            assert jax.tree.structure(loaded) == jax.tree.structure(opt)
            m, opt = loaded_m, loaded
        m, opt = step(m, opt, *data(i), poison(i, bad_steps))
    return m, opt


def run_by_hand(tx, m, bad_steps=()):
    p = {k: jnp.array(getattr(m, k)) for k in NAMES}
    state = tx.init(p)

    @jax.jit
    def step(p, state, x, y, factor):
        g = jax.grad(dict_loss)(p, m.running, x, y)
        g = jax.tree.map(lambda a: a * factor, g)
        updates, state = tx.update(g, state, p)
        return optax.apply_updates(p, updates), state

    for i in range(STEPS):
        p, state = step(p, state, *data(i), poison(i, bad_steps))
    return p


HAND_MASK = {"w1": True, "b": False, "w2": True}
SCHEDULE = optax.warmup_cosine_decay_schedule(0.0, 1e-2, 3, STEPS)

# name -> (tx for shapeml, tx applied by hand, from_optax options, steps whose gradient is NaN)
CASES = {
    "lion": (optax.lion(1e-3, weight_decay=0.1), None, {}, ()),
    "adafactor": (optax.adafactor(1e-2, min_dim_size_to_factor=2), None, {}, ()),
    "sgd_nesterov": (optax.sgd(0.05, momentum=0.9, nesterov=True), None, {}, ()),
    "rmsprop": (optax.rmsprop(1e-2, centered=True, momentum=0.5), None, {}, ()),
    "clipped_adam_schedule": (
        optax.chain(optax.clip_by_global_norm(0.5), optax.adam(SCHEDULE)),
        None,
        {},
        (),
    ),
    "adamw_glob_mask": (
        optax.adamw(1e-2, weight_decay=0.3, mask=optim.mask("w*")),
        optax.adamw(1e-2, weight_decay=0.3, mask=HAND_MASK),
        {},
        (),
    ),
    "adamw_declared_mask": (
        optax.adamw(1e-2, weight_decay=0.3, mask=optim.decay_mask()),
        optax.adamw(1e-2, weight_decay=0.3, mask=HAND_MASK),
        {},
        (),
    ),
    "multisteps_adamw_3": (optax.MultiSteps(optax.adamw(1e-2), 3), None, {}, ()),
    "apply_if_finite_adam": (
        optax.apply_if_finite(optax.adam(1e-2), 2),
        None,
        {"skip_nonfinite": False},
        (2, 8),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_twelve_steps_with_a_save_and_load_equal_optax_by_hand(name, tmp_path):
    tx, hand, options, bad = CASES[name]
    if hand is None:
        hand = tx.gradient_transformation() if isinstance(tx, optax.MultiSteps) else tx
    m = Net.init(seed=1)
    opt = optim.from_optax(m, tx, **options)
    assert isinstance(opt, optim.Optimizer[Net]) and opt.kind == "optax"
    trained, opt = run_shapeml(m, opt, tmp_path, bad)
    ref = run_by_hand(hand, m, bad)
    for k in NAMES:
        np.testing.assert_allclose(getattr(trained, k), ref[k], rtol=2e-6, atol=1e-7, err_msg=k)
    np.testing.assert_array_equal(trained.running, m.running)  # buffers never reach optax
    assert int(opt.step) == STEPS  # every gradient taken (skip_nonfinite off or none bad)
    assert not np.allclose(trained.w1, m.w1)


def test_default_skips_and_counts_a_nonfinite_gradient_for_any_optax_tx(tmp_path):
    m = Net.init(seed=1)
    opt = optim.from_optax(m, optax.lion(1e-3))
    trained, opt = run_shapeml(m, opt, tmp_path, bad_steps=(1, 7))
    assert int(opt.skipped) == 2 and int(opt.step) == STEPS - 2
    assert all(bool(jnp.isfinite(x).all()) for x in jax.tree.leaves(trained))


def test_from_optax_refuses_what_is_not_a_transformation():
    m = Net.init()
    with pytest.raises(sm.ShapemlError, match="E0003"):
        optim.from_optax(m, optax.adam)  # the factory, not a transformation
    with pytest.raises(sm.ShapemlError, match="E0003"):
        optim.from_optax({"w": 1}, optax.adam(1e-3))
    with pytest.raises(sm.ShapemlError, match="E0002"):
        optim.from_optax(m, optax.adam(1e-3), accumulate=0)
    with pytest.raises(sm.ShapemlError, match="E0002"):
        optim.from_optax(m, optax.adam(1e-3), ema=1.0)


def test_a_glob_that_matches_no_param_is_refused_with_the_nearest_name():
    m = Net.init()
    with pytest.raises(ValueError, match="E1206") as e:
        optim.adamw(m, lr=1e-3, mask=optim.mask("w3"))
    assert "w1" in str(e.value)
    with pytest.raises(sm.ShapemlError, match="E0003"):
        optim.mask()
    chosen = (optim.decay_mask() & ~optim.mask("w2"))(sm.grad(loss, m, *data(0)).tree)
    assert (chosen.w1, chosen.b, chosen.w2) == (True, False, False)


def test_weight_decay_skips_params_declared_decay_false():
    m = Net.init(seed=2)
    zero = sm.Grad[Net](jax.tree.map(jnp.zeros_like, sm.grad(loss, m, *data(0)).tree))
    for opt in (optim.adamw(m, lr=0.1, weight_decay=0.5), optim.sgd(m, lr=0.1, weight_decay=0.5)):
        m2, _ = optim.update(m, opt, zero)
        np.testing.assert_array_equal(m2.b, m.b)  # declared decay=False
        np.testing.assert_allclose(m2.w1, m.w1 * (1 - 0.1 * 0.5), rtol=1e-6)
    m3, _ = optim.update(m, optim.adamw(m, lr=0.1, weight_decay=0.5, mask=optim.mask("*")), zero)
    np.testing.assert_allclose(m3.b, m.b * (1 - 0.1 * 0.5), rtol=1e-6)  # an explicit mask rules


def test_accumulate_equals_optax_multisteps_and_updates_every_n():
    m = Net.init(seed=3)
    opt = optim.adamw(m, lr=1e-2, accumulate=3)
    ref_tx = optax.MultiSteps(optax.adamw(1e-2, weight_decay=0.01, mask=HAND_MASK), 3)
    ref = run_by_hand(ref_tx.gradient_transformation(), m)
    seen = []
    for i in range(STEPS):
        m_before = m
        m, opt = step(m, opt, *data(i))
        seen.append(not np.array_equal(m.w1, m_before.w1))
    assert seen == [False, False, True] * 4 and int(opt.step) == STEPS
    for k in NAMES:
        np.testing.assert_allclose(getattr(m, k), ref[k], rtol=2e-6, atol=1e-7)


def test_ema_is_a_model_of_the_same_class_averaging_the_weights():
    m0 = Net.init(seed=4)
    m, opt = m0, optim.sgd(m0, lr=0.1, ema=0.5, accumulate=2)
    expected = {k: np.asarray(getattr(m0, k)) for k in NAMES}
    for i in range(8):
        m, opt = step(m, opt, *data(i))
        if i % 2 == 1:  # an update happened: the average moves (numpy reference)
            expected = {k: 0.5 * v + 0.5 * np.asarray(getattr(m, k)) for k, v in expected.items()}
    avg = optim.averaged(m, opt)
    assert type(avg) is Net
    for k in NAMES:
        np.testing.assert_allclose(getattr(avg, k), expected[k], rtol=1e-6)
    np.testing.assert_array_equal(avg.running, m.running)
    with pytest.raises(ValueError, match="E1207"):
        optim.averaged(m, optim.sgd(m, lr=0.1))


def test_conveniences_are_one_optax_call_each():
    m = Net.init(seed=5)
    cases = [
        (optim.adam(m, lr=1e-2), optax.adam(1e-2)),
        (optim.lion(m, lr=1e-3), optax.lion(1e-3, weight_decay=1e-3, mask=HAND_MASK)),
        (optim.adafactor(m, lr=1e-2), optax.adafactor(1e-2)),
        (optim.rmsprop(m, lr=1e-2, momentum=0.5), optax.rmsprop(1e-2, momentum=0.5)),
        (optim.sgd(m, lr=0.05, momentum=0.9, nesterov=True), optax.sgd(0.05, 0.9, nesterov=True)),
    ]
    for opt, tx in cases:
        trained, _ = run_shapeml(m, opt)
        ref = run_by_hand(tx, m)
        for k in NAMES:
            np.testing.assert_allclose(getattr(trained, k), ref[k], rtol=2e-6, atol=1e-7)
