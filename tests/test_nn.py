"""`shapeml.nn` dense layers against numpy: Linear, Embedding, LayerNorm, RMSNorm, MLP, and the
declarations that map a layer's dims onto a parent's names and set its options."""

from __future__ import annotations

import inspect
import pickle

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
    norm: nn.LayerNorm = sm.submodel(nn.LayerNorm, eps=1e-3)
    up: nn.Linear = sm.submodel(nn.Linear, In="D", Out="E")
    down: nn.Linear = sm.submodel(nn.Linear.of(In="E", Out="D", bias=False))  # the same, as a value
    mlp: nn.MLP = sm.submodel(nn.MLP, F="2 * D", activation="relu")


@sm.shaped
def block(m: Block, ids: jax.Array) -> Float[Array, "b D"]:
    x = m.norm(m.emb(ids))
    return m.mlp(x + m.down(jax.nn.relu(m.up(x))))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_numpy_in_named_dims(dtype, bias):
    m = nn.Linear.of(In="D", Out="F", bias=bias).init(seed=1, D=5, F=7)
    assert type(m) is nn.Linear and m.bias is bias
    assert m.dims.In == 5 and m.dims.Out == 7 and m.w.shape == (5, 7)
    assert ("b" in sm.params(m)) == bias and (m.b is None) == (not bias)
    same = nn.Linear.init(seed=1, In=5, Out=7, bias=bias)  # the layer on its own, same draws
    assert jax.tree.all(jax.tree.map(jnp.array_equal, same, m))
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
    ln = nn.LayerNorm.init(seed=0, D=6).replace(scale=_x(6), shift=_x(6))
    rms = nn.RMSNorm.init(seed=0, D=6).replace(scale=_x(6))
    x = _x(3, 6, dtype=dtype) * 3 + 1
    xf = np.asarray(x, np.float64)
    mu, var = xf.mean(-1, keepdims=True), xf.var(-1, keepdims=True)
    ref_ln = (xf - mu) / np.sqrt(var + 1e-5) * np.asarray(ln.scale) + np.asarray(ln.shift)
    ref_rms = xf / np.sqrt((xf**2).mean(-1, keepdims=True) + 1e-6) * np.asarray(rms.scale)
    tol = 1e-5 if dtype == np.float32 else 3e-3
    for y, ref in ((ln(x), ref_ln), (rms(x), ref_rms)):
        assert y.shape == (3, 6) and y.dtype == jnp.float32  # float32 params promote
        np.testing.assert_allclose(np.asarray(y), ref, rtol=tol, atol=tol)
    for name in ("scale", "shift"):
        assert nn.LayerNorm.__shapeml_fields__[name].decay is False
    with pytest.raises(sm.ShapemlError, match="E1001"):
        ln(_x(3, 5))
    with pytest.raises(sm.ShapemlError, match="E1802"):
        nn.RMSNorm.of(eps=0.0)
    with pytest.raises(sm.ShapemlError, match="E1802"):
        nn.LayerNorm.init(seed=0, eps=-1.0)


