"""Grad[M]: arithmetic, norm, field access, typing; value_and_grad against references;
dead-param analysis (W1101 / E1101) including nested control flow."""

import warnings

import beartype
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from jaxtyping import Array, Float, Int

import shapeml as sm
from shapeml.data import shapes
from shapeml.zoo import spotter
from shapeml.zoo.mixer import mix_channels
from shapeml.zoo.mixer import norm as layer_norm


class Lin(sm.Model):
    dims = sm.Dims(I=3, O=2)
    w: Float[Array, "I O"] = sm.param(sm.normal())
    b: Float[Array, " O"] = sm.param(sm.normal())
    scale: Float[Array, " O"] = sm.buffer(sm.ones)


class Other(sm.Model):
    dims = sm.Dims(I=3, O=2)
    w: Float[Array, "I O"] = sm.param(sm.normal())
    b: Float[Array, " O"] = sm.param(sm.normal())


def lin_loss(m, x, y):
    return jnp.mean(((x @ m.w + m.b[None]) * m.scale[None] - y) ** 2)


@pytest.fixture
def batch():
    k1, k2 = jax.random.split(jax.random.key(1))
    return jax.random.normal(k1, (5, 3)), jax.random.normal(k2, (5, 2))


def test_value_and_grad_matches_jax_on_dicts(batch):
    x, y = batch
    m = Lin.init(seed=0)
    value, g = sm.value_and_grad(lin_loss, m, x, y)

    def dict_loss(p):
        return jnp.mean(((x @ p["w"] + p["b"][None]) * m.scale[None] - y) ** 2)

    ref_value, ref = jax.value_and_grad(dict_loss)({"w": m.w, "b": m.b})
    np.testing.assert_allclose(value, ref_value, rtol=1e-6)
    np.testing.assert_allclose(g.w, ref["w"], rtol=1e-6)
    np.testing.assert_allclose(g["b"], ref["b"], rtol=1e-6)
    assert list(g.named()) == ["w", "b"]  # params only: no buffer


def test_grad_against_finite_differences():
    m = spotter.Spotter.init(seed=0)
    img, y = (jnp.asarray(a) for a in shapes.draw(4, seed=0))

    def loss_of_head(w_h):
        return spotter.loss(m.replace(w_h=w_h), img, y)

    check_grads(loss_of_head, (m.w_h,), order=1, modes=["rev"], atol=2e-2, rtol=2e-2)
    g = sm.grad(spotter.loss, m, img, y)
    np.testing.assert_allclose(g.w_h, jax.grad(loss_of_head)(m.w_h), rtol=1e-5, atol=1e-7)


def test_arithmetic_and_norm_against_numpy(batch):
    m = Lin.init(seed=0)
    g = sm.grad(lin_loss, m, *batch)
    h = sm.grad(lin_loss, Lin.init(seed=1), *batch)
    gw, hw = np.asarray(g.w), np.asarray(h.w)
    np.testing.assert_allclose((g + h).w, gw + hw, rtol=1e-6)
    np.testing.assert_allclose((g - h).w, gw - hw, rtol=1e-6)
    np.testing.assert_allclose((g * h).w, gw * hw, rtol=1e-6)
    np.testing.assert_allclose((g * 0.5).w, gw * 0.5, rtol=1e-6)
    np.testing.assert_allclose((2.0 * g).w, gw * 2, rtol=1e-6)
    np.testing.assert_allclose((g / 4).b, np.asarray(g.b) / 4, rtol=1e-6)
    np.testing.assert_allclose((-g).b, -np.asarray(g.b), rtol=1e-6)
    np.testing.assert_allclose((1.0 - g).b, 1.0 - np.asarray(g.b), rtol=1e-6)
    np.testing.assert_allclose(sum([g, h]).w, gw + hw, rtol=1e-6)
    flat = np.concatenate([gw.ravel(), np.asarray(g.b).ravel()])
    np.testing.assert_allclose(sm.norm(g), np.linalg.norm(flat), rtol=1e-6)


def test_grads_of_different_models_do_not_mix(batch):
    g = sm.grad(lin_loss, Lin.init(seed=0), *batch)
    other = sm.grad(lambda m, x, y: jnp.mean((x @ m.w + m.b[None] - y) ** 2), Other.init(), *batch)
    with pytest.raises(TypeError, match="E1104") as e:
        g + other
    assert "Grad[Lin] + Grad[Other]" in str(e.value)
    wide = sm.grad(lin_loss, Lin.init(seed=0, I=4), jnp.ones((5, 4)), batch[1])
    with pytest.raises(sm.ShapemlError, match="E1104"):
        g - wide


def test_grad_types_and_field_access(batch):
    g = sm.grad(lin_loss, Lin.init(seed=0), *batch)
    assert isinstance(g, sm.Grad[Lin]) and not isinstance(g, sm.Grad[Other])
    assert sm.Grad[Lin] is sm.Grad[Lin]
    with pytest.raises(AttributeError, match="E1105"):
        _ = g.scale
    with pytest.raises(AttributeError, match="a field with a similar name exists: `w`"):
        _ = g.W

    @beartype.beartype
    def typed(g: sm.Grad[Lin]) -> sm.Grad[Lin]:
        return g * 0.5

    typed(g)
    other = sm.grad(lambda m, x, y: jnp.sum(x @ m.w) + jnp.sum(m.b), Other.init(), *batch)
    with pytest.raises(beartype.roar.BeartypeCallHintParamViolation):
        typed(other)


