"""`shapeml.nn` dense layers against numpy: Linear, Embedding, LayerNorm, RMSNorm, MLP, and the
`Layer.of` renaming of dims and setting of options."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float

import shapeml as sm
from shapeml import nn, optim

RNG = np.random.default_rng(0)


def _x(*shape, dtype=np.float32):
    return jnp.asarray(RNG.standard_normal(shape).astype(dtype))


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


class Block(sm.Model):
    """A parent whose dims (D, E) are not the Linear's (In, Out)."""

    dims = sm.Dims(D=8, E="3 * D", V=11)
    emb: nn.Embedding = sm.submodel(nn.Embedding)
    norm: nn.LayerNorm = sm.submodel(nn.LayerNorm.of(eps=1e-3))
    up: nn.Linear = sm.submodel(nn.Linear.of(In="D", Out="E"))
    down: nn.Linear = sm.submodel(nn.Linear.of(In="E", Out="D", bias=False))
    mlp: nn.MLP = sm.submodel(nn.MLP.of(F="2 * D", activation="relu"))


@sm.shaped
def block(m: Block, ids: jax.Array) -> Float[Array, "b D"]:
    x = m.norm(m.emb(ids))
    return m.mlp(x + m.down(jax.nn.relu(m.up(x))))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_numpy_in_named_dims(dtype, bias):
    cls = nn.Linear.of(In="D", Out="F", bias=bias)
    m = cls.init(seed=1, D=5, F=7)
    assert m.dims.In == 5 and m.dims.Out == 7 and m.w.shape == (5, 7)
    assert ("b" in sm.params(m)) == bias
    x = _x(2, 3, 5, dtype=dtype)
    y = m(x)
    ref = np.asarray(x, np.float64) @ np.asarray(m.w, np.float64)
    if bias:
        ref = ref + np.asarray(m.b, np.float64)
    assert y.shape == (2, 3, 7) and y.dtype == jnp.result_type(x.dtype, m.w.dtype)
    np.testing.assert_allclose(np.asarray(y, np.float64), ref, rtol=2e-3, atol=2e-3)
    with pytest.raises(sm.ShapemlError, match="E1001") as e:
        m(_x(2, 4))  # In is 5
    assert "In" in str(e.value)


def test_fan_in_initializer_scales_by_the_fan_in():
    key = jax.random.key(0)
    w = nn.Linear.__shapeml_fields__["w"].init(key, (400, 300), jnp.float32)  # [In Out]
    assert abs(float(jnp.std(w)) - 1 / 20) < 0.002
    conv = nn.Conv2d.__shapeml_fields__["w"].init(key, (64, 16, 3, 3), jnp.float32)  # [Co Ci K K]
    assert abs(float(jnp.std(conv)) - 1 / 12) < 0.004
    u = nn.fan_in(gain=2.0, distribution="uniform")(jax.random.key(0), (100, 50), jnp.float32)
    assert float(jnp.max(jnp.abs(u))) <= 2.0 * np.sqrt(3 / 100) + 1e-6
    assert abs(float(jnp.std(u)) - 0.2) < 0.01
    with pytest.raises(sm.ShapemlError, match="E0002"):
        nn.fan_in(gain=0.0)
    with pytest.raises(sm.ShapemlError, match="E0003"):
        nn.fan_in(axes=())


def test_embedding_and_tied_logits_match_numpy():
    m = nn.Embedding.init(seed=0, V=10, D=4)
    ids = jnp.array([[0, 3, 9], [1, 1, 2]])
    np.testing.assert_array_equal(m(ids), np.asarray(m.w)[np.asarray(ids)])
    x = _x(2, 4)
    np.testing.assert_allclose(m.logits(x), np.asarray(x) @ np.asarray(m.w).T, rtol=1e-5, atol=1e-6)
    with pytest.raises(sm.ShapemlError, match="E1803"):
        m(jnp.array([10]))
    # a traced out-of-vocabulary id reads NaN, never a clamped row
    assert bool(jnp.all(jnp.isnan(jax.jit(m.__call__)(jnp.array([10])))))
    assert bool(jnp.all(jnp.isnan(jax.jit(m.__call__)(jnp.array([-1])))))  # never the last row


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_norms_match_numpy(dtype):
    ln = nn.LayerNorm.init(seed=0, D=6).replace(scale=_x(6), bias=_x(6))
    rms = nn.RMSNorm.init(seed=0, D=6).replace(scale=_x(6))
    x = _x(3, 6, dtype=dtype) * 3 + 1
    xf = np.asarray(x, np.float64)
    mu, var = xf.mean(-1, keepdims=True), xf.var(-1, keepdims=True)
    ref_ln = (xf - mu) / np.sqrt(var + 1e-5) * np.asarray(ln.scale) + np.asarray(ln.bias)
    ref_rms = xf / np.sqrt((xf**2).mean(-1, keepdims=True) + 1e-6) * np.asarray(rms.scale)
    tol = 1e-5 if dtype == np.float32 else 3e-3
    for y, ref in ((ln(x), ref_ln), (rms(x), ref_rms)):
        assert y.shape == (3, 6) and y.dtype == jnp.float32  # float32 params promote
        np.testing.assert_allclose(np.asarray(y), ref, rtol=tol, atol=tol)
    for name in ("scale", "bias"):
        assert nn.LayerNorm.__shapeml_fields__[name].decay is False
    with pytest.raises(sm.ShapemlError, match="E1001"):
        ln(_x(3, 5))
    with pytest.raises(sm.ShapemlError, match="E1802"):
        nn.RMSNorm.of(eps=0.0)