def test_mlp_matches_numpy_and_names_its_sub_layers():
    m = nn.MLP.of(F="4 * D").init(seed=2, D=3)
    assert m.dims.F == 12 and set(sm.params(m)) == {"up.w", "up.b", "down.w", "down.b"}
    # the sub-layers are Linears, each in its own dims
    assert type(m.up) is nn.Linear and (m.up.dims.In, m.up.dims.Out) == (3, 12)
    x = _x(5, 3)
    h = _gelu(np.asarray(x) @ np.asarray(m.up.w) + np.asarray(m.up.b))
    ref = h @ np.asarray(m.down.w) + np.asarray(m.down.b)
    np.testing.assert_allclose(m(x), ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(sm.ShapemlError, match="E1802"):
        nn.MLP.of(activation="swish")
    with pytest.raises(sm.ShapemlError, match="E1802"):
        nn.MLP.init(seed=0, activation="swish")


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


def test_a_mapping_is_a_plain_value_and_is_checked():
    of = nn.Linear.of(In="D", Out="F", bias=False)
    assert of == nn.Linear.of(Out="F", bias=False, In="D") and hash(of) == hash(of)
    assert pickle.loads(pickle.dumps(of)) == of  # plain data, the class by reference
    assert repr(of) == "Linear.of(In='D', Out='F', bias=False)"
    assert isinstance(of, sm.models.Mapped) and of.model is nn.Linear
    assert nn.Linear.of(In=3).init(seed=0).w.shape == (3, 32)
    assert nn.Linear.of(In="In") == nn.Linear.of()  # a dim mapped to its own name: by name
    m = Block.init(seed=0)
    assert type(m.up) is nn.Linear and type(m.mlp.up) is nn.Linear
    assert pickle.loads(pickle.dumps(m)).up.dims == m.up.dims  # no generated class to pickle
    with pytest.raises(sm.ShapemlError, match="E1801"):
        nn.Linear.of(In="Out", Out="D")  # `Out` is the layer's own, itself mapped
    with pytest.raises(sm.ShapemlError, match="E1801"):
        nn.MultiHeadAttention.of(Dh=8)  # derived: map D and H instead
    with pytest.raises(sm.ShapemlError, match="E1802") as e:
        nn.Linear.of(bais=False)
    assert "bias" in str(e.value)
    with pytest.raises(sm.ShapemlError, match="E1802"):
        nn.Linear.of(bias="no")
    with pytest.raises(sm.ShapemlError, match="E1801"):
        nn.Linear.of(In=2.5)
    with pytest.raises(sm.ShapemlError, match="E1802"):
        sm.submodel(nn.Linear, bias=0)  # the declaration checks the same way
    with pytest.raises(sm.ShapemlError, match="E0904"):
        nn.Linear.of(In="D").init(seed=0)  # standalone: the parent dim `D` must be given


def test_a_mapping_that_reads_a_dim_the_parent_lacks_is_refused_at_declaration():
    with pytest.raises(sm.ShapemlError, match="E0905") as e:

        class Net(sm.Model):
            dims = sm.Dims(D=4)
            up: nn.Linear = sm.submodel(nn.Linear, In="D", Out="F")

    assert "`F`" in str(e.value)


def test_a_parent_with_mismatched_layer_dims_or_options_is_refused_at_construction():
    m = Block.init(seed=0, D=6)
    wrong = nn.Linear.of(In="D", Out="E").init(seed=0, D=6, E=5)
    with pytest.raises(sm.ShapemlError, match="E0902") as e:
        m.replace(up=wrong)
    assert "up" in str(e.value) and "Out: expected 18, got 5" in str(e.value)
    with_bias = nn.Linear.init(seed=0, In=18, Out=6)  # `down` is declared bias=False
    with pytest.raises(sm.ShapemlError, match="E0902") as e:
        m.replace(down=with_bias)
    assert "bias: expected False, got True" in str(e.value)

    class Clash(sm.Model):  # the attention derives Dh = D // H = 4, the parent says Dh = 3
        dims = sm.Dims(D=8, H=2, Dh=3)
        attn: nn.MultiHeadAttention = sm.submodel(nn.MultiHeadAttention)

    with pytest.raises(sm.ShapemlError, match="E0903"):
        Clash.init(seed=0)

    class Own(sm.Model):  # a mapped dim is the mapping's, whatever the parent's same name
        dims = sm.Dims(D=4, F="3 * D")
        mlp: nn.MLP = sm.submodel(nn.MLP, F="2 * D")

    assert Own.init(seed=0).mlp.dims.F == 8


LAYERS = [
    nn.Linear,
    nn.Embedding,
    nn.LayerNorm,
    nn.RMSNorm,
    nn.MLP,
    nn.MultiHeadAttention,
    nn.Conv2d,
    nn.MaxPool2d,
    nn.AvgPool2d,
    nn.Dropout,
    nn.BatchNorm,
]


@pytest.mark.parametrize("layer", LAYERS, ids=lambda c: c.__name__)
def test_every_layer_documents_each_dim_and_option_with_its_default(layer):
    params = inspect.signature(layer.init).parameters
    shown = {n: p.default for n, p in params.items() if n not in ("seed", "max_bytes")}
    declared = {n: layer.dims[n] for n in layer.dims.free}
    declared.update(layer.__shapeml_statics__)
    assert shown == declared  # every free dim and option, with the declared default
    assert all(params[n].kind is inspect.Parameter.KEYWORD_ONLY for n in shown)
    doc = inspect.getdoc(layer.init)
    assert all(f"    {n}:" in doc for n in shown), doc  # each one explained under Args
    m = layer.init(seed=0)
    assert type(m) is layer and all(
        getattr(m, k) == v for k, v in layer.__shapeml_statics__.items()
    )
