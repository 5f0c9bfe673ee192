"""Dead-param analysis (W1101 / E1101): params named by their path in nested models, and the
analysis riding on the one trace of the loss that differentiation makes. (tests/test_grad.py
covers the analysis through control flow, stop_gradient and the Spotter.)"""

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest
from jaxtyping import Array, Float

import shapeml as sm


class Block(sm.Model):
    dims = sm.Dims(D=4, F=6)
    w1: Float[Array, "D F"] = sm.param(sm.normal(std=0.3))
    scale: Float[Array, " F"] = sm.buffer(sm.ones)  # a buffer between params: never named
    w2: Float[Array, "F D"] = sm.param(sm.normal(std=0.3))


class Stage(sm.Model):
    dims = sm.Dims(D=4, F=6, L=2)
    blocks: tuple[Block, ...] = sm.submodels(Block, "L")
    gain: Float[Array, " D"] = sm.param(sm.ones)


class Net(sm.Model):
    dims = sm.Dims(D=4, F=6, L=2, S=2)
    emb: Float[Array, "D D"] = sm.param(sm.normal(std=0.3))
    stages: tuple[Stage, ...] = sm.submodels(Stage, "S")
    head: Block = sm.submodel(Block)


def block(b: Block, x, skip_w2: bool = False):
    h = jnp.tanh(x @ b.w1 * b.scale[None])
    # Without w2 the block still reads w1 (only w2 is forgotten).
    return x + jnp.mean(h, axis=-1, keepdims=True) if skip_w2 else x + h @ b.w2


def make_loss(forgotten: tuple[int, int] | None):
    """A loss over every param, except `w2` of block `forgotten = (stage, block)`."""

    def loss(m: Net, x):
        x = x @ m.emb
        for i, stage in enumerate(m.stages):
            for j, b in enumerate(stage.blocks):
                x = block(b, x, skip_w2=(i, j) == forgotten)
            x = x * stage.gain[None]
        return jnp.mean(block(m.head, x) ** 2)

    return loss


@pytest.fixture
def x():
    return jax.random.normal(jax.random.key(1), (3, 4))


@pytest.mark.parametrize("forgotten", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_a_dead_param_deep_inside_is_named_by_its_dotted_path(forgotten, x):
    m = Net.init(seed=0)
    with pytest.warns(sm.DeadParamWarning) as record:
        sm.value_and_grad(make_loss(forgotten), m, x)
    name = "stages.{}.blocks.{}.w2".format(*forgotten)
    assert [str(w.message).split("`")[3] for w in record] == [name]
    assert name in sm.params(m)  # the same dotted name as sm.params gives it
    assert f"never reads the param `{name}` of `Net`" in str(record[0].message)


def test_every_param_read_no_warning_and_names_match_sm_params(x):
    m = Net.init(seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sm.value_and_grad(make_loss(None), m, x)
    with pytest.raises(sm.ShapemlError, match="E1101") as e:
        sm.value_and_grad(lambda m, x: jnp.mean(x * m.head.scale[0]), m, x)
    # Every param by dotted name, in the order sm.params gives (buffers such as `scale` absent).
    assert f"params ({', '.join(sm.params(m))}), so" in str(e.value)
    assert "stages.1.blocks.0.w1" in str(e.value)


def test_the_analysis_rides_on_the_one_trace_of_the_loss(x):
    m, loss = Net.init(seed=0), make_loss(None)
    traces = []

    def counted(m, x):
        traces.append(x.shape)
        return loss(m, x)

    step = jax.jit(lambda m, x: sm.value_and_grad(counted, m, x))
    for _ in range(3):
        step(m, x)
    assert traces == [(3, 4)]  # one trace, analysis included; no retrace on the later calls
    sm.value_and_grad(counted, m, x)  # an eager call runs the loss once, analysis included
    assert traces == [(3, 4)] * 2
    step(m, x[:1])  # a new shape: one new trace
    assert traces == [(3, 4)] * 2 + [(1, 4)]
    # as many traces of the loss as jax.value_and_grad makes for the same calls
    plain = []
    params, rest = eqx.partition(m, eqx.is_inexact_array)
    jax_step = jax.jit(
        jax.value_and_grad(lambda p, x: plain.append(x.shape) or loss(eqx.combine(p, rest), x))
    )
    for _ in range(3):
        jax_step(params, x)
    assert len(plain) == 1


def test_unhashable_static_arguments_need_no_key(x):
    class Config:  # unhashable: it defines __eq__ without __hash__
        def __init__(self, p):
            self.p = p

        def __eq__(self, other):
            return isinstance(other, Config) and other.p == self.p

    m, loss = Net.init(seed=0), make_loss((1, 1))

    def configured(m, x, config):
        return loss(m, x) * config.p

    for _ in range(2):
        with pytest.warns(sm.DeadParamWarning, match="stages.1.blocks.1.w2"):
            sm.value_and_grad(configured, m, x, Config(2.0))
