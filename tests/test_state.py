"""shapeml.state: Graph, param, state, KVCache, the reference path, index safety, donation."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float

import shapeml as sm
from shapeml.state import (
    Graph,
    GraphDeclarationError,
    KVCache,
    LoadStateDictError,
    StateIndexError,
    StateIndexTypeError,
    StateNotFoundError,
    StateWriteError,
    UnboundParamError,
    WeightWriteError,
    param,
    span,
    state,
)

WIDTH = 4
# What a failing eqx.error_if raises: from a compiled program (the type varies by backend), or from
# eager vmap, where equinox raises its own.
RUNTIME_ERRORS = (jax.errors.JaxRuntimeError, ValueError, eqx.EquinoxRuntimeError)


def _load_example():
    path = Path(__file__).resolve().parents[1] / "examples" / "weights_and_state.py"
    spec = importlib.util.spec_from_file_location("weights_and_state", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXAMPLE = _load_example()
Scale = EXAMPLE.Scale  # the seed's weight graph, as the runnable example writes it


def test_the_runnable_example_checks_itself_against_numpy(capsys):
    EXAMPLE.main()
    out = capsys.readouterr().out
    assert "Scale matches numpy" in out and "(1 compile)" in out and "pos=4 is refused" in out


class Accumulate(Graph):
    """Adds `x` into row `pos` of a running total and returns the new row."""

    def __init__(self, rows, width, dtype=jnp.float32):
        self.total = state((rows, width), dtype, name="total")
        self.traces = 0

    def body(self, x, *, pos):
        self.traces += 1
        new = x + self.total[pos]
        self.total[pos] = new
        return new


class TwoWrites(Graph):
    """Writes row `pos` and row `pos + 1` (an index computed inside the program) and counts."""

    def __init__(self, rows):
        self.total = state((rows, WIDTH), name="total")
        self.calls = state((1,), jnp.int32, name="calls")

    def body(self, x, *, pos):
        self.calls[0] = self.calls[0] + 1
        self.total[pos] = x
        self.total[pos + 1] = x * 2
        return self.total[pos + 1]


def _rows(rng, n, dtype=np.float32):
    if np.dtype(dtype).kind == "i":
        return rng.integers(-100, 100, (n, WIDTH)).astype(dtype)
    return rng.standard_normal((n, WIDTH)).astype(dtype)


def test_scale_matches_numpy_and_uploads_the_weight_once():
    rng = np.random.default_rng(0)
    w = rng.standard_normal(WIDTH).astype(np.float32)
    g = Scale(w)
    for x in _rows(rng, 20):
        np.testing.assert_allclose(np.asarray(g(x)), x * w, rtol=1e-6)
        np.testing.assert_allclose(g.reference(x), x * w, rtol=1e-6)
        if g.compile_count == 1 and not hasattr(g, "uploaded"):
            g.uploaded = g.weight.device
        assert g.weight.device is g.uploaded  # the same device array, never re-uploaded
    assert g.compile_count == 1
    np.testing.assert_array_equal(g.weight.host, w)


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_accumulate_matches_numpy_at_many_positions_without_recompiling(dtype):
    rng = np.random.default_rng(1)
    g = Accumulate(16, WIDTH, dtype)
    expect = np.zeros((16, WIDTH), dtype)
    xs = _rows(rng, 40, dtype)
    for x, pos in zip(xs, rng.integers(0, 16, 40)):
        expect[pos] += x
        got = g(x, pos=int(pos))
        np.testing.assert_allclose(np.asarray(got), expect[pos], rtol=1e-6)
    np.testing.assert_allclose(g.read("total"), expect, rtol=1e-6)
    assert g.compile_count == 1
    assert g.traces == 1


def test_seed_walkthrough_same_row_twice_then_other_rows():
    g = Accumulate(8, WIDTH)
    x = np.arange(WIDTH, dtype=np.float32)
    acc = np.zeros((8, WIDTH), np.float32)
    for pos in (0, 0, 2, 5):
        acc[pos] += x
        np.testing.assert_array_equal(np.asarray(g(x, pos=pos)), acc[pos])
    np.testing.assert_array_equal(g.total.read(), acc)
    assert g.compile_count == 1


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_reference_agrees_with_compiled(dtype):
    rng = np.random.default_rng(2)
    g = Accumulate(16, WIDTH, dtype)
    for x, pos in zip(_rows(rng, 25, dtype), rng.integers(0, 16, 25)):
        compiled = np.asarray(g(x, pos=pos))
        eager = g.reference(x, pos=pos)
        if np.dtype(dtype).kind == "i":
            np.testing.assert_array_equal(eager, compiled)
        else:
            np.testing.assert_allclose(eager, compiled, rtol=1e-6)
    if np.dtype(dtype).kind == "i":
        np.testing.assert_array_equal(g.total.host, g.read("total"))
    else:
        np.testing.assert_allclose(g.total.host, g.read("total"), rtol=1e-6)
    assert g.compile_count == 1  # reference never compiles


def test_reference_runs_eagerly_and_mirrors_the_state_separately():
    seen = []

    class Spy(Accumulate):
        def body(self, x, *, pos):
            seen.append(isinstance(x, jax.core.Tracer))
            return super().body(x, pos=pos)

    g = Spy(4, WIDTH)
    x = np.ones(WIDTH, np.float32)
    g.reference(x, pos=1)
    g.reference(x, pos=1)
    assert seen == [False, False]
    assert g.compile_count == 0 and g._shell is None  # nothing uploaded or allocated on the device
    np.testing.assert_array_equal(g.total.host[1], 2 * x)
    np.testing.assert_array_equal(g.read("total"), np.zeros((4, WIDTH)))  # device state untouched


@pytest.mark.parametrize("pos", [16, 17, 1000, -1])
@pytest.mark.parametrize("path", ["compiled", "reference"])
def test_out_of_range_index_raises_naming_state_size_and_index(pos, path):
    g = Accumulate(16, WIDTH)
    x = np.ones(WIDTH, np.float32)
    g(x, pos=3)
    g.reference(x, pos=3)
    before, before_host = g.read("total"), g.total.host
    run = g if path == "compiled" else g.reference
    with pytest.raises(StateIndexError) as info:
        run(x, pos=pos)
    msg = str(info.value)
    assert "`total`" in msg and "size 16" in msg and f"index {pos} " in msg and "E1401" in msg
    np.testing.assert_array_equal(g.read("total"), before)
    np.testing.assert_array_equal(g.total.host, before_host)
    assert isinstance(info.value, IndexError)


def test_computed_index_out_of_range_raises_before_the_step_and_changes_nothing():
    g = TwoWrites(8)
    x = np.ones(WIDTH, np.float32)
    np.testing.assert_array_equal(np.asarray(g(x, pos=6)), 2 * x)  # rows 6 and 7
    before = g.read("total")
    with pytest.raises(StateIndexError, match=r"`total`.*size 8.*index 8"):
        g(x * 5, pos=7)  # pos + 1 == 8: JAX would clamp it to row 7
    np.testing.assert_array_equal(g.read("total"), before)  # not even row 7 changed
    np.testing.assert_array_equal(
        g.read("calls"), [1]
    )  # the other state's write did not happen either
    with pytest.raises(StateIndexError, match="index 8"):
        g.reference(x * 5, pos=7)
    np.testing.assert_array_equal(g.total.host, np.zeros((8, WIDTH)))
    assert g.compile_count == 1


def test_wrong_shape_and_dtype_writes_raise_at_trace_time_naming_the_state():
    class BadShape(Accumulate):
        def body(self, x, *, pos):
            self.total[pos] = jnp.concatenate([x, x])

    class BadDtype(Accumulate):
        def body(self, x, *, pos):
            self.total[pos] = x.astype(jnp.int32)

    x = np.ones(WIDTH, np.float32)
    with pytest.raises(StateWriteError, match=r"`total`.*shape \(4,\).*shape \(8,\)"):
        BadShape(4, WIDTH)(x, pos=0)
    with pytest.raises(StateWriteError, match=r"`total`.*float32.*int32"):
        BadDtype(4, WIDTH)(x, pos=0)
    with pytest.raises(StateWriteError, match="`total`"):
        BadShape(4, WIDTH).reference(x, pos=0)


def test_invalid_indices_are_type_errors():
    class FloatIndex(Accumulate):
        def body(self, x, *, pos):
            return self.total[pos * 0.5]

    with pytest.raises(StateIndexTypeError, match="`total`"):
        FloatIndex(4, WIDTH)(np.ones(WIDTH, np.float32), pos=1)
    with pytest.raises(StateIndexTypeError, match="integer scalar"):
        Accumulate(4, WIDTH)(np.ones(WIDTH, np.float32), pos=np.arange(2))


def test_state_survives_calls_and_reset_zeroes_it():
    g = TwoWrites(8)
    x = np.ones(WIDTH, np.float32)
    g(x, pos=0)
    g(x, pos=4)
    g.reference(x, pos=2)
    np.testing.assert_array_equal(g.read("calls"), [2])
    g.reset("calls")
    np.testing.assert_array_equal(g.read("calls"), [0])
    assert g.read("total")[5, 0] == 2
    g.reset()
    np.testing.assert_array_equal(g.read("total"), np.zeros((8, WIDTH)))
    np.testing.assert_array_equal(g.total.host, np.zeros((8, WIDTH)))
    g(x, pos=1)
    np.testing.assert_array_equal(g.read("calls"), [1])
    assert g.compile_count == 1


def test_state_is_updated_in_place_through_donation():
    g = Accumulate(1024, WIDTH)
    x = np.ones(WIDTH, np.float32)
    g(x, pos=0)
    old = g.total.device
    pointer = old.unsafe_buffer_pointer()
    for pos in range(5):
        g(x, pos=pos)
        assert g.total.device.unsafe_buffer_pointer() == pointer
    assert old.is_deleted()


def test_read_returns_a_copy_that_later_calls_do_not_change():
    g = Accumulate(4, WIDTH)
    x = np.ones(WIDTH, np.float32)
    g(x, pos=0)
    snapshot = g.read("total")
    g(x, pos=0)
    np.testing.assert_array_equal(snapshot[0], x)
    np.testing.assert_array_equal(g.read("total")[0], 2 * x)


def test_unknown_names_suggest_the_near_miss():
    g = Accumulate(4, WIDTH)
    with pytest.raises(StateNotFoundError, match="similar name exists: `total`"):
        g.read("totl")
    with pytest.raises(AttributeError, match="`total`"):
        _ = g.totl


def test_whole_state_assignment_set_and_span():
    class Window(Graph):
        def __init__(self):
            self.buf = state((8, 2), name="buf")
            self.last = state((2,), name="last")

        def body(self, x, *, pos):
            self.buf[span(pos, 3)] = x
            self.last = x[-1]
            self.buf.set(self.buf.value * 2)
            return self.buf[span(pos, 3)]

    g = Window()
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.testing.assert_array_equal(np.asarray(g(x, pos=2)), 2 * x)
    expect = np.zeros((8, 2), np.float32)
    expect[2:5] = 2 * x
    np.testing.assert_array_equal(g.read("buf"), expect)
    np.testing.assert_array_equal(g.read("last"), x[-1])
    with pytest.raises(StateIndexError, match=r"span of 3 starting at 6 "):
        g(x, pos=6)
    np.testing.assert_array_equal(g.reference(x, pos=2), 2 * x)


def test_weights_are_read_only_and_declarations_close_at_first_call():
    class Writes(Scale):
        def body(self, x):
            self.weight = x
            return x

    g = Writes(np.ones(WIDTH, np.float32))
    with pytest.raises(WeightWriteError, match="`weight`"):
        g(np.ones(WIDTH, np.float32))
    h = Accumulate(4, WIDTH)
    h(np.ones(WIDTH, np.float32), pos=0)
    with pytest.raises(GraphDeclarationError, match="after the graph was first called"):
        h.extra = state((2,))
    with pytest.raises(GraphDeclarationError, match="cannot be reassigned"):
        h.total = np.zeros((4, WIDTH))


class Linear(Graph):
    """`x @ w + b` with both weights declared by shape and bound by `load_state_dict`."""

    def __init__(self):
        self.w = param((3, 2))
        self.b = param((2,))

    def body(self, x):
        return x @ self.w + self.b


def test_load_state_dict_binds_weights_declared_by_shape():
    g = Linear()
    with pytest.raises(UnboundParamError, match="`w`"):
        g(np.ones(3, np.float32))
    rng = np.random.default_rng(3)
    w, b = rng.standard_normal((3, 2)), rng.standard_normal(2)
    g.load_state_dict({"w": w, "b": b})  # float64 is cast to the declared float32
    x = rng.standard_normal(3).astype(np.float32)
    np.testing.assert_allclose(np.asarray(g(x)), x @ w + b, rtol=1e-5)
    g.load_state_dict({"w": 2 * w, "b": b})
    np.testing.assert_allclose(np.asarray(g(x)), x @ (2 * w) + b, rtol=1e-5)
    assert g.compile_count == 1
    assert set(g.state_dict()) == {"w", "b"}


def test_load_state_dict_lists_every_problem_at_once_and_loads_nothing():
    g = Linear()
    g.load_state_dict({"w": np.ones((3, 2)), "b": np.ones(2)})
    with pytest.raises(LoadStateDictError) as info:
        g.load_state_dict({"W": np.zeros((3, 2)), "b": np.zeros(3), "bias": np.zeros(2)})
    msg = str(info.value)
    assert "missing weight `w`" in msg
    assert "unexpected key `W`" in msg and "similar name exists: `w`" in msg
    assert "unexpected key `bias`" in msg
    assert "`b` has shape (3,), expected (2,)" in msg
    assert "4 problem" in msg
    np.testing.assert_array_equal(g.state_dict()["b"], np.ones(2))  # nothing was loaded
    with pytest.raises(LoadStateDictError, match="another kind"):
        g.load_state_dict({"w": np.ones((3, 2)), "b": np.array([True, False])})


class Net(sm.Model):
    dims = sm.Dims(D=4, F=6)
    w1: Float[Array, "D F"] = sm.param(sm.normal(std=0.5))
    w2: Float[Array, "F D"] = sm.param(sm.normal(std=0.5))


class ModelGraph(Graph):
    def __init__(self, model):
        self.model = param(model)

    def body(self, x):
        return jax.nn.relu(x @ self.model.w1) @ self.model.w2


def test_an_sm_model_serves_as_the_graph_weights():
    m = Net.init(seed=0)
    g = ModelGraph(m)
    x = np.random.default_rng(4).standard_normal((2, 4)).astype(np.float32)
    w1, w2 = np.asarray(m.w1), np.asarray(m.w2)
    expect = np.maximum(x @ w1, 0) @ w2
    np.testing.assert_allclose(np.asarray(g(x)), expect, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g.reference(x), expect, rtol=1e-5, atol=1e-6)
    assert set(g.state_dict()) == {"model.w1", "model.w2"}
    g.load_state_dict({"model.w1": -w1, "model.w2": w2})
    np.testing.assert_allclose(np.asarray(g(x)), np.maximum(x @ -w1, 0) @ w2, rtol=1e-5, atol=1e-6)
    assert g.compile_count == 1
    with pytest.raises(LoadStateDictError, match="similar name exists: `model.w1`"):
        g.load_state_dict({"model.w_1": w1, "model.w2": w2})


def test_kvcache_write_and_read_match_numpy():
    rng = np.random.default_rng(5)
    cache = KVCache(layers=2, ctx=6, heads=2, head_dim=3, batch=2)
    ref_k = np.zeros((2, 2, 6, 2, 3), np.float32)
    ref_v = np.zeros_like(ref_k)
    write = jax.jit(lambda c, layer, p, k, v: c.write(layer, p, k, v), static_argnums=1)
    for layer, pos in [(0, 0), (1, 0), (0, 1), (0, 2), (1, 5)]:
        k = rng.standard_normal((2, 2, 3)).astype(np.float32)
        v = rng.standard_normal((2, 2, 3)).astype(np.float32)
        cache = write(cache, layer, pos, jnp.asarray(k), jnp.asarray(v))
        ref_k[layer, :, pos], ref_v[layer, :, pos] = k, v
    np.testing.assert_array_equal(np.asarray(cache.k), ref_k)
    np.testing.assert_array_equal(np.asarray(cache.v), ref_v)
    keys, values, mask = cache.read(0, 2)
    np.testing.assert_array_equal(np.asarray(keys), ref_k[0])
    np.testing.assert_array_equal(np.asarray(values), ref_v[0])
    np.testing.assert_array_equal(np.asarray(mask), [[True, True, True, False, False, False]])
    span_k = jnp.asarray(rng.standard_normal((2, 3, 2, 3)), jnp.float32)
    cache = cache.write(1, 1, span_k, span_k)  # three positions at once (a prefill)
    np.testing.assert_array_equal(np.asarray(cache.k[1, :, 1:4]), span_k)
    np.testing.assert_array_equal(
        np.asarray(cache.mask(1, 3)), np.arange(6)[None] <= 1 + np.arange(3)[:, None]
    )


def test_kvcache_refuses_bad_positions_and_shapes():
    cache = KVCache(layers=1, ctx=4, heads=1, head_dim=2)
    kv = jnp.ones((1, 1, 2))
    for pos in (4, -1):
        with pytest.raises(StateIndexError, match=r"KVCache positions.*size 4"):
            cache.write(0, pos, kv, kv)
    with pytest.raises(StateIndexError, match="KVCache layers"):
        cache.write(1, 0, kv, kv)
    with pytest.raises(StateWriteError, match="heads=1"):
        cache.write(0, 0, jnp.ones((1, 2, 2)), jnp.ones((1, 2, 2)))
    with pytest.raises(StateWriteError, match="float32"):
        cache.write(0, 0, kv.astype(jnp.float16), kv.astype(jnp.float16))
    # Inside a plain jit the position is traced: the program fails instead of clamping.
    write = jax.jit(lambda c, p: c.write(0, p, kv, kv).k)
    np.testing.assert_array_equal(np.asarray(write(cache, 3))[0, 0, :, 0, 0], [0, 0, 0, 1])
    with pytest.raises(RUNTIME_ERRORS, match="E1401"):
        jax.block_until_ready(write(cache, 4))
    # Under vmap every position is checked on its own: in-range ones pass, and none is clamped.
    written = jax.jit(jax.vmap(lambda p: cache.write(0, p, kv, kv).k))(jnp.arange(4))
    np.testing.assert_array_equal(np.asarray(written)[:, 0, 0, :, 0, 0], np.eye(4))


def test_kvcache_as_graph_state_counts_positions_without_recompiling():
    class Echo(Graph):
        def __init__(self):
            self.cache = state(KVCache(1, 5, 1, 2, name="cache"), name="cache")

        def body(self, k, *, pos):
            self.cache = self.cache.write(0, pos, k, -k)
            keys, _, mask = self.cache.read(0, pos)
            return jnp.sum(jnp.where(mask[0][None, :, None, None], keys, 0.0))

    g = Echo()
    k = np.ones((1, 1, 2), np.float32)
    assert [float(g(k * (p + 1), pos=p)) for p in range(5)] == [2, 6, 12, 20, 30]
    assert g.compile_count == 1
    cache = g.read("cache")
    np.testing.assert_array_equal(cache.v[0, 0, :, 0, 0], -np.arange(1, 6))
    with pytest.raises(StateIndexError, match="cache positions.*index 5 "):
        g(k, pos=5)
    np.testing.assert_array_equal(g.read("cache").k, cache.k)
    assert float(g.reference(k, pos=0)) == 2
    assert set(g.state_dict()) == {"cache.k", "cache.v"}


def test_read_only_state_and_traced_calls():
    class Peek(Graph):
        def __init__(self):
            self.table = state((4, 2), name="table")

        def body(self, *, pos):
            return self.table[pos]

    g = Peek()
    g.load_state_dict({"table": np.arange(8).reshape(4, 2)})  # a state may be loaded too
    pointer = g.table.device.unsafe_buffer_pointer()
    np.testing.assert_array_equal(np.asarray(g(pos=2)), [4, 5])
    np.testing.assert_array_equal(g.reference(pos=3), [6, 7])
    assert g.table.device.unsafe_buffer_pointer() == pointer
    with pytest.raises(sm.state.GraphInputError, match="traced inputs"):
        jax.jit(lambda p: g(pos=p))(1)
    assert "clamps" in sm.explain("E1401").explanation


def test_missing_body_and_bad_declarations_are_explained():
    class NoBody(Graph):
        def __init__(self):
            self.total = state((2, 2))

    with pytest.raises(sm.state.GraphBodyError, match="does not define body"):
        NoBody()(pos=0)
    with pytest.raises(GraphDeclarationError, match="not a tuple of non-negative ints"):
        state((2, -1))

    class Twice(Graph):
        def __init__(self):
            self.a = state((2,), name="x")
            self.b = state((2,), name="x")

    with pytest.raises(GraphDeclarationError, match="declares the name `x` twice"):
        Twice()


# --- the redesign's contracts: state as an sm.Model, one trace, checks the same everywhere ------


class Decoder(Graph):
    """An array state, a span write and a KVCache state: every kind a graph's states can be."""

    def __init__(self, ctx=6):
        self.total = state((ctx, WIDTH), name="total")
        self.steps = state((), jnp.int32, name="steps")
        self.cache = state(KVCache(1, ctx, 1, WIDTH, name="cache"), name="cache")

    def body(self, x, *, pos):
        self.total[span(pos, 2)] = jnp.stack([x, -x])
        self.steps = self.steps.value + 1
        self.cache = self.cache.write(0, pos, x.reshape(1, 1, WIDTH), 2 * x.reshape(1, 1, WIDTH))
        return self.total[pos + 1]


