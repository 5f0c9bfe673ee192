"""Models: dims, fields, seeding, construction checks, replace, errors, introspection, repr."""

import dataclasses
import hashlib
import math
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Bool, Float, Int

import shapeml as sm
from shapeml import nn
from shapeml.zoo.spotter import Spotter


class Block(sm.Model):
    dims = sm.Dims(D=8, F=16)
    w1: Float[Array, "D F"] = sm.param(sm.normal(std=0.1))
    w2: Float[Array, "F D"] = sm.param(sm.normal(std=0.1))


class Net(sm.Model):
    dims = sm.Dims(D=8, F=16, L=2, V=11, T="2 * D")
    emb: Float[Array, "V D"] = sm.param(sm.normal(std=0.02))
    blocks: tuple[Block, ...] = sm.submodels(Block, "L")
    head: Block = sm.submodel(Block)
    count: Int[Array, " T"] = sm.buffer(sm.full(3))
    mask: Bool[Array, " D"] = sm.buffer(sm.ones)


class Centered(sm.Model):
    dims = sm.Dims(S=16)
    center: Float[Array, "1 S S"] = sm.buffer(sm.zeros)


def test_dims_derived_and_overridden():
    d = sm.Dims(S=16, P=4, N="(S // P) ** 2", Q="S / P")
    assert (d.N, d["Q"], d.free) == (16, 4, ("S", "P"))
    assert d.resolve(S=20).N == 25
    assert dict(d.resolve(P=2)) == {"S": 16, "P": 2, "N": 64, "Q": 8}


@pytest.mark.parametrize(
    "decl, needle",
    [
        (dict(A="B + 1", B="A * 2"), "depend on themselves: A -> B -> A"),
        (dict(A=4, B="A - 5"), "negative size"),
        (dict(A=3, B="A / 2"), "not a whole number (3 / 2)"),
        (dict(A=3, B="Aa * 2"), "reads `Aa`, which is not declared"),
        (dict(A=2.5), "2.5 (float)"),
        (dict(A=3, B="A.real"), "cannot contain"),
        (dict(A=3, B="import os"), "not an expression"),
    ],
)
def test_invalid_dims_raise_e0903(decl, needle):
    with pytest.raises(sm.ShapemlError, match="E0903") as e:
        sm.Dims(**decl)
    assert needle in str(e.value)


def test_invalid_dims_at_class_creation():
    with pytest.raises(sm.ShapemlError, match="E0903"):

        class Bad(sm.Model):
            dims = sm.Dims(A="B", B="A")

    with pytest.raises(sm.ShapemlError, match="E0905") as e:

        class Bad2(sm.Model):
            dims = sm.Dims(Dm=4)
            w: Float[Array, "D D"] = sm.param(sm.zeros)

    assert "a dim with a similar name exists: `Dm`" in str(e.value)


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (dict(X=3), "there is no dim `X`"),
        (dict(T=5), "`T` = `2 * D` is derived"),
        (dict(D=-1), "whole number >= 0, got -1"),
        (dict(D=2.0), "whole number >= 0, got 2.0"),
    ],
)
def test_bad_init_overrides_raise_e0904(overrides, needle):
    with pytest.raises(sm.ShapemlError, match="E0904") as e:
        Net.init(seed=0, **overrides)
    assert needle in str(e.value)


def test_init_shapes_dtypes_and_dims():
    m = Net.init(seed=0, D=4)
    assert m.dims.D == 4 and m.dims.T == 8 and Net.dims.D == 8
    assert m.emb.shape == (11, 4) and m.emb.dtype == jnp.float32
    assert m.blocks[1].w1.shape == (4, 16) and m.blocks[1].dims.D == 4
    np.testing.assert_array_equal(m.count, np.full(8, 3, np.int32))
    assert m.mask.dtype == jnp.bool_ and bool(m.mask.all())
    assert len(m.blocks) == 2 and isinstance(m.head, Block)


def test_same_seed_same_model_and_fields_draw_by_name():
    a, b = Net.init(seed=3), Net.init(seed=3)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(Net.init(seed=4).emb, a.emb)
    # each field draws from fold_in(key(seed), hash(dotted name)): check it independently
    key = jax.random.fold_in(jax.random.key(3), sm.models._model.field_hash("blocks.1.w1"))
    # (compiled together, the draws may differ from eager ones in the last bit)
    np.testing.assert_allclose(a.blocks[1].w1, 0.1 * jax.random.normal(key, (8, 16)), rtol=1e-6)
    assert not np.array_equal(a.blocks[0].w1, a.blocks[1].w1)


