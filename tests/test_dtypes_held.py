"""A declared dtype this process cannot hold (float64 without x64) is refused where the tensor is
declared or made (E0004), never narrowed silently; with x64 on, it is held as declared."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float, Int

import shapeml as sm
from shapeml.state import Graph, KVCache, param, state


class Wide(sm.Model):
    dims = sm.Dims(D=3)
    w: Float[Array, " D"] = sm.param(sm.zeros, dtype=jnp.float64)
    n: Int[Array, " D"] = sm.buffer(sm.zeros, dtype=jnp.int64)


class Holder(sm.Model):
    dims = sm.Dims(D=3)
    inner: Wide = sm.submodel(Wide)


class Counter(Graph):
    def __init__(self, dtype):
        self.count = state((2,), dtype, name="count")

    def body(self, x):
        self.count[0] = self.count[0] + x
        return self.count.value


DECLARATIONS = {
    "Model.init": lambda: Wide.init(seed=0),
    "a sub-model": lambda: Holder.init(seed=0),
    "the constructor": lambda: Wide(w=np.zeros(3), n=np.zeros(3, np.int64)),
    "a state": lambda: state((4, 2), jnp.float64, name="total"),
    "a weight by shape": lambda: param((4, 2), jnp.float64),
    "a KVCache": lambda: KVCache(1, 4, 1, 2, jnp.float64),
}


@pytest.mark.parametrize("what", list(DECLARATIONS))
def test_a_64_bit_dtype_without_x64_is_refused_naming_the_tensor_and_the_fix(what):
    with pytest.raises(sm.ShapemlError, match=r"E0004.*float64.*float32") as info:
        DECLARATIONS[what]()
    assert "jax_enable_x64" in str(info.value)


def test_load_of_a_file_declaring_a_64_bit_field_is_refused_without_x64(tmp_path):
    with jax.enable_x64(True):
        m = Wide.init(seed=0)
        sm.save(tmp_path / "w.safetensors", m)
    with pytest.raises(sm.ShapemlError, match=r"E0004.*Wide\.w"):
        sm.load(tmp_path / "w.safetensors", Wide)


def test_with_x64_every_declaration_holds_its_dtype():
    with jax.enable_x64(True):
        m = Holder.init(seed=0)
        assert m.inner.w.dtype == jnp.float64 and m.inner.n.dtype == jnp.int64
        g = Counter(jnp.float64)
        out = g(np.float64(0.5))
        assert out.dtype == jnp.float64 and g.read("count")[0] == 0.5
        assert KVCache(1, 4, 1, 2, jnp.float64).k.dtype == jnp.float64


def test_a_graph_declaring_a_64_bit_state_without_x64_fails_in_its_constructor():
    with pytest.raises(sm.ShapemlError, match="E0004.*state `count`"):
        Counter(jnp.int64)
