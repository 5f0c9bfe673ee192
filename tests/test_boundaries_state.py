"""Bad inputs at the boundaries of `shapeml.state`, `sm.hoist`/`sm.bake` and the zoo: every one is
refused with a coded error (or gives the documented result), and a refused index writes nothing.

The property tests draw indices of many kinds (ints of every numpy dtype and far out of range,
floats, bools, 0-d arrays) and compare each accepted write with a numpy reference; `TRIED` counts
the inputs they try (printed by the last test).
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shapeml as sm
from shapeml.state import (
    Graph,
    GraphDeclarationError,
    GraphInputError,
    KVCache,
    LoadStateDictError,
    StateAllocationError,
    StateIndexError,
    StateIndexTypeError,
    StateNotFoundError,
    StateWriteError,
    span,
    state,
)
from shapeml.zoo import mixer, spotter
from shapeml.zoo import transformer as tr

ROWS, WIDTH = 4, 2
TRIED: collections.Counter = collections.Counter()


class Rows(Graph):
    def __init__(self):
        self.total = state((ROWS, WIDTH), name="total")

    def body(self, x, *, pos):
        self.total[pos] = x
        return x


class Cache(Graph):
    """A KVCache as a graph state: `pos` is checked before the step runs."""

    def __init__(self):
        self.cache = state(KVCache(1, ROWS, 1, WIDTH), name="cache")

    def body(self, k, *, pos):
        self.cache = self.cache.write(0, pos, k, k)
        return k


def _as_int(value) -> int | None:
    """The exact integer a valid index holds (numpy's view, independent of shapeml), else None."""
    if isinstance(value, bool | np.bool_):
        return None
    arr = np.asarray(value)
    if arr.shape != () or arr.dtype.kind not in "iu":
        return None
    return int(arr.item())


# Every kind of scalar a careless caller might pass as an index.
_INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


def _typed_ints():
    def one(dtype):
        info = np.iinfo(dtype)
        values = st.one_of(
            st.integers(-2, ROWS + 2), st.integers(int(info.min), int(info.max))
        ).filter(lambda v: info.min <= v <= info.max)
        wrap = st.sampled_from([dtype, lambda v, d=dtype: np.array(v, d)])
        return st.tuples(values, wrap).map(lambda vw: vw[1](vw[0]))

    return st.one_of(*[one(d) for d in _INT_DTYPES])


INDICES = st.one_of(
    st.integers(-3, ROWS + 3),
    st.integers(-(2**70), 2**70),
    st.sampled_from([2**32 + 2, 2**31, 2**63 + 1, -(2**31) - 1]),
    _typed_ints(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(-1, ROWS).map(np.float32),
    st.booleans(),
    st.sampled_from([np.bool_(True), np.array(1.0), np.array([1]), None, "1", 1 + 0j]),
)


def _expect(graph_call, read, value, mirror: np.ndarray, x: np.ndarray) -> None:
    """Runs one write at `value`: a valid row is written as numpy says; anything else raises a
    coded error and leaves the state exactly as it was."""
    row = _as_int(value)
    before = read()
    if row is not None and 0 <= row < ROWS:
        graph_call(value)
        mirror[row] = x
        np.testing.assert_array_equal(read(), mirror)
        return
    with pytest.raises(sm.ShapemlError) as info:
        graph_call(value)
    assert info.value.code in {"E1401", "E1402", "E1410"}, info.value
    np.testing.assert_array_equal(read(), before)


@settings(max_examples=120, deadline=None)
@given(value=INDICES, fill=st.integers(1, 100))
def test_graph_state_index_is_checked_on_its_exact_value(value, fill):
    g = _ROWS_GRAPH
    x = np.full(WIDTH, fill, np.float32)
    _expect(lambda v: g(x, pos=v), lambda: g.read("total"), value, _ROWS_MIRROR, x)
    TRIED["graph state index"] += 1


@settings(max_examples=60, deadline=None)
@given(value=INDICES, fill=st.integers(1, 100))
def test_graph_reference_path_checks_the_same_indices(value, fill):
    g = Rows()
    x = np.full(WIDTH, fill, np.float32)
    mirror = np.zeros((ROWS, WIDTH), np.float32)
    _expect(lambda v: g.reference(x, pos=v), lambda: g.total.host, value, mirror, x)
    TRIED["graph reference index"] += 1


@settings(max_examples=100, deadline=None)
@given(value=INDICES, fill=st.integers(1, 100))
def test_kvcache_position_in_a_graph_is_checked_before_the_step(value, fill):
    g = _CACHE_GRAPH
    k = np.full((1, 1, WIDTH), fill, np.float32)

    def read():
        return np.asarray(g.read("cache").k[0, 0, :, 0, :])

    _expect(lambda v: g(k, pos=v), read, value, _CACHE_MIRROR, k[0, 0])
    TRIED["KVCache position in a graph"] += 1


@settings(max_examples=120, deadline=None)
@given(value=INDICES, layer=INDICES)
def test_kvcache_concrete_positions_and_layers(value, layer):
    cache = KVCache(2, ROWS, 1, WIDTH)
    k = jnp.ones((1, 1, WIDTH))
    row, lay = _as_int(value), _as_int(layer)
    TRIED["KVCache position and layer (eager)"] += 1
    if row is not None and 0 <= row < ROWS and lay is not None and 0 <= lay < 2:
        out = np.asarray(cache.write(layer, value, k, k).k)
        want = np.zeros_like(out)
        want[lay, 0, row] = 1.0
        np.testing.assert_array_equal(out, want)
        return
    with pytest.raises(sm.ShapemlError) as info:
        cache.write(layer, value, k, k)
    assert info.value.code in {"E1401", "E1402"}


_ROWS_GRAPH, _CACHE_GRAPH = Rows(), Cache()
_ROWS_MIRROR = np.zeros((ROWS, WIDTH), np.float32)
_CACHE_MIRROR = np.zeros((ROWS, WIDTH), np.float32)


def test_the_reported_case_int64_past_2_32_does_not_wrap_to_row_2():
    g = Rows()
    with pytest.raises(StateIndexError, match="4294967298"):
        g(np.ones(WIDTH, np.float32), pos=np.int64(2**32 + 2))
    np.testing.assert_array_equal(g.read("total"), np.zeros((ROWS, WIDTH)))
    g(np.ones(WIDTH, np.float32), pos=np.int64(2))  # the same dtype, in range: row 2
    assert g.read("total")[2].tolist() == [1.0, 1.0]


@pytest.mark.parametrize("dtype", [jnp.int8, jnp.int16, jnp.uint8, jnp.uint32])
def test_narrow_and_unsigned_positions_work_in_jit_and_graphs(dtype):
    # Each index is checked in its own dtype, then cast to one dtype for the slice.
    cache = KVCache(1, ROWS, 1, WIDTH)
    k = jnp.ones((1, 1, WIDTH))
    out = jax.jit(lambda c, p: c.write(0, p, k, k))(cache, jnp.asarray(3, dtype))
    assert np.asarray(out.k)[0, 0, :, 0, 0].tolist() == [0, 0, 0, 1]
    g = Rows()
    g(np.ones(WIDTH, np.float32), pos=np.asarray(1, dtype))
    assert g.read("total")[:, 0].tolist() == [0, 1, 0, 0]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"layers": -1}, sm.ArgumentError),
        ({"layers": 0}, sm.ArgumentError),
        ({"layers": 1.5}, sm.ArgumentTypeError),
        ({"ctx": True}, sm.ArgumentTypeError),
        ({"heads": "2"}, sm.ArgumentTypeError),
        ({"head_dim": np.float32(2)}, sm.ArgumentTypeError),
        ({"batch": 0}, sm.ArgumentError),
        ({"dtype": "foo"}, sm.ArgumentTypeError),
        ({"dtype": object}, sm.ArgumentTypeError),
        ({"name": 3}, sm.ArgumentTypeError),
        ({"layers": 10**6, "ctx": 10**6}, StateAllocationError),
    ],
)
def test_kvcache_constructor_refuses_bad_sizes_before_allocating(kwargs, error):
    args = {"layers": 1, "ctx": 4, "heads": 1, "head_dim": 2, **kwargs}
    with pytest.raises(error):
        KVCache(**args)
    TRIED["KVCache constructor"] += 1


