"""`@sm.shaped` and shape contracts (the Python API and the pytest plugin's fixture)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float, UInt8

import shapeml as sm
from shapeml.zoo.spotter import Spotter, forward


class Head(sm.Model):
    dims = sm.Dims(D=8, C=3)
    w: Float[Array, "D C"] = sm.param(sm.normal(std=0.1))


@sm.shaped
def head(m: Head, x: Float[Array, "b D"]) -> Float[Array, "b C"]:
    return x @ m.w


def test_model_dims_are_bound():
    m = Head.init(seed=0)
    assert head(m, jnp.ones((5, 8))).shape == (5, 3)
    with pytest.raises(TypeError, match="E1001") as e:
        head(m, jnp.ones((5, 7)))  # D is 8 in the model
    assert "dimension D is 7" in str(e.value) and "'D': 8" in str(e.value)
    wide = Head.init(seed=0, D=7)
    assert head(wide, jnp.ones((2, 7))).shape == (2, 3)


def test_return_annotation_is_checked():
    @sm.shaped
    def wrong(m: Head, x: Float[Array, "b D"]) -> Float[Array, "b C"]:
        return x

    with pytest.raises(sm.ShapemlError, match="E1001"):
        wrong(Head.init(), jnp.ones((2, 8)))


def test_check_runs_at_trace_time_only():
    m = Head.init(seed=0)
    traces = []

    @sm.shaped
    def f(m: Head, x: Float[Array, "b D"]) -> Float[Array, "b C"]:
        traces.append(1)
        return x @ m.w

    jf = jax.jit(f)
    for _ in range(3):
        jf(m, jnp.ones((4, 8)))
    assert len(traces) == 1
    with pytest.raises(sm.ShapemlError, match="E1001"):
        jf(m, jnp.ones((4, 6)))  # a new shape retraces, and the check catches it


def test_contract_holds_for_spotter_over_concrete_and_symbolic_batches():
    records = sm.testing.check_contract(forward, Spotter, sizes={"b": [1, 7, "b"]})
    assert [r["out"] for r in records[:2]] == [(1, 4), (7, 4)]
    assert str(records[2]["out"][0]) == "b"


def test_contract_catches_a_wrong_annotation():
    @sm.shaped
    def pool(m: Spotter, img: UInt8[Array, "b 1 S S"]) -> Float[Array, "b D"]:
        return forward(m, img)  # returns [b C], not [b D]

    with pytest.raises(AssertionError, match="E1002") as e:
        sm.testing.check_contract(pool, Spotter, sizes={"b": [2]})
    assert "breaks at b=2" in str(e.value) and "dimension D" in str(e.value)


def test_contract_needs_every_size():
    with pytest.raises(sm.ShapemlError, match="E1002") as e:
        sm.testing.check_contract(head, Head, sizes={"n": [1]})
    assert "no size is given for `b`" in str(e.value)


def test_plugin_fixture(shape_contract):
    assert shape_contract(head, Head.init(seed=0, D=5), sizes={"b": [3]})[0]["out"] == (3, 3)


def test_shaped_model_results_match_undecorated():
    m = Head.init(seed=1)
    x = jnp.arange(16.0).reshape(2, 8)
    np.testing.assert_array_equal(head(m, x), x @ m.w)


def test_contract_reports_a_body_that_fails_on_annotated_shapes():
    @sm.shaped
    def bad(m: Head, x: Float[Array, "b D"]) -> Float[Array, "b C"]:
        return x @ m.w.T  # [b D] @ [C D]: the body cannot run on these shapes

    with pytest.raises(AssertionError, match="E1002") as e:
        sm.testing.check_contract(bad, Head, sizes={"b": [2]})
    assert (
        "`test_contract_reports_a_body_that_fails_on_annotated_shapes.<locals>.bad` fails at b=2"
        in str(e.value)
    )


def test_library_functions_check_model_dims_under_the_jaxtyping_hook():
    # The suite runs with jaxtyping's import hook on shapeml, which wraps every function of the
    # package in its own shape memo; `sm.shaped` must still bind the model's dims (S=16 here).
    from shapeml.zoo import spotter

    m = spotter.Spotter.init(seed=0)
    with pytest.raises(sm.ShapemlError, match="E1001"):
        spotter.forward(m, jnp.zeros((2, 1, 8, 8), jnp.uint8))
