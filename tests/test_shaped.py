"""`@sm.shaped` and shape contracts (the Python API and the pytest plugin's fixture)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float, Int, UInt8

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
    assert "x: float32[5 7] where float[b D] with D=8 was expected (dimension D is 7)" in str(
        e.value
    )
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


# --- array-likes ----------------------------------------------------------------------------


@sm.shaped
def scale(x: Float[Array, "*b"], by: Float[Array, ""]) -> Float[Array, "*b"]:
    return x * by


def test_numpy_arrays_of_the_right_shape_and_dtype_kind_are_taken_as_they_are():
    m = Head.init(seed=0)
    x = np.arange(16, dtype=np.float64).reshape(2, 8)
    np.testing.assert_allclose(head(m, x), np.asarray(x, np.float32) @ np.asarray(m.w), rtol=1e-6)
    assert head(m, x.astype(np.float16)).shape == (2, 3)
    assert jax.jit(head)(m, x).shape == (2, 3)
    seen = []

    @sm.shaped
    def keep(x: Float[Array, "b D"], m: Head) -> Float[Array, "b D"]:
        seen.append(type(x))
        return x

    assert keep(x, m) is x and seen == [np.ndarray]  # the value is passed on, not converted
    layer = sm.nn.Linear.init(seed=0, In=8, Out=3)
    np.testing.assert_allclose(layer(x), layer(jnp.asarray(x)), rtol=1e-6)


def test_a_wrong_dtype_kind_or_shape_of_a_numpy_array_is_e1001():
    m = Head.init(seed=0)
    with pytest.raises(sm.ShapeCheckError, match="E1001") as e:
        head(m, np.ones((2, 8), np.int32))
    assert "x: int32[2 8] where float[b D] with D=8 was expected" in str(e.value)
    with pytest.raises(sm.ShapeCheckError) as e:
        head(m, np.ones((2, 3, 8), np.float32))
    assert "x: float32[2 3 8] where float[b D]" in str(e.value)


def test_python_and_numpy_scalars_where_the_annotation_is_a_scalar():
    x = jnp.arange(3.0)
    for by in (2.0, np.float32(2.0), np.float64(2.0), np.array(2.0), jnp.float32(2.0)):
        np.testing.assert_array_equal(scale(x, by), x * 2.0)
    assert float(scale(1.5, 2.0)) == 3.0  # `*b` is empty: a scalar is an array of shape ()
    for wrong, shown in ((2, "int"), (np.int32(2), "int32[]"), (True, "bool")):
        with pytest.raises(sm.ShapeCheckError) as e:
            scale(x, wrong)
        assert f"by: {shown} where float[] was expected" in str(e.value)
    with pytest.raises(sm.ShapeCheckError) as e:
        head(Head.init(seed=0), 1.0)  # a scalar where the annotation has dims
    assert "x: float where float[b D]" in str(e.value)

    @sm.shaped
    def count(n: Int[Array, ""]) -> Int[Array, ""]:
        return n + 1

    assert int(count(3)) == 4 and int(count(np.int64(3))) == 4


def test_array_likes_inside_optional_unions_and_tuples():
    @sm.shaped
    def pair(
        xs: tuple[Float[Array, " b"], Float[Array, " b"]], w: Float[Array, " b"] | None = None
    ):
        return xs[0] + xs[1] if w is None else w

    a = np.ones(3, np.float32)
    assert pair((a, a)).shape == (3,) and pair((a, jnp.ones(3)), w=a) is a
    with pytest.raises(sm.ShapeCheckError) as e:
        pair((a, np.ones(4, np.float32)))
    assert "xs: tuple(float32[3], float32[4]) where tuple[float[b], float[b]]" in str(e.value)
    with pytest.raises(sm.ShapeCheckError) as e:
        pair((a, a), w=np.ones(2, np.float32))
    assert "w: float32[2] where float[b] | None with b=3 was expected (dimension b is 2)" in str(
        e.value
    )


def test_messages_name_shapes_never_values_and_the_annotations_stay_as_written():
    m = Head.init(seed=0)
    with pytest.raises(sm.ShapeCheckError) as e:
        head(m, np.full((2, 7), 12345.678, np.float32))
    assert "12345" not in str(e.value) and "array(" not in str(e.value).lower()
    assert e.value.__cause__ is None and e.value.__suppress_context__
    shown = head.__wrapped__.__annotations__["x"]  # what help() shows
    assert shown.array_type is jax.Array and shown.dim_str == "b D"


def test_a_wrong_return_names_its_shape_and_the_dims_bound_by_the_arguments():
    @sm.shaped
    def wrong(m: Head, x: Float[Array, "b D"]) -> Float[Array, "b C"]:
        return np.asarray(x)  # numpy of [b D]

    with pytest.raises(sm.ShapeCheckError) as e:
        wrong(Head.init(seed=0), np.ones((2, 8), np.float32))
    expected = (
        "returned float32[2 8] where float[b C] with b=2, C=3 was expected (dimension C is 8)"
    )
    assert expected in str(e.value)

    @sm.shaped
    def fine(m: Head, x: Float[Array, "b D"]) -> Float[Array, "b C"]:
        return np.zeros((x.shape[0], 3), np.float32)

    assert fine(Head.init(seed=0), jnp.ones((2, 8))).shape == (2, 3)


def test_a_call_that_does_not_fit_the_signature_shows_the_signature_in_dims():
    with pytest.raises(sm.ShapemlError, match="E1003") as e:
        head(Head.init(seed=0))
    assert "head(m: Head, x: float[b D]) -> float[b C]" in str(e.value)
    assert "jaxtyping" not in str(e.value)


def test_a_contract_at_other_dims_resizes_the_model():
    records = sm.testing.check_contract(head, Head, dims={"D": 5}, sizes={"b": [2]})
    assert records == [{"sizes": {"b": 2}, "out": (2, 3)}]
    resized = sm.testing.check_contract(head, Head.init(seed=0), dims={"D": 5, "C": 7})
    assert [r["out"] for r in resized] == [(1, 7), (3, 7)]

    class Tied(sm.Model):
        dims = sm.Dims(D=4, H="2 * D")
        w: Float[Array, "D H"] = sm.param(sm.zeros)

    @sm.shaped
    def up(m: Tied, x: Float[Array, "b D"]) -> Float[Array, "b H"]:
        return x @ m.w

    assert sm.testing.check_contract(up, Tied, dims={"D": 3})[0]["out"] == (1, 6)
    with pytest.raises(AssertionError, match="E1002") as e:
        sm.testing.check_contract(up, Tied, dims={"H": 5})
    assert "H = 2 * D = 8" in str(e.value) and "D=4" in str(e.value)