@pytest.mark.parametrize("n", [0, -1, 1.5, True, "2"])
def test_kvcache_read_and_mask_refuse_a_bad_count(n):
    cache = KVCache(1, 4, 1, 2)
    with pytest.raises((sm.ArgumentError, sm.ArgumentTypeError)):
        cache.mask(0, n)
    with pytest.raises((sm.ArgumentError, sm.ArgumentTypeError)):
        cache.read(0, 0, n)
    TRIED["KVCache n"] += 2


@pytest.mark.parametrize("k", [[[1.0, 2.0]], None, 3.0, np.ones((1, 2))])
def test_kvcache_write_refuses_what_is_not_an_array_of_its_shape(k):
    with pytest.raises(StateWriteError):
        KVCache(1, 4, 1, 2).write(0, 0, k, k)
    TRIED["KVCache write value"] += 1


@pytest.mark.parametrize("size", [True, 2.0, -1, "2", None])
def test_span_size_must_be_a_static_non_negative_int(size):
    with pytest.raises(StateIndexTypeError):
        span(0, size)
    TRIED["span size"] += 1


@pytest.mark.parametrize(
    "declare",
    [
        lambda: state((4, 2), dtype="foo"),
        lambda: state((4, 2), dtype=object),
        lambda: state((4, 2), name=3),
        lambda: state((4, 2.0)),
        lambda: state((4, -2)),
        lambda: state((True, 2)),
        lambda: sm.state.param(np.ones(2), dtype="bar"),
        lambda: sm.state.param(np.array(["a", "b"])),
    ],
)
def test_bad_declarations_are_refused(declare):
    with pytest.raises(GraphDeclarationError):
        declare()
    TRIED["declaration"] += 1