def test_a_graphs_states_are_an_sm_model_saved_and_loaded_with_sm_save(tmp_path):
    g = Decoder()
    x = np.arange(WIDTH, dtype=np.float32)
    for pos in (0, 2, 4):
        g(x + pos, pos=pos)
    states = g.states
    assert isinstance(states, sm.Model) and type(states).__name__ == "DecoderState"
    assert (
        set(sm.buffers(states)) == set(g.state_dict()) == {"total", "steps", "cache.k", "cache.v"}
    )
    assert sm.params(states) == {}  # states are buffers: no optimizer would ever touch them
    path = sm.save(tmp_path / "decoder.safetensors", states)

    fresh = Decoder()
    fresh.load_states(sm.load(path, like=fresh.states))
    for name in ("total", "steps"):
        np.testing.assert_array_equal(fresh.read(name), g.read(name))
    np.testing.assert_array_equal(fresh.read("cache").v, g.read("cache").v)
    np.testing.assert_array_equal(np.asarray(fresh(x, pos=1)), -x)  # it runs on from there
    assert int(fresh.read("steps")) == 4
    again = sm.load(path, type(g.states))  # the class works as well as a template
    np.testing.assert_array_equal(np.asarray(again.total), g.read("total"))


def test_states_is_a_snapshot_and_load_states_checks_every_buffer(tmp_path):
    g = Decoder()
    x = np.ones(WIDTH, np.float32)
    g(x, pos=0)
    snapshot = g.states
    g(x, pos=3)  # donates the live buffers; the snapshot holds copies
    np.testing.assert_array_equal(np.asarray(snapshot.total)[3], np.zeros(WIDTH))
    with pytest.raises(LoadStateDictError, match=r"`total` has shape \(8, 4\), expected \(6, 4\)"):
        g.load_states(Decoder(ctx=8).states)
    np.testing.assert_array_equal(g.read("total")[3], x)  # nothing was loaded
    with pytest.raises(LoadStateDictError, match="Model"):
        g.load_states(g.state_dict())  # a dict is for load_state_dict