def test_adding_removing_reordering_fields_changes_no_other():
    class A(sm.Model):
        dims = sm.Dims(D=8)
        x: Float[Array, " D"] = sm.param(sm.normal())
        y: Float[Array, "D D"] = sm.param(sm.uniform(lo=-1, hi=1))

    class B(sm.Model):  # reordered, with a new field in front
        dims = sm.Dims(D=8)
        z: Float[Array, " D"] = sm.param(sm.normal())
        y: Float[Array, "D D"] = sm.param(sm.uniform(lo=-1, hi=1))
        x: Float[Array, " D"] = sm.param(sm.normal())

    class C(sm.Model):  # x removed
        dims = sm.Dims(D=8)
        y: Float[Array, "D D"] = sm.param(sm.uniform(lo=-1, hi=1))

    a, b, c = A.init(seed=7), B.init(seed=7), C.init(seed=7)
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.y, b.y)
    np.testing.assert_array_equal(a.y, c.y)


def test_same_seed_is_bit_identical_across_processes():
    # this process and a fresh one (one interpreter start is the cost of the test)
    code = textwrap.dedent(
        """
        import hashlib, jax, numpy as np
        from shapeml.zoo.spotter import Spotter
        m = Spotter.init(seed=11)
        print(hashlib.sha256(b"".join(np.asarray(x).tobytes() for x in jax.tree.leaves(m))).hexdigest())
        """
    )
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    here = hashlib.sha256(
        b"".join(np.asarray(x).tobytes() for x in jax.tree.leaves(Spotter.init(seed=11)))
    ).hexdigest()
    assert other == here and len(here) == 64


def test_direct_construction_reports_every_mismatch():
    m = Net.init(seed=0)
    with pytest.raises(sm.ShapemlError, match="E0902") as e:
        Net(
            emb=np.zeros((11, 9), np.float32),
            blocks=m.blocks[:1],
            head=m.head,
            count=jnp.zeros(16, jnp.float32),
            mask=m.mask,
        )
    msg = str(e.value)
    assert "3 field(s)" in msg
    assert "emb: expected [V D] = [11 8] float32, got [11 9] float32" in msg
    assert "blocks: expected 2 x Block (L=2), got 1" in msg
    assert "count: expected [T] = [16] int32, got [16] float32" in msg
    with pytest.raises(sm.ShapemlError, match="E0902") as e:
        Net(emb=m.emb, blocks=m.blocks, head=m.head, count=m.count)
    assert "mask: missing ([D] = [8] bool)" in str(e.value)


def test_construction_converts_numpy_precision_and_checks_child_dims():
    m = Net.init(seed=0)
    m2 = Net(emb=np.ones((11, 8)), blocks=m.blocks, head=m.head, count=m.count, mask=m.mask)
    assert isinstance(m2.emb, jax.Array) and m2.emb.dtype == jnp.float32
    wide = Block.init(seed=0, D=4)
    with pytest.raises(sm.ShapemlError, match="E0902") as e:
        m.replace(head=wide)
    assert "head: its dims differ from `Net`'s (D: expected 8, got 4)" in str(e.value)


def test_unknown_field_e0901_with_suggestion():
    m = Net.init(seed=0)
    with pytest.raises(AttributeError) as e:
        _ = m.embb
    assert "[E0901] `Net` has no field `embb`" in str(e.value)
    assert "a field with a similar name exists: `emb`" in str(e.value)
    with pytest.raises(sm.ShapemlError, match="E0901") as e:
        m.replace(Emb=m.emb)
    assert "`emb`" in str(e.value)
    assert not hasattr(m, "nothing_like_it")


def test_assignment_raises_e1102_with_fix():
    m = Net.init(seed=0)
    with pytest.raises(dataclasses.FrozenInstanceError) as e:
        m.emb = m.emb * 0.0
    assert "[E1102]" in str(e.value) and "m = m.replace(emb=...)" in str(e.value)


def test_replace_returns_checked_new_model():
    m = Net.init(seed=0)
    m2 = m.replace(emb=m.emb * 0.0)
    assert float(jnp.abs(m2.emb).sum()) == 0.0 and float(jnp.abs(m.emb).sum()) > 0
    with pytest.raises(sm.ShapemlError, match="E0902"):
        m.replace(emb=m.emb.T)