@pytest.mark.parametrize(
    "entries",
    [[1], None, {"total": [[1], [1, 2]]}, {"total": "ab"}, {3: np.zeros((4, 2))}],
)
def test_load_state_dict_refuses_bad_entries_and_changes_nothing(entries):
    g = Rows()
    g(np.ones(WIDTH, np.float32), pos=1)
    before = g.read("total")
    with pytest.raises(LoadStateDictError):
        g.load_state_dict(entries)
    np.testing.assert_array_equal(g.read("total"), before)
    TRIED["load_state_dict"] += 1


@pytest.mark.parametrize("name", [3, None, b"total", "nope"])
def test_state_names_must_be_declared_strings(name):
    g = Rows()
    for op in (g.read, g.reset):
        with pytest.raises(StateNotFoundError):
            op(name)
    TRIED["state name"] += 2


def test_a_call_that_does_not_fit_body_is_a_coded_input_error():
    g = Rows()
    x = np.ones(WIDTH, np.float32)
    with pytest.raises(GraphInputError, match="pos"):
        g(x)
    with pytest.raises(GraphInputError, match="bogus"):
        g(x, pos=0, bogus=1)
    with pytest.raises(StateWriteError, match="not an array"):
        g([1.0, 2.0], pos=0)  # a list input reaches body as a list of scalars
    np.testing.assert_array_equal(g.read("total"), np.zeros((ROWS, WIDTH)))
    TRIED["graph call"] += 3


# --- hoisting options ---------------------------------------------------------------------------


def _f(m, x):
    return x @ m["w"]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"cache_size": -5}, sm.ArgumentError),
        ({"cache_size": 0}, sm.ArgumentError),
        ({"cache_size": 2.5}, sm.ArgumentTypeError),
        ({"cache_size": True}, sm.ArgumentTypeError),
        ({"cache_size": float("nan")}, sm.ArgumentTypeError),
        ({"max_prepared_bytes": -1}, sm.ArgumentError),
        ({"max_prepared_bytes": float("nan")}, sm.ArgumentTypeError),
        ({"max_prepared_bytes": True}, sm.ArgumentTypeError),
        ({"max_prepared_bytes": "1"}, sm.ArgumentTypeError),
        ({"max_prepared_bytes": 1e9}, sm.ArgumentTypeError),
        ({"weights": True}, sm.hoisting.HoistArgumentError),
        ({"weights": 1.0}, sm.hoisting.HoistArgumentError),
        ({"weights": (0, -1)}, sm.hoisting.HoistArgumentError),
        ({"weights": "0"}, sm.hoisting.HoistArgumentError),
        ({"cut_broadcasts": "no"}, sm.ArgumentTypeError),
    ],
)
def test_hoist_options_are_refused_not_clamped(kwargs, error):
    with pytest.raises(error):
        sm.hoist(_f, **kwargs)
    with pytest.raises(error):
        sm.hoist(**kwargs)  # as a decorator: checked at once, not when applied
    TRIED["hoist options"] += 2