def test_the_body_is_traced_once_even_with_checks_computed_inside_it():
    traces = []

    class Counted(TwoWrites):
        def body(self, x, *, pos):
            traces.append(pos)
            return super().body(x, pos=pos)

    g = Counted(8)
    x = np.ones(WIDTH, np.float32)
    for pos in range(7):
        g(x, pos=pos)
    with pytest.raises(StateIndexError):
        g(x, pos=7)
    assert len(traces) == 1 and g.compile_count == 1


@pytest.mark.parametrize("pos", [5, 6, -1])
def test_a_bad_index_anywhere_in_the_body_leaves_every_state_unchanged(pos):
    g = Decoder()
    x = np.ones(WIDTH, np.float32)
    g(x, pos=0)
    g(2 * x, pos=3)
    before = g.state_dict()
    pointer = g.total.device.unsafe_buffer_pointer()
    with pytest.raises(StateIndexError, match=rf"(index|starting at) {pos} "):
        g(5 * x, pos=pos)  # span(pos, 2), the cache write or pos + 1: one of them fails
    after = g.state_dict()
    for name in before:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    assert g.total.device.unsafe_buffer_pointer() == pointer  # still updated in place
    np.testing.assert_array_equal(np.asarray(g(x, pos=4)), -x)


def _mixed_body(self, a, b, *, i, j):
    """Overlapping span writes, then reads that straddle them, in a 2-D state."""
    self.grid[span(i, 3), span(j, 2)] = a
    self.grid[i + 1, span(j + 1, 2)] = b
    seen = self.grid[span(i, 4), span(j, 3)]
    self.grid[i + 3, j] = jnp.sum(seen)
    return seen, self.grid[span(i, 2), :]