def test_mlp_matches_numpy_and_names_its_sub_layers():
    m = nn.MLP.of(F="4 * D").init(seed=2, D=3)
    assert m.dims.F == 12 and set(sm.params(m)) == {"up.w", "up.b", "down.w", "down.b"}
    x = _x(5, 3)
    h = _gelu(np.asarray(x) @ np.asarray(m.up.w) + np.asarray(m.up.b))
    ref = h @ np.asarray(m.down.w) + np.asarray(m.down.b)
    np.testing.assert_allclose(m(x), ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(sm.ShapemlError, match="E1802"):
        nn.MLP.of(activation="swish")


def test_a_parent_composes_layers_by_its_own_dim_names():
    m = Block.init(seed=0, D=6)
    assert (m.up.dims.In, m.up.dims.Out, m.down.dims.In, m.mlp.dims.F) == (6, 18, 18, 12)
    assert m.norm.eps == 1e-3 and m.mlp.activation == "relu"
    opt = optim.adamw(m, lr=1e-2)

    @jax.jit
    def train(m, opt, ids):
        value, g = sm.value_and_grad(lambda m, ids: jnp.sum(block(m, ids) ** 2), m, ids)
        return optim.update(m, opt, g), block(m, ids)

    (m2, _), y = train(m, opt, jnp.array([1, 2, 3, 4]))
    assert y.shape == (4, 6)
    # every field is a param of the parent, by dotted name, and the optimizer trains them all
    assert {"up.w", "down.w", "mlp.up.b", "emb.w", "norm.scale"} <= set(sm.params(m2))
    assert not np.allclose(m2.up.w, m.up.w)


def test_checkpoint_round_trip_keeps_renamed_layers_and_options(tmp_path):
    m = Block.init(seed=3, D=6)
    sm.save(tmp_path / "b.safetensors", m)
    back = sm.load(tmp_path / "b.safetensors", Block)
    assert back.dims == m.dims and back.norm.eps == 1e-3
    for k, v in sm.params(m).items():
        np.testing.assert_array_equal(sm.params(back)[k], v)


def test_of_returns_one_class_per_arguments_and_checks_them():
    assert nn.Linear.of(In="D", Out="F") is nn.Linear.of(Out="F", In="D")
    assert issubclass(nn.Linear.of(In="D"), nn.Linear)
    assert nn.Linear.of(In=3).init(seed=0).w.shape == (3, 32)
    with pytest.raises(sm.ShapemlError, match="E1801"):
        nn.Linear.of(In="Out", Out="D")  # `Out` is the layer's own, itself renamed
    with pytest.raises(sm.ShapemlError, match="E1802") as e:
        nn.Linear.of(bais=False)
    assert "bias" in str(e.value)
    with pytest.raises(sm.ShapemlError, match="E1802"):
        nn.Linear.of(bias="no")
    with pytest.raises(sm.ShapemlError, match="E1801"):
        nn.Linear.of(In=2.5)


def test_a_parent_with_mismatched_layer_dims_is_refused_at_construction():
    m = Block.init(seed=0, D=6)
    wrong = nn.Linear.of(In="D", Out="E").init(seed=0, D=6, E=5)
    with pytest.raises(sm.ShapemlError, match="E0902") as e:
        m.replace(up=wrong)
    assert "up" in str(e.value) and "E: expected 18, got 5" in str(e.value)

    class Clash(sm.Model):  # the MLP derives F = 2 * D, the parent says F = 3 * D
        dims = sm.Dims(D=4, F="3 * D")
        mlp: nn.MLP = sm.submodel(nn.MLP.of(F="2 * D"))

    with pytest.raises(sm.ShapemlError, match="E0903"):
        Clash.init(seed=0)
