"""Optional fields (`b: ... | None = sm.param(..., when="bias")`) through every name-based API,
dim mappings as declaration values, and `@sm.shaped` methods checked in their model's dims."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Float

import shapeml as sm
from shapeml import nn, optim, sharding
from shapeml.testing import check_contract


class Affine(sm.Model):
    """`x @ w (+ b)`, the bias optional; a model of the core, not an `nn` layer."""

    dims = sm.Dims(In=4, Out=3)
    w: Float[Array, "In Out"] = sm.param(sm.normal(std=0.5))
    b: Float[Array, " Out"] | None = sm.param(sm.normal(std=0.5), decay=False, when="bias")
    shift: Float[Array, " Out"] | None = sm.buffer(sm.ones, when={"mode": "shifted"})
    bias: bool = sm.static(default=True)
    mode: str = sm.static(default="plain")

    @sm.shaped
    def __call__(self, x: Float[Array, "b In"]) -> Float[Array, "b Out"]:
        y = x @ self.w
        if self.b is not None:
            y = y + self.b[None]
        return y if self.shift is None else y + self.shift[None]


class Net(sm.Model):
    dims = sm.Dims(D=4, E=6)
    first: Affine = sm.submodel(Affine, In="D", Out="E", bias=False)
    second: Affine = sm.submodel(Affine, In="E", Out="D", mode="shifted")


NET = Net


def test_absent_fields_are_none_and_no_name_based_api_lists_them(tmp_path):
    m = Affine.init(seed=0, bias=False)
    assert type(m) is Affine and m.b is None and m.shift is None
    assert set(sm.params(m)) == {"w"} and sm.buffers(m) == {} and sm.count_params(m) == 12
    assert " b " not in repr(m) and "bias = False" in repr(m)
    with_bias = Affine.init(seed=0)
    np.testing.assert_array_equal(with_bias.w, m.w)  # the option changes no other field's draw
    net = NET.init(seed=1)
    assert set(sm.params(net)) == {"first.w", "second.w", "second.b"}
    assert set(sm.buffers(net)) == {"second.shift"}
    # the file lists only what is present, and reads back into the same options
    sm.save(tmp_path / "n.safetensors", net)
    back = sm.load(tmp_path / "n.safetensors", NET)
    assert back.first.b is None and back.second.shift.shape == (4,)

    # a file with a bias is an unexpected entry for a parent that declares none: the declared
    # option wins over the file's
    class Net(sm.Model):  # `Net` as it was before `first` lost its bias
        dims = sm.Dims(D=4, E=6)
        first: Affine = sm.submodel(Affine, In="D", Out="E")
        second: Affine = sm.submodel(Affine, In="E", Out="D", mode="shifted")

    sm.save(tmp_path / "old.safetensors", Net.init(seed=1))
    with pytest.raises(sm.ShapemlError, match="E1301") as e:
        sm.load(tmp_path / "old.safetensors", NET)
    assert "unexpected: `first.b`" in str(e.value)
    # on its own, a layer takes the file's options; `like=` requires them to be the model's
    sm.save(tmp_path / "a.safetensors", with_bias)
    assert sm.load(tmp_path / "a.safetensors", Affine).b.shape == (3,)
    with pytest.raises(sm.ShapemlError, match="E1303") as e:
        sm.load(tmp_path / "a.safetensors", like=m)
    assert "bias: file True, model False" in str(e.value)


def test_construction_checks_presence_against_the_options():
    m = Affine.init(seed=0, bias=False)
    with pytest.raises(sm.ShapemlError, match="E0902") as e:
        m.replace(b=jnp.zeros(3))
    assert "b: absent (bias=False)" in str(e.value)
    with pytest.raises(sm.ShapemlError, match="E0902") as e:
        m.replace(bias=True)  # the bias is now present, and missing
    assert "b: None given" in str(e.value)
    assert m.replace(bias=True, b=jnp.zeros(3)).b.shape == (3,)
    with pytest.raises(sm.ShapemlError, match="E0902") as e:
        Affine(w=jnp.zeros((4, 3)))  # bias=True by default: `b` is missing
    assert "b: missing" in str(e.value)


def test_optional_declarations_are_checked():
    with pytest.raises(sm.ShapemlError, match="E0905") as e:

        class NoWhen(sm.Model):
            dims = sm.Dims(D=2)
            b: Float[Array, " D"] | None = sm.param(sm.zeros)

    assert "when=" in str(e.value)
    with pytest.raises(sm.ShapemlError, match="E0905") as e:

        class NotOptional(sm.Model):
            dims = sm.Dims(D=2)
            b: Float[Array, " D"] = sm.param(sm.zeros, when="bias")
            bias: bool = sm.static(default=True)

    assert "| None" in str(e.value)
    with pytest.raises(sm.ShapemlError, match="E0905") as e:

        class Typo(sm.Model):
            dims = sm.Dims(D=2)
            b: Float[Array, " D"] | None = sm.param(sm.zeros, when="bais")
            bias: bool = sm.static(default=True)

    assert "`bias`" in str(e.value)
    with pytest.raises(sm.ShapemlError, match="E0905"):
        sm.param(sm.zeros, when=["bias"])


def _loss(m: Net, x):
    return jnp.mean(m.second(m.first(x)) ** 2)


def test_gradients_optimizers_and_dead_params_skip_absent_fields():
    net = Net.init(seed=2)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((5, 4)), jnp.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no W1101 for the absent `first.b`
        value, g = sm.value_and_grad(_loss, net, x)
    assert set(g.named()) == {"first.w", "second.w", "second.b"}
    assert g.first.b is None
    opt = optim.adamw(net, lr=0.1, weight_decay=0.5)
    new, _ = optim.update(net, opt, g * 0.0)
    # decay (declared) shrinks the weights, never the bias; absent fields stay absent
    np.testing.assert_allclose(new.first.w, net.first.w * (1 - 0.05), rtol=1e-6)
    np.testing.assert_array_equal(new.second.b, net.second.b)
    assert new.first.b is None
    # the same through optax directly, with the mask from the declarations
    tx = optax.adamw(0.1, weight_decay=0.5, mask=optim.decay_mask())
    opt2 = optim.from_optax(net, tx)
    new2, _ = optim.update(net, opt2, g * 0.0)
    np.testing.assert_allclose(new2.first.w, new.first.w, rtol=1e-6)


def test_size_limits_count_only_present_fields():
    with pytest.raises(sm.ShapemlError, match="E0906") as e:
        Affine.init(seed=0, In=2**20, Out=2**10, max_bytes=2**31)
    assert "`w`" in str(e.value)
    # w alone is 4 * 2**30 bytes; the bias would add 4 KiB
    big = {"In": 2**18, "Out": 2**10, "max_bytes": 2**30}
    with pytest.raises(sm.ShapemlError, match="E0906"):
        Affine.init(seed=0, **big)
    shape = jax.eval_shape(lambda: Affine.init(seed=0, bias=False, **big))
    assert shape.b is None


def test_placement_and_memory_of_absent_fields():
    net = Net.init(seed=0)
    specs = sm.partition_specs(net, {"E": "x"})
    assert specs.first.w == P(None, "x") and specs.first.b is None
    assert specs.second.w == P("x", None)
    mesh = sharding.make_mesh("x=1")
    report = sm.memory_report(net, mesh, {"E": "x"}, file=None)
    assert [r.name for r in report.rows] == ["first.w", "second.w", "second.b", "second.shift"]


def test_a_contract_on_a_method_uses_its_model_dims():
    records = check_contract(Affine.__call__, Affine.init(seed=0, bias=False))
    assert [r["out"] for r in records] == [(1, 3), (3, 3)]


def test_shaped_methods_bind_self_dims_and_models_passed_unannotated():
    m = Affine.init(seed=0, In=5)
    assert m(jnp.ones((2, 5))).shape == (2, 3)
    with pytest.raises(sm.ShapemlError, match="E1001") as e:
        m(jnp.ones((2, 4)))  # In is 5
    assert "In" in str(e.value)

    @sm.shaped
    def apply(layer, x: Float[Array, "b Out"]) -> Float[Array, "b Out"]:
        return x  # `layer` is not annotated: its dims are bound all the same

    assert apply(m, jnp.ones((2, 3))).shape == (2, 3)
    with pytest.raises(sm.ShapemlError, match="E1001"):
        apply(m, jnp.ones((2, 4)))
    other = Affine.init(seed=0, In=4)
    with pytest.raises(sm.ShapemlError, match="E1001") as e:

        @sm.shaped
        def both(a, b, x: Float[Array, "b In"]):
            return x

        both(m, other, jnp.ones((1, 4)))
    assert "disagree" in str(e.value)
    # under jit, checked once per trace and the method is a plain pytree method
    f = jax.jit(lambda m, x: m(x))
    np.testing.assert_allclose(f(m, jnp.ones((2, 5))), m(jnp.ones((2, 5))), rtol=1e-6)


def test_a_nested_mapping_composes():
    class Tower(sm.Model):
        dims = sm.Dims(W=6)
        block: Net = sm.submodel(Net, D="W", E="2 * W")

    t = Tower.init(seed=0)
    assert (t.block.dims.D, t.block.dims.E) == (6, 12)
    assert (t.block.first.dims.In, t.block.first.dims.Out) == (6, 12)
    assert t.block.first.b is None and t.block.second.shift.shape == (6,)
    assert nn.Linear.of(In="D").init(seed=0, D=2).dims.In == 2