def test_introspection_uses_dotted_names():
    m = Net.init(seed=0)
    assert list(sm.params(m)) == [
        "emb",
        "blocks.0.w1",
        "blocks.0.w2",
        "blocks.1.w1",
        "blocks.1.w2",
        "head.w1",
        "head.w2",
    ]
    assert list(sm.buffers(m)) == ["count", "mask"]
    assert sm.count_params(m) == 11 * 8 + 3 * 2 * 8 * 16
    assert sm.buffers(Centered.init())["center"].shape == (1, 16, 16)


def test_repr_shows_kind_shape_in_dims_and_dtype():
    text = repr(Net.init(seed=0))
    assert text.splitlines()[0] == "Net(D=8 F=16 L=2 V=11 T=16)"
    assert "param   emb    [V D]  [11 8]  float32" in text
    assert "buffer  count  [T]    [16]    int32" in text
    assert "blocks.1: Block(D=8 F=16)" in text


def test_models_are_pytrees_for_jit_grad_vmap():
    m = Net.init(seed=0)
    f = jax.jit(lambda m: jnp.sum(m.emb) + jnp.sum(m.head.w1))
    np.testing.assert_allclose(f(m), jnp.sum(m.emb) + jnp.sum(m.head.w1), rtol=1e-6)
    g = jax.grad(lambda m: jnp.sum(m.emb**2), allow_int=True)(m)
    np.testing.assert_allclose(g.emb, 2 * m.emb, rtol=1e-6)
    doubled = jax.tree.map(lambda x: x * 2, m)
    assert isinstance(doubled, Net) and doubled.dims == m.dims


@pytest.mark.parametrize(
    "build, needle",
    [
        (
            lambda: type(
                "P",
                (sm.Model,),
                {"__annotations__": {"w": Int[Array, "3"]}, "w": sm.param(sm.zeros)},
            ),
            "only floating",
        ),
        (
            lambda: type(
                "P",
                (sm.Model,),
                {"__annotations__": {"w": Int[Array, "3"]}, "w": sm.buffer(sm.normal())},
            ),
            "draws floats",
        ),
        (
            lambda: type(
                "P",
                (sm.Model,),
                {"__annotations__": {"w": Float[Array, "*b 3"]}, "w": sm.param(sm.zeros)},
            ),
            "not allowed",
        ),
        (
            lambda: type("P", (sm.Model,), {"__annotations__": {"w": Float[Array, "3"]}}),
            "has no declaration",
        ),
        (
            lambda: type(
                "P", (sm.Model,), {"__annotations__": {"w": int}, "w": sm.param(sm.zeros)}
            ),
            "not a jaxtyping",
        ),
        (
            lambda: type(
                "P",
                (sm.Model,),
                {
                    "__annotations__": {"w": Float[Array, "3"]},
                    "w": sm.param(sm.zeros, dtype=jnp.int8),
                },
            ),
            "does not allow",
        ),
    ],
)
def test_bad_field_declarations_raise_e0905(build, needle):
    with pytest.raises(sm.ShapemlError, match="E0905") as e:
        build()
    assert needle in str(e.value)


def test_explain_known_and_unknown_codes():
    text = str(sm.explain("e0901"))
    assert text.startswith("E0901: no such field") and "similar name" in text
    with pytest.raises(sm.ShapemlError, match="E0001"):
        sm.explain("E9999")


def test_init_takes_a_key_and_vmaps_over_seeds_into_an_ensemble():
    a = Net.init(seed=jax.random.key(5))
    np.testing.assert_array_equal(a.emb, Net.init(seed=5).emb)
    ensemble = jax.vmap(lambda s: Net.init(seed=s))(jnp.arange(3))
    assert ensemble.emb.shape == (3, 11, 8) and ensemble.dims == Net.dims
    np.testing.assert_array_equal(ensemble.blocks[1].w2[2], Net.init(seed=2).blocks[1].w2)