def test_has_aux(batch):
    def loss_aux(m, x, y):
        err = (x @ m.w + m.b[None]) * m.scale[None] - y
        return jnp.mean(err**2), {"max": jnp.max(jnp.abs(err))}

    (value, aux), g = sm.value_and_grad(loss_aux, Lin.init(), *batch, has_aux=True)
    g2, aux2 = sm.grad(loss_aux, Lin.init(), *batch, has_aux=True)
    np.testing.assert_allclose(value, lin_loss(Lin.init(), *batch), rtol=1e-6)
    np.testing.assert_allclose(g.w, g2.w)
    assert float(aux["max"]) == float(aux2["max"]) > 0


def test_works_under_jit_vmap_and_scan(batch):
    m = Lin.init(seed=0)
    x, y = batch
    g = sm.grad(lin_loss, m, x, y)
    gj = jax.jit(lambda m, x, y: sm.grad(lin_loss, m, x, y))(m, x, y)
    np.testing.assert_allclose(gj.w, g.w, rtol=1e-6)
    per_example = jax.vmap(lambda xi, yi: sm.grad(lin_loss, m, xi[None], yi[None]))(x, y)
    assert isinstance(per_example, sm.Grad[Lin]) and per_example.w.shape == (5, 3, 2)
    np.testing.assert_allclose(per_example.w.mean(0), g.w, rtol=1e-5, atol=1e-6)

    def body(total, xy):
        return total + sm.grad(lin_loss, m, xy[0][None], xy[1][None]), None

    zero = g * 0.0
    total, _ = jax.lax.scan(body, zero, (x, y))
    np.testing.assert_allclose((total / 5).b, g.b, rtol=1e-5, atol=1e-6)


def _forgot_token_mixing(m, img, y):
    x = img.astype(jnp.float32) * (2.0 / 255.0) - 1.0
    tokens = spotter.patchify(x, 4) @ m.w_e
    for layer in range(2):
        tokens = mix_channels(tokens, m.cw1[layer], m.cw2[layer])
    logits = jnp.mean(layer_norm(tokens), axis=1) @ m.w_h
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


def test_forgotten_token_mixing_warns_for_tw1_and_tw2():
    m = spotter.Spotter.init(seed=0)
    img, y = (jnp.asarray(a) for a in shapes.draw(8, seed=0))
    with pytest.warns(sm.DeadParamWarning) as record:
        sm.value_and_grad(_forgot_token_mixing, m, img, y)
    messages = sorted(str(w.message).splitlines()[0] for w in record)
    assert len(messages) == 2
    assert "never reads the param `tw1` of `Spotter`" in messages[0]
    assert "never reads the param `tw2` of `Spotter`" in messages[1]
    assert "[W1101]" in messages[0]