@pytest.mark.parametrize("mpb", [-1, 0.5, "big", False])
def test_bake_checks_its_options_before_tracing(mpb):
    with pytest.raises((sm.ArgumentError, sm.ArgumentTypeError)):
        sm.bake(_f, {"w": jnp.eye(2)}, max_prepared_bytes=mpb)
    TRIED["bake options"] += 1


@pytest.mark.parametrize("f", [3, None, "f"])
def test_hoist_and_bake_need_a_function(f):
    with pytest.raises(sm.ArgumentTypeError):
        sm.hoist(f, weights=0) if f is not None else sm.hoist(f)(3)
    with pytest.raises(sm.ArgumentTypeError):
        sm.bake(f, {"w": jnp.eye(2)})
    TRIED["hoist/bake function"] += 2


def test_valid_options_still_hoist():
    fast = sm.hoist(_f, cache_size=np.int64(2), max_prepared_bytes=0)
    m = {"w": jnp.eye(2)}
    np.testing.assert_allclose(fast(m, jnp.ones((1, 2))), np.ones((1, 2)))


# --- the zoo ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dims", [{"D": 30, "H": 4}, {"D": 8, "H": 16}])
def test_transformer_heads_must_divide_the_width(dims):
    with pytest.raises(tr.TransformerDimsError, match="H must be at least 1 and divide D"):
        tr.Transformer.init(seed=0, **dims)
    TRIED["transformer dims"] += 1


def test_zero_heads_is_refused_by_the_derived_head_width():
    with pytest.raises(sm.ShapemlError, match=r"E0903[\s\S]*`D // H` divides by zero"):
        tr.Transformer.init(seed=0, H=0)
    TRIED["transformer dims"] += 1


def test_the_transformer_constructor_checks_its_heads_too():
    # The attention weights are spelled `L D H*Dh`: with H=4 heads of D // H = 7, a width-30
    # model's [2 30 30] weights do not fit, and the constructor names each of them.
    m = tr.Transformer.init(seed=0, D=30, H=5)
    fields = {name: getattr(m, name) for name in ("embed", "pos", "wq", "wk", "wv", "wo")}
    fields |= {"w1": m.w1, "w2": m.w2}
    with pytest.raises(sm.ShapemlError, match=r"E0902[\s\S]*wq: expected \[L D H\*Dh\]"):
        tr.Transformer(dims=tr.Transformer.dims.resolve(D=30, H=4), **fields)
    TRIED["transformer dims"] += 1


@pytest.fixture(scope="module")
def small():
    return tr.Transformer.init(seed=0, V=13, T=12, D=16, H=2, F=32, L=1)