@pytest.mark.parametrize("partitionable", [True, False])
def test_random_initializers_draw_what_jax_random_draws_in_the_fields_shape(partitionable):
    # The built-ins draw flat and reshape (XLA:CPU compiles that faster): the values must be
    # exactly JAX's own draw of the shaped array, in either threefry mode, for every rank.
    key = jax.random.key(3)
    with jax.threefry_partitionable(partitionable):
        for shape in [(), (5,), (3, 4), (2, 3, 5)]:
            for dtype in (jnp.float32, jnp.bfloat16):
                np.testing.assert_array_equal(
                    sm.normal(mean=1.0, std=0.5)(key, shape, dtype),
                    1.0 + 0.5 * jax.random.normal(key, shape, dtype),
                )
                np.testing.assert_array_equal(
                    sm.uniform(-2.0, 3.0)(key, shape, dtype),
                    jax.random.uniform(key, shape, dtype, minval=-2.0, maxval=3.0),
                )
            bound = 1.0 / math.sqrt(2) * math.sqrt(3.0)  # fan-in 2, as nn.fan_in computes it
            np.testing.assert_array_equal(
                nn.fan_in(distribution="uniform")(key, (2, 3, 5), jnp.float32),
                jax.random.uniform(key, (2, 3, 5), minval=-bound, maxval=bound),
            )


def test_host_values_that_would_change_meaning_are_refused():
    class Q(sm.Model):
        dims = sm.Dims(D=2)
        q: Int[Array, " D"] = sm.buffer(sm.zeros, dtype=jnp.int8)
        w: Float[Array, " D"] = sm.param(sm.zeros)

    m = Q.init()
    assert m.replace(q=np.array([100, -5])).q.dtype == jnp.int8  # int64 values that fit: fine
    with pytest.raises(sm.ShapemlError, match="E0902") as e:
        m.replace(q=np.array([300, -1000]))
    assert "the value -1000 does not fit in int8 (-128..127)" in str(e.value)
    with pytest.raises(sm.ShapemlError, match="E0902") as e:
        m.replace(w=np.array([1e40, 0.0]))
    assert "overflows float32" in str(e.value)


class Vocab(sm.Model):
    """A model with static configuration beside its tensors."""

    dims = sm.Dims(V=3, D=4)
    emb: Float[Array, "V D"] = sm.param(sm.normal(std=0.1))
    tokens: tuple[str, ...] = sm.static(default=("a", "b", "c"))
    scale: float = sm.static(default=1.0)


class Required(sm.Model):
    dims = sm.Dims(D=2)
    w: Float[Array, " D"] = sm.param(sm.ones)
    scale: float = sm.static()


class WithVocabs(sm.Model):
    dims = sm.Dims(V=3, D=4, L=2)
    vocabs: tuple[Vocab, ...] = sm.submodels(Vocab, "L")
    name: str = sm.static(default="net")


def test_static_fields_are_configuration_not_leaves():
    m = Vocab.init(seed=0, scale=2.0, D=5)  # dims and statics by keyword
    assert (m.tokens, m.scale, m.emb.shape) == (("a", "b", "c"), 2.0, (3, 5))
    assert len(jax.tree.leaves(m)) == 1  # statics live in the tree structure
    # jit sees a static as configuration: another value is another program, not a traced leaf
    double = jax.jit(lambda m: m.emb * m.scale)
    np.testing.assert_allclose(double(m), np.asarray(m.emb) * 2.0)
    m3 = m.replace(scale=3.0)
    np.testing.assert_allclose(double(m3), np.asarray(m.emb) * 3.0)
    assert jax.tree.structure(m) != jax.tree.structure(m3)
    assert m.replace(tokens=["x", "y"]).tokens == ("x", "y")  # lists come back as tuples
    assert "static  tokens = ('a', 'b', 'c')" in repr(m)


def test_static_field_errors_name_the_field():
    with pytest.raises(sm.ShapemlError, match=r"scale: missing") as e:
        Required(dims=Required.dims)
    assert e.value.code == "E0902"
    with pytest.raises(sm.ArgumentTypeError, match=r"`Vocab.tokens` is a static field"):
        Vocab.init(seed=0, scale=1.0, tokens={"a": 1})
    with pytest.raises(sm.ShapemlError, match="a field with a similar name exists: `tokens`"):
        Vocab.init(seed=0, scale=1.0).replace(token=("x",))


def test_static_fields_round_trip_through_save_and_load(tmp_path):
    m = WithVocabs.init(seed=0, name="mine")
    m = m.replace(vocabs=(m.vocabs[0], m.vocabs[1].replace(tokens=("p", "q", "r"))))
    sm.save(tmp_path / "m.safetensors", m)
    back = sm.load(tmp_path / "m.safetensors", WithVocabs)
    assert back.name == "mine"
    assert [v.tokens for v in back.vocabs] == [("a", "b", "c"), ("p", "q", "r")]
    assert jax.tree.structure(back) == jax.tree.structure(m)