def test_no_false_warning_on_a_normal_loss():
    m = spotter.Spotter.init(seed=0)
    img, y = (jnp.asarray(a) for a in shapes.draw(8, seed=0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sm.value_and_grad(spotter.loss, m, img, y)
        jax.jit(lambda m: sm.value_and_grad(spotter.loss, m, img, y))(m)


def test_stop_gradient_only_reads_count_as_unread(batch):
    def loss(m, x, y):
        return jnp.mean((x @ m.w + jax.lax.stop_gradient(m.b)[None] - y) ** 2)

    with pytest.warns(sm.DeadParamWarning, match="`b`"):
        sm.value_and_grad(loss, Lin.init(), *batch)


def test_loss_that_reads_no_param_raises_e1101(batch):
    with pytest.raises(sm.ShapemlError, match="E1101") as e:
        sm.value_and_grad(lambda m, x, y: jnp.mean(x * m.scale[0]), Lin.init(), *batch)
    assert "reads none of `Lin`'s params (w, b)" in str(e.value)


@pytest.mark.parametrize("construct", ["scan", "cond", "pjit", "checkpoint", "custom_jvp"])
def test_nested_constructs_are_followed(construct, batch):
    x, y = batch

    @jax.custom_jvp
    def square(v):
        return v * v

    square.defjvp(lambda p, t: (square(p[0]), 2 * p[0] * t[0]))

    def loss(m, x, y):
        if construct == "scan":
            out, _ = jax.lax.scan(lambda c, xi: (c + jnp.sum(xi @ m.w), None), 0.0, x)
        elif construct == "cond":
            out = jax.lax.cond(x[0, 0] > 0, lambda: jnp.sum(x @ m.w), lambda: jnp.sum(x @ m.w) * 2)
        elif construct == "pjit":
            out = jax.jit(lambda w, b: jnp.sum(x @ w))(m.w, m.b)  # b enters the call, unused
        elif construct == "checkpoint":
            out = jax.checkpoint(lambda w: jnp.sum(x @ w))(m.w)
        else:
            out = jnp.sum(square(x @ m.w))
        return out + 0.0 * jnp.sum(y)

    # `b` is never read: analysed through each construct, it warns; `w` (read inside) never does.
    with pytest.warns(sm.DeadParamWarning) as record:
        sm.value_and_grad(loss, Lin.init(), x, y)
    assert [str(w.message).split("`")[3] for w in record] == ["b"]


def test_analysis_runs_once_per_trace(batch):
    traces = []

    def counted(m, x, y):
        traces.append(x.shape)
        return lin_loss(m, x, y)

    step = jax.jit(lambda m, x, y: sm.value_and_grad(counted, m, x, y))
    m = Lin.init()
    for _ in range(5):
        step(m, *batch)
    assert len(traces) == 1  # the analysis reads the one trace differentiation makes
    for _ in range(3):  # each eager call runs the loss once: no second trace for the analysis
        sm.value_and_grad(counted, m, *batch)
    assert len(traces) == 4


def test_grad_refuses_a_tree_with_buffers_or_of_another_model(batch):
    m = Lin.init()
    with pytest.raises(TypeError, match="buffers"):
        sm.Grad[Lin](m)
    with pytest.raises(TypeError, match="shaped like a Lin"):
        sm.Grad[Lin](Other.init())


def test_non_scalar_loss_raises_e1106(batch):
    with pytest.raises(TypeError, match="E1106") as e:
        sm.value_and_grad(lambda m, x, y: x @ m.w, Lin.init(), *batch)
    assert "shape (5, 2)" in str(e.value)


def test_the_analysis_does_not_keep_lambdas_alive(batch):
    import gc
    import weakref

    class Box:
        pass

    box = Box()
    loss = lambda m, x, y, box=box: lin_loss(m, x, y)  # noqa: E731 - captures `box`
    sm.value_and_grad(loss, Lin.init(), *batch)
    ref = weakref.ref(box)
    del loss, box
    gc.collect()
    assert ref() is None


class Counted(sm.Model):
    """A float buffer (which `eqx.is_inexact_array` takes for trained) and an int buffer."""

    dims = sm.Dims(I=3, O=2)
    w: Float[Array, "I O"] = sm.param(sm.normal())
    b: Float[Array, " O"] = sm.param(sm.normal(), decay=False)
    scale: Float[Array, " O"] = sm.buffer(sm.ones)
    seen: Int[Array, " O"] = sm.buffer(sm.zeros, dtype=jnp.int32)


def counted_loss(m, x, y):
    return jnp.mean(((x @ m.w + m.b[None]) * m.scale[None] - y) ** 2) + 0.0 * jnp.sum(m.seen)


def test_is_param_keeps_buffers_out_of_eqx_filter_grad_and_optax(batch):
    """The README's recipe for equinox users: partition by `sm.is_param(m)`, then
    `eqx.filter_grad` and plain optax train exactly what `sm.grad` and `optim.adamw` do."""
    import equinox as eqx
    import optax

    from shapeml import optim

    x, y = batch
    m = Counted.init(seed=0)
    spec = sm.is_param(m)
    assert jax.tree.leaves(spec) == [True, True, False, False]
    naive = eqx.filter_grad(counted_loss)(m, x, y)  # what the filter is for
    assert float(jnp.abs(naive.scale).max()) > 0, "a float buffer gets a gradient"
    with pytest.raises(TypeError, match="int32"):  # JAX's rule: README says jax.grad needs floats
        jax.grad(counted_loss)(m, x, y)

    params, rest = eqx.partition(m, spec)
    g = eqx.filter_grad(lambda p: counted_loss(eqx.combine(p, rest), x, y))(params)
    ref = sm.grad(counted_loss, m, x, y)
    assert g.scale is None and g.seen is None
    np.testing.assert_allclose(g.w, ref.w, rtol=1e-6)
    np.testing.assert_allclose(g.b, ref.b, rtol=1e-6)

    tx = optax.adamw(1e-2, weight_decay=0.1, mask=optim.decay_mask())
    state = tx.init(params)
    mine, opt = m, optim.adamw(m, lr=1e-2, weight_decay=0.1)
    for _ in range(3):
        params, rest = eqx.partition(m, sm.is_param(m))
        g = eqx.filter_grad(lambda p, rest=rest: counted_loss(eqx.combine(p, rest), x, y))(params)
        updates, state = tx.update(g, state, params)
        m = eqx.apply_updates(m, updates)
        mine, opt = optim.update(mine, opt, sm.grad(counted_loss, mine, x, y))
    for name, value in sm.params(mine).items():
        np.testing.assert_allclose(sm.params(m)[name], value, rtol=1e-5, atol=1e-7)
    assert sm.buffers(m).keys() == sm.buffers(mine).keys()
    for name, value in sm.buffers(Counted.init(seed=0)).items():
        np.testing.assert_array_equal(sm.buffers(m)[name], value)  # untouched
    with pytest.raises(sm.ArgumentTypeError, match="E0003"):
        sm.is_param({"w": m.w})