class Grid(Graph):
    def __init__(self):
        self.grid = state((9, 7), name="grid")

    body = _mixed_body


def _numpy_mixed(grid, a, b, i, j):
    grid[i : i + 3, j : j + 2] = a
    grid[i + 1, j + 1 : j + 3] = b
    seen = grid[i : i + 4, j : j + 3].copy()
    grid[i + 3, j] = seen.sum()
    return seen, grid[i : i + 2].copy()


def test_reads_see_the_bodys_earlier_writes_like_numpy_in_both_paths():
    rng = np.random.default_rng(6)
    g = Grid()
    expect = np.zeros((9, 7), np.float32)
    for _ in range(12):
        a = rng.standard_normal((3, 2)).astype(np.float32)
        b = rng.standard_normal(2).astype(np.float32)
        i, j = int(rng.integers(0, 6)), int(rng.integers(0, 5))
        want = _numpy_mixed(expect, a, b, i, j)
        got = g(a, b, i=i, j=j)
        ref = g.reference(a, b, i=i, j=j)
        for w, c, r in zip(want, got, ref, strict=True):
            np.testing.assert_allclose(np.asarray(c), w, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(r, w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g.read("grid"), expect, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g.grid.host, expect, rtol=1e-5, atol=1e-5)
    assert g.compile_count == 1


def _write_at(p):
    cache = KVCache(layers=1, ctx=4, heads=1, head_dim=2)
    return cache.write(0, p, jnp.ones((1, 1, 2)), jnp.ones((1, 1, 2))).k


def _check_rows(p):
    return sm.state.check_index(p, 4, what="rows", extent=2)


CONTEXTS = {  # name: (function, an index in range, one out of range)
    "python": (lambda p: _write_at(int(p)), 3, 4),
    "jit": (jax.jit(_write_at), 3, 4),
    "vmap": (jax.vmap(_write_at), jnp.asarray([0, 3]), jnp.asarray([0, 4])),
    "jit_of_vmap": (jax.jit(jax.vmap(_write_at)), jnp.asarray([1, 2]), jnp.asarray([-1, 2])),
    "check_index_jit": (jax.jit(_check_rows), 2, 3),
    "check_index_vmap": (jax.vmap(_check_rows), jnp.asarray([2, 0]), jnp.asarray([2, 7])),
}


@pytest.mark.parametrize("context", list(CONTEXTS))
def test_an_out_of_range_index_is_the_same_error_in_every_context(context):
    run, ok, bad = CONTEXTS[context]
    jax.block_until_ready(run(ok))  # in range: no error
    if context == "python":
        with pytest.raises(StateIndexError, match=r"\[E1401\].*KVCache positions.*size 4"):
            run(bad)
    else:  # traced: eqx.error_if fails the computation, with the same code and names
        with pytest.raises(RUNTIME_ERRORS, match=r"\[E1401\] (KVCache positions|rows)"):
            jax.block_until_ready(run(bad))


def test_index_checks_given_at_the_call_site_are_recorded_not_raised():
    def recorded_ok(p):
        checks = sm.state.IndexChecks([("p", p)])
        sm.state.check_index(p, 8, what="rows", checks=checks)
        assert [c.source for c in checks.entries] == ["p"]  # named after the input it came from
        return checks.entries[0].ok

    recorded = jax.jit(recorded_ok)
    assert bool(recorded(3)) and not bool(recorded(8))  # a value to act on, not an error
    checks = sm.state.IndexChecks([("p", 9)])
    assert sm.state.check_index(np.int32(2), 8, what="rows", checks=checks) == 2
    with pytest.raises(StateIndexError, match="index 9 "):  # concrete: raised at once
        sm.state.check_index(np.int32(9), 8, what="rows", checks=checks)
    assert checks.entries == []


def test_declarations_may_not_hide_graph_attributes_or_be_unsavable():
    class Hides(Graph):
        def __init__(self):
            self.states = state((2,))

    with pytest.raises(GraphDeclarationError, match="hide the Graph attribute `states`"):
        Hides()

    class BadName(Graph):
        def __init__(self):
            self.total = state((2,), name="running total")

    with pytest.raises(GraphDeclarationError, match="Python identifiers"):
        BadName()


def test_an_index_read_from_a_state_is_checked_before_the_step_runs():
    class Ring(Graph):
        """Appends `x` at the position a state holds, then moves that position on."""

        def __init__(self):
            self.buf = state((4, WIDTH), name="buf")
            self.head = state((1,), jnp.int32, name="head")

        def body(self, x):
            at = self.head[0]
            self.buf[at] = x
            self.head[0] = at + 1
            return self.buf[at]

    g = Ring()
    x = np.ones(WIDTH, np.float32)
    for i in range(4):
        np.testing.assert_array_equal(np.asarray(g(x * i)), x * i)
    before = g.state_dict()
    with pytest.raises(StateIndexError, match=r"`buf`.*index 4 "):
        g(x)  # head is 4 now: the step never runs
    for name, value in g.state_dict().items():
        np.testing.assert_array_equal(value, before[name])
    g.reference(x)  # the host mirror is separate: it starts at 0
    with pytest.raises(StateIndexError, match="index 4"):
        for _ in range(4):
            g.reference(x)
    assert int(g.head.host[0]) == 4 and g.compile_count == 1


# --- review regressions: caches nested, inside transformations, leaving the body; odd inputs ----


def _kv(x):
    return x.reshape(1, 1, WIDTH)


class NestedCache(Graph):
    """A KVCache inside a dict state, and an array state written in the same step."""

    def __init__(self):
        self.s = state({"c": KVCache(1, 4, 1, WIDTH, name="c")}, name="s")
        self.total = state((4, WIDTH), name="total")

    def body(self, x, *, pos):
        self.total[0] = self.total[0] + x
        self.s = {"c": self.s["c"].write(0, pos, _kv(x), _kv(x))}
        return x


@pytest.mark.parametrize("path", ["compiled", "reference"])
def test_a_kvcache_nested_in_a_pytree_state_is_checked_before_the_step(path):
    g = NestedCache()
    x = np.ones(WIDTH, np.float32)
    run = g if path == "compiled" else g.reference
    run(x, pos=3)
    before = g.state_dict() if path == "compiled" else g.total.host
    with pytest.raises(StateIndexError, match=r"c positions.*index 7 "):
        run(x, pos=7)
    if path == "compiled":  # the step never ran: its donated buffers are alive and unchanged
        for name, value in g.state_dict().items():
            np.testing.assert_array_equal(value, before[name], err_msg=name)
    else:
        np.testing.assert_array_equal(g.total.host, before)
    assert g.compile_count == (1 if path == "compiled" else 0)


class ScanCache(Graph):
    """Writes every layer of a KVCache state from inside a transformation of the body."""

    def __init__(self, how):
        self.cache = state(KVCache(2, 4, 1, WIDTH, name="kv"), name="cache")
        self.how = how

    def body(self, x, *, pos):
        def write(c, layer):
            return c.write(layer, pos, _kv(x), _kv(x))

        if self.how == "scan_layers":  # the layer index exists only inside the scan
            self.cache, _ = jax.lax.scan(
                lambda c, i: (write(c, i), None), self.cache, jnp.arange(2)
            )
        elif self.how == "jit_layer":
            self.cache = jax.jit(write)(self.cache, jnp.int32(1))
        elif self.how == "vmap_pos":  # each position is a value of the vmap alone
            ks = jax.vmap(lambda p: self.cache.write(0, p, _kv(x), _kv(x)).k)(pos + jnp.arange(2))
            return ks.sum()
        else:  # "scan_pos": pos is the body's own, used inside the scan: checked as usual
            self.cache, _ = jax.lax.scan(lambda c, _: (write(c, 0), None), self.cache, None, 2)
        return x.sum()


@pytest.mark.parametrize("how", ["scan_layers", "jit_layer", "vmap_pos"])
@pytest.mark.parametrize("path", ["compiled", "reference"])
def test_an_index_made_inside_a_transformation_of_the_body_is_checked_never_clamped(how, path):
    g = ScanCache(how)
    run = g if path == "compiled" else g.reference
    x = np.ones(WIDTH, np.float32)
    run(x, pos=1)  # indices made in a scan, an inner jit or a vmap work in range
    before = g.read("cache") if path == "compiled" else g.cache.host
    with pytest.raises(StateIndexError, match=r"E1401.*kv positions"):
        run(x, pos=3 if how == "vmap_pos" else 4)  # pos + 1, or pos itself, is out of range
    after = g.read("cache") if path == "compiled" else g.cache.host
    np.testing.assert_array_equal(after.k, before.k)  # the step never ran


@pytest.mark.parametrize("path", ["compiled", "reference"])
def test_the_bodys_own_index_used_inside_a_scan_is_checked_before_the_step(path):
    g = ScanCache("scan_pos")
    x = np.ones(WIDTH, np.float32)
    run = g if path == "compiled" else g.reference
    run(x, pos=3)
    with pytest.raises(StateIndexError, match="index 4 "):
        run(x, pos=4)
    cache = g.read("cache") if path == "compiled" else g.cache.host
    np.testing.assert_array_equal(cache.k[0, 0, :, 0, 0], [0, 0, 0, 1])


class ReturnsCache(Graph):
    def __init__(self):
        self.cache = state(KVCache(1, 4, 1, 2, name="kv"), name="cache")

    def body(self, k, *, pos):
        self.cache = self.cache.write(0, pos, k, k)
        return self.cache, {"again": self.cache}


def test_no_cache_outside_a_graph_call_carries_that_calls_checks():
    g = ReturnsCache()
    k = jnp.ones((1, 1, 2))
    caches = [*jax.tree.leaves(g(k, pos=1), is_leaf=lambda c: isinstance(c, KVCache))]
    caches += jax.tree.leaves(g.reference(k, pos=1), is_leaf=lambda c: isinstance(c, KVCache))
    caches += [g.read("cache"), g.cache.device, g.cache.host]
    assert len(caches) == 7 and all(isinstance(c, KVCache) for c in caches)
    write = jax.jit(lambda c, p: c.write(0, p, k, k).k)
    np.testing.assert_array_equal(np.asarray(write(caches[0], 3))[0, 0, :, 0, 0], [0, 1, 0, 1])
    with pytest.raises(RUNTIME_ERRORS, match="E1401"):  # checked in the user's jit, not clamped
        jax.block_until_ready(write(caches[0], 9))


def test_a_weak_typed_or_device_position_does_not_recompile():
    g = Accumulate(8, WIDTH)
    x = np.ones(WIDTH, np.float32)
    g(x, pos=1)
    g(x, pos=np.int64(2))
    g(x, pos=jnp.asarray(3))  # weak-typed int32
    p = jnp.int32(0)
    for _ in range(3):
        p = p + 1
        g(x, pos=p)
    assert g.compile_count == 1 and g.traces == 1
    np.testing.assert_array_equal(g.read("total")[:5, 0], [0, 2, 2, 2, 0])


class ComputedFar(Graph):
    """Indexes with a value computed in the body from an int64 input (under x64)."""

    def __init__(self):
        self.buf = state((4, 2), name="buf")

    def body(self, x, far):
        at = far * 0 + (2**32 + 1)  # int64: 2**32 + 1 would pass as 1 if narrowed to int32
        self.buf[at] = x
        return self.buf[at]


def test_a_wide_computed_index_is_compared_in_its_own_dtype():
    with jax.enable_x64(True):
        g = ComputedFar()
        with pytest.raises(StateIndexError, match=r"`buf`.*index 4294967297 "):
            g(np.ones(2, np.float32), np.int64(1))
        np.testing.assert_array_equal(g.read("buf"), np.zeros((4, 2)))
        with pytest.raises(StateIndexError, match="index 4294967297"):
            g.reference(np.ones(2, np.float32), np.int64(1))


class ScaleBy(Accumulate):
    def body(self, x, *, pos, scale):
        self.total[pos] = x * scale.astype(x.dtype)
        return x


@pytest.mark.parametrize("path", ["compiled", "reference"])
@pytest.mark.parametrize("pos", [2**31, -(2**31) - 1, np.int64(2**31), 2**64])
def test_an_int_too_wide_for_jax_is_a_coded_error_not_an_overflow(path, pos):
    g = ScaleBy(8, WIDTH)
    run = g if path == "compiled" else g.reference
    x = np.ones(WIDTH, np.float32)
    with pytest.raises(
        StateIndexError, match=rf"`total`.*index {pos} "
    ):  # an index the graph checks
        run(x, pos=pos, scale=1)
    with pytest.raises(sm.state.GraphInputError, match=rf"E1410.*`scale` = {pos}.*int32"):
        run(x, pos=0, scale=pos)  # not an index
    np.testing.assert_array_equal(g.read("total"), np.zeros((8, WIDTH)))
    np.testing.assert_array_equal(g.total.host, np.zeros((8, WIDTH)))


class Guarded(Graph):
    """Reads a row at its input `pos` only inside a branch that runs when `pos` is below 4."""

    def __init__(self):
        self.total = state((4, WIDTH), name="total")

    def body(self, x, *, pos):
        out = jax.lax.cond(pos < 4, lambda: self.total[pos] + x, lambda: x)
        self.total[0] = out
        return out


def test_an_input_index_used_only_in_a_branch_is_checked_only_when_the_branch_runs():
    # An index that is an input is checked on the host before the call, but not one used only
    # in a branch: the branch may not run, and then the index is not an error.
    g = Guarded()
    x = np.ones(WIDTH, np.float32)
    np.testing.assert_array_equal(np.asarray(g(x, pos=9)), x)
    np.testing.assert_array_equal(np.asarray(g(x, pos=0)), 2 * x)
    with pytest.raises(StateIndexError, match="index -1 "):
        g(x, pos=-1)  # the branch runs: its check fails inside the program, and nothing is written
    np.testing.assert_array_equal(g.read("total")[:, 0], [2, 0, 0, 0])
    assert g.compile_count == 1
