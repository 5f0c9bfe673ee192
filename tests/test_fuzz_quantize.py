"""Property tests of the int8 exporter's boundary (`quantize`): float models with zeroed, tiny,
huge, sign-flipped and non-finite weights, calibration ids of every kind and range, token lists
and notes either give a model file that `Int8Model.from_json` accepts, or raise a coded
`ShapemlError`; never a raw exception (a `ZeroDivisionError`, an `IndexError`, a numpy warning).

Each test counts the inputs it tried and asserts that both outcomes occurred, so a generator that
stopped producing valid (or invalid) inputs would be noticed.
"""

from collections import Counter

import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shapeml._errors import ShapemlError
from shapeml.apps.int8_sort.quantize import quantize
from shapeml.int8 import Int8Model
from shapeml.zoo.transformer import Transformer

V, T = 6, 5
BASE = Transformer.init(seed=0, V=V, T=T, D=4, H=2, F=6, L=1)
TOKENS = [f"t{i}" for i in range(V)]
CALIB = np.random.default_rng(0).integers(0, V, size=(3, T))
FIELDS = ("embed", "pos", "wq", "wk", "wv", "wo", "w1", "w2")
FAST = settings(
    max_examples=40,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# What can happen to one weight: zeroed, scaled far down or up, made non-positive (a dead ReLU
# for w1 when the stream is positive), one entry set to a hostile value.
EDITS = st.one_of(
    st.tuples(st.just("scale"), st.sampled_from([0.0, 1e-38, 1e-20, 1e20, 1e38, -1.0])),
    st.tuples(st.just("abs"), st.sampled_from([1.0, -1.0])),
    st.tuples(
        st.just("entry"), st.sampled_from([0.0, float("nan"), float("inf"), -float("inf"), 3e38])
    ),
)
MODELS = st.dictionaries(st.sampled_from(FIELDS), EDITS, max_size=4)


def _model(edits: dict) -> Transformer:
    changed = {}
    for name, (op, value) in edits.items():
        x = getattr(BASE, name)
        if op == "scale":
            x = x * jnp.float32(value)
        elif op == "abs":
            x = jnp.abs(x) * value
        else:
            x = x.reshape(-1).at[0].set(value).reshape(x.shape)
        changed[name] = x
    return BASE.replace(**changed)


CALIBS = st.one_of(
    st.just(CALIB),
    st.builds(
        lambda shape, lo, hi, dtype, seed: (
            np.random.default_rng(seed)
            .integers(min(lo, hi), max(lo, hi) + 1, size=shape)
            .astype(dtype)
        ),
        st.tuples(st.integers(0, 4), st.integers(0, T + 1)) | st.tuples(st.integers(0, 3)),
        st.integers(-2, V),
        st.integers(0, V + 1),
        st.sampled_from([np.int64, np.int32, np.int16, np.uint8, np.int8, np.float32, bool]),
        st.integers(0, 2**16),
    ),
    st.lists(st.lists(st.integers(-1, V), min_size=T, max_size=T), min_size=1, max_size=3),
    st.lists(st.lists(st.integers(-(2**70), 2**70), max_size=T), max_size=3),
    st.sampled_from([None, "0 1 2", 3, [[0, 1], [2]], [["a"]], jnp.zeros((2, 3), jnp.int32)]),
)
TOKEN_LISTS = st.one_of(
    st.just(TOKENS),
    st.just(tuple(TOKENS)),
    st.lists(st.sampled_from(["a", "b", "c", "dd", "e e", "", "f", "g", "h"]), max_size=V + 1),
    st.lists(st.text(max_size=3), min_size=V, max_size=V).map(tuple),
    st.sampled_from([None, "abcdef", [1, 2, 3, 4, 5, 6], TOKENS[:-1]]),
)
METAS = st.sampled_from([None, {}, {"a": 1}, {"scales": 1}, [1], {"f": {1, 2}}])


def outcome(fn, tried: Counter, kind: str) -> None:
    """Runs `fn`: a result that is a valid model file, or a coded error; anything else fails."""
    try:
        out = fn()
    except ShapemlError as e:
        assert e.code and e.code[0] == "E" and len(str(e)) < 2000, e
        tried[f"{kind}: {e.code}"] += 1
        return
    Int8Model.from_json(out)
    tried[f"{kind}: ok"] += 1


def _summary(tried: Counter) -> int:
    total = sum(tried.values())
    print(f"{total} inputs: {dict(sorted(tried.items()))}")
    return total


def test_float_models_of_every_kind():
    tried = Counter()

    @FAST
    @given(MODELS)
    def run(edits):
        outcome(lambda: quantize(_model(edits), CALIB, TOKENS), tried, "model")

    run()
    assert _summary(tried) >= 30
    assert tried["model: ok"] > 0 and tried["model: E1615"] > 0


def test_calibration_ids():
    tried = Counter()

    @FAST
    @given(CALIBS)
    def run(calib):
        outcome(lambda: quantize(BASE, calib, TOKENS), tried, "calib")

    run()
    assert _summary(tried) >= 30
    assert tried["calib: ok"] > 0 and tried["calib: E1608"] > 0 and len(tried) >= 4


def test_tokens_and_notes():
    tried = Counter()

    @FAST
    @given(TOKEN_LISTS, METAS)
    def run(tokens, meta):
        outcome(lambda: quantize(BASE, CALIB, tokens, meta), tried, "inputs")

    run()
    assert _summary(tried) >= 30
    assert tried["inputs: ok"] > 0 and len(tried) >= 5  # valid inputs and many different codes
    assert tried["inputs: E0002"] > 0  # a `scales` key in the notes