@pytest.mark.parametrize(
    ("prompt", "steps", "error"),
    [
        (jnp.array([[1.7, 2.2]]), 3, tr.GenerateError),
        (jnp.array([[True, False]]), 3, tr.GenerateError),
        (jnp.zeros((1, 0), jnp.int32), 3, tr.GenerateError),
        (jnp.zeros((0, 2), jnp.int32), 3, tr.GenerateError),
        (jnp.array([1, 2]), 3, tr.GenerateError),
        ([[1, 2]], 3, tr.GenerateError),
        ("ab", 3, tr.GenerateError),
        (jnp.array([[1, 13]]), 3, StateIndexError),
        (jnp.array([[-1, 2]]), 3, StateIndexError),
        (np.array([[2**32 + 1]], np.int64), 3, StateIndexError),
        (jnp.array([[1, 2]]), 0, sm.ArgumentError),
        (jnp.array([[1, 2]]), -1, sm.ArgumentError),
        (jnp.array([[1, 2]]), 2.5, sm.ArgumentTypeError),
        (jnp.array([[1, 2]]), True, sm.ArgumentTypeError),
        (jnp.array([[1, 2]]), "3", sm.ArgumentTypeError),
        (jnp.array([[1, 2]]), 10**20, StateIndexError),
    ],
)
def test_generate_refuses_bad_prompts_and_counts(small, prompt, steps, error):
    with pytest.raises(error):
        tr.generate(small, prompt, steps)
    TRIED["generate"] += 1


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"key": 3}, sm.ArgumentTypeError),
        ({"key": jax.random.split(jax.random.key(0), 2)}, sm.ArgumentTypeError),
        ({"key": jax.random.key(0), "temperature": 0.0}, sm.ArgumentError),
        ({"key": jax.random.key(0), "temperature": float("nan")}, sm.ArgumentError),
        ({"key": jax.random.key(0), "temperature": "1"}, sm.ArgumentTypeError),
    ],
)
def test_generate_refuses_bad_sampling_options(small, kwargs, error):
    with pytest.raises(error):
        tr.generate(small, jnp.array([[1, 2]]), 2, **kwargs)
    TRIED["generate sampling"] += 1


def test_generate_accepts_every_integer_prompt_dtype_the_same(small):
    want = np.asarray(tr.generate(small, jnp.array([[1, 2]], jnp.int32), 3))
    for dtype in (np.int64, np.uint8, np.int16):
        got = np.asarray(tr.generate(small, np.array([[1, 2]], dtype), np.int64(3)))
        np.testing.assert_array_equal(got, want)


def test_cached_decoder_refuses_out_of_vocabulary_tokens_before_writing(small):
    dec = tr.CachedDecoder(small)
    dec(jnp.array([[1, 2]]), pos=0)
    before = dec.read("kv_cache").k
    for bad in ([[13]], [[-1]], [[2, 99]]):
        with pytest.raises(StateIndexError, match="vocabulary"):
            dec(jnp.array(bad), pos=2)
        TRIED["decoder tokens"] += 1
    np.testing.assert_array_equal(dec.read("kv_cache").k, before)
    for batch in (0, 1.5, True):
        with pytest.raises((sm.ArgumentError, sm.ArgumentTypeError)):
            tr.CachedDecoder(small, batch=batch)
        with pytest.raises((sm.ArgumentError, sm.ArgumentTypeError)):
            tr.new_cache(small, batch)
        TRIED["decoder batch"] += 2
    with pytest.raises(sm.ArgumentTypeError):
        tr.CachedDecoder({"embed": 1})


def test_spotter_dims_labels_and_classes():
    with pytest.raises(spotter.SpotterDimsError):
        spotter.Spotter.init(seed=0, S=15)
    y, pred = jnp.array([0, 1, 3]), jnp.array([0, 2, 3])
    for bad in (jnp.array([0, 4, 1]), jnp.array([-1, 0, 1])):
        with pytest.raises(spotter.LabelError):
            spotter.confusion(bad, y, 4)
        with pytest.raises(spotter.LabelError):
            spotter.per_class_accuracy(pred, bad, 4)
        with pytest.raises(spotter.LabelError):
            spotter.cross_entropy(jnp.zeros((3, 4)), bad)
        TRIED["spotter labels"] += 3
    for classes in (0, -1, True):
        with pytest.raises((sm.ArgumentError, sm.ArgumentTypeError)):
            spotter.confusion(pred, y, classes)
        TRIED["spotter classes"] += 1
    # The checked path still counts against numpy.
    want = np.zeros((4, 4), int)
    np.add.at(want, (np.asarray(y), np.asarray(pred)), 1)
    np.testing.assert_array_equal(spotter.confusion(pred, y, 4), want)
    for eps in (-1.0, 0.0, float("nan")):
        with pytest.raises(sm.ArgumentError):
            mixer.norm(jnp.ones((2, 3)), eps=eps)
        TRIED["mixer eps"] += 1


def test_zz_report_how_many_bad_inputs_were_tried(capsys):
    with capsys.disabled():
        print("\nboundary inputs tried:", dict(TRIED), "total", sum(TRIED.values()))
