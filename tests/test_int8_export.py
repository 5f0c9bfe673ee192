"""The int8 exporter's boundary (`shapeml.apps.int8_sort.quantize.quantize`, docs/int8.md
"Post-training quantization (the exporter)"): every input is checked before any work, in the
documented order, with coded errors; degenerate scales are refused naming the tensor and the cause;
what it returns is a valid model file with the documented key order.
"""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shapeml import int8
from shapeml._errors import ShapemlError
from shapeml.apps.int8_sort import quantize as quantize_module
from shapeml.apps.int8_sort.corpus import make_sequences
from shapeml.apps.int8_sort.quantize import quantize
from shapeml.apps.int8_sort.quantize_checks import check_ratios
from shapeml.int8 import Int8Model
from shapeml.zoo.transformer import Transformer

V, T = 9, 8
TOKENS = [f"t{i}" for i in range(V)]


@pytest.fixture(scope="module")
def fm():
    return Transformer.init(seed=0, V=V, T=T, D=8, H=2, F=12, L=1)


@pytest.fixture(scope="module")
def calib():
    return np.random.default_rng(0).integers(0, V, size=(6, T))


@pytest.fixture
def no_work(monkeypatch):
    """Fails the test if the float pass starts: a bad input must be refused before any work."""

    def refuse(*a, **k):
        raise AssertionError("the float pass ran before the inputs were checked")

    monkeypatch.setattr(quantize_module, "float_intermediates", refuse)


def coded(code: str, fn, *args, match: str | None = None):
    with pytest.raises(ShapemlError) as info:
        fn(*args)
    assert info.value.code == code, str(info.value)
    if match is not None:
        assert re.search(match, str(info.value)), str(info.value)
    return info.value


def test_the_result_is_a_valid_file_with_the_documented_key_order(fm, calib):
    out = quantize(fm, calib, TOKENS, {"b": 1, "a": [2]})
    assert list(out) == ["format", "dims", "tokens", "requant", "exp_table", "tensors", "meta"]
    assert list(out["dims"]) == ["d", "heads", "d_ff", "vocab", "ctx"]
    assert list(out["requant"]) == list(int8.REQUANT_POINTS)
    assert list(out["tensors"]) == [
        *("embed", "positions", "wq", "wk", "wv", "wo", "w1", "w2", "eq"),
    ]
    assert list(out["meta"]) == ["b", "a", "scales"]
    scales = [*("x0", "x1", "x2", "q", "k", "v", "attn", "h")]
    scales += [f"w_{w}" for w in ("wq", "wk", "wv", "wo", "w1", "w2")] + ["eq"]
    assert list(out["meta"]["scales"]) == scales
    assert all(type(v) is int for t in out["tensors"].values() for v in t)
    m = Int8Model.from_json(json.loads(json.dumps(out)))
    assert m.tokens == tuple(TOKENS) and m.meta["b"] == 1
    assert quantize(fm, calib, tuple(TOKENS))["meta"].keys() == {"scales"}  # meta=None


@pytest.mark.parametrize(
    "calib_like",
    [
        lambda c: c.astype(np.int32),
        lambda c: c.astype(np.uint8),
        lambda c: jnp.asarray(c, jnp.int32),
        lambda c: c.tolist(),
        lambda c: tuple(map(tuple, c.tolist())),
        lambda c: c[:, :5],  # t < T: positions 0..4
    ],
)
def test_every_kind_of_integer_calibration_array_gives_the_numpy_result(fm, calib, calib_like):
    want = quantize(fm, np.asarray(calib_like(calib)), TOKENS)
    assert quantize(fm, calib_like(calib), TOKENS) == want


MODELS = {
    "not a model": ("dict", "E0003", r"`m` must be a float `Transformer`"),
    "an int8 model": ("int8", "E0003", "Int8Model"),
    "two layers": ("L2", "E1607", "L = 2 layers"),
    "abstract": ("abstract", "E0003", "not a concrete array"),
    "nan weight": ("nan", "E1615", r"`m\.wq` holds 1 NaN"),
}


@pytest.mark.parametrize("case", list(MODELS), ids=list(MODELS))
def test_bad_models_are_refused_first(fm, calib, no_work, case):
    spec, code, match = MODELS[case]
    model = {
        "int8": lambda: Int8Model.random(0, d=8, heads=2, d_ff=12, vocab=V, ctx=T, table_len=8),
        "L2": lambda: Transformer.init(seed=0, V=V, T=T, D=8, H=2, F=12, L=2),
        "abstract": lambda: jax.eval_shape(lambda: fm),
        "nan": lambda: fm.replace(wq=fm.wq.at[0, 1, 2].set(jnp.nan)),
        "dict": dict,
    }[spec]()
    coded(code, quantize, model, calib, TOKENS, match=match)


def test_dims_beyond_the_int8_caps_are_refused_without_building_anything(no_work):
    big = jax.eval_shape(lambda: Transformer.init(seed=0, V=70_000, T=4, D=4, H=1, F=4, L=1))
    # the dims are checked before the fields: an abstract model with too large a vocabulary is
    # an E1607, not the E0003 of its abstract fields
    coded("E1607", quantize, big, np.zeros((1, 1), int), TOKENS, match="vocab` = 70000")


@pytest.mark.parametrize(
    "tokens,code",
    [
        (TOKENS[:-1], "E1602"),  # one short
        ([*TOKENS, "t9"], "E1602"),
        ("t0t1t2t3t4t5t6t7t8", "E1601"),  # a string is not a token list
        ([*TOKENS[:-1], 8], "E1601"),
        ([*TOKENS[:-1], "t0"], "E1613"),  # a duplicate
        ([*TOKENS[:-1], ""], "E1613"),
        (None, "E1601"),
    ],
)
def test_bad_token_lists(fm, calib, no_work, tokens, code):
    coded(code, quantize, fm, calib, tokens)


@pytest.mark.parametrize(
    "bad,code,match",
    [
        (np.full((2, 3), -1), "E1608", r"`calib\[0, 0\]` = -1"),  # never the last token
        (np.full((2, 3), V), "E1608", r"= 9 is outside the vocabulary 0\.\.8"),
        (np.array([[0, 1], [2, 2**40]]), "E1608", r"`calib\[1, 1\]`"),
        (np.zeros((2, 3), np.float32), "E0003", "dtype float32"),
        (np.zeros((2, 3), bool), "E0003", "dtype bool"),
        ([[0, 1], [2, 2**70]], "E0003", "dtype object"),
        ([[0, 1], [2]], "E0003", "ragged"),
        ([["a", "b"]], "E0003", "dtype <U1"),
        ("0 1 2", "E0003", r"`calib` must be an integer array"),
        (None, "E0003", r"`calib` must be an integer array"),
        (np.zeros(3, int), "E0002", r"shape \(3,\)"),
        (np.zeros((1, 2, 3), int), "E0002", r"shape \(1, 2, 3\)"),
        (np.zeros((0, 3), int), "E0002", r"shape \(0, 3\)"),
        (np.zeros((2, 0), int), "E0002", r"shape \(2, 0\)"),
        (np.zeros((2, T + 1), int), "E0002", "longer than the context T = 8"),
    ],
)
def test_bad_calibration_ids(fm, no_work, bad, code, match):
    coded(code, quantize, fm, bad, TOKENS, match=match)


def test_a_calibration_set_too_large_for_the_float_pass_is_refused(no_work):
    fm = jax.eval_shape(lambda: Transformer.init(seed=0, V=4, T=4096, D=4, H=1, F=4, L=1))
    fm = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), fm)
    calib = np.zeros((9, 4096), np.int32)  # 9 * 4096**2 scores > 2**27
    coded("E0002", quantize, fm, calib, ["a", "b", "c", "d"], match="attention scores")


@pytest.mark.parametrize(
    "meta,code",
    [
        ({"scales": 1}, "E0002"),  # would be overwritten
        ([1, 2], "E1601"),
        ({"f": object()}, "E1601"),
        ({"deep": {(1, 2): 3}}, "E1601"),
    ],
)
def test_bad_meta(fm, calib, no_work, meta, code):
    coded(code, quantize, fm, calib, TOKENS, meta)


def test_the_validation_order_is_the_docs(fm, calib, no_work):
    two = Transformer.init(seed=0, V=V, T=T, D=8, H=2, F=12, L=2)
    nan = fm.replace(w2=fm.w2 * jnp.nan)
    bad_calib, bad_tokens, bad_meta = np.full((1, 2), V), TOKENS[:3], {"scales": 0}
    # each row: the inputs, and the code of the first step that fails
    for args, code in [
        ((two, bad_calib, bad_tokens, bad_meta), "E1607"),  # 2. dims
        ((nan, bad_calib, bad_tokens, bad_meta), "E1602"),  # 3. tokens
        ((nan, bad_calib, TOKENS, bad_meta), "E1608"),  # 4. calib
        ((nan, calib, TOKENS, bad_meta), "E0002"),  # 5. meta
        ((nan, calib, TOKENS, None), "E1615"),  # 6. finite weights
    ]:
        coded(code, quantize, *args)


@pytest.mark.parametrize("name", ["wq", "wk", "wv", "wo", "w1", "w2", "embed"])
def test_an_all_zero_weight_is_refused_naming_it(fm, calib, name):
    zero = fm.replace(**{name: getattr(fm, name) * 0})
    coded(
        "E1615", quantize, zero, calib, TOKENS, match=rf"weight `{name}` is 0\.0: `{name}` is all"
    )


def test_a_relu_dead_on_the_calibration_data_is_refused(fm, calib):
    dead = fm.replace(
        embed=jnp.abs(fm.embed),
        pos=jnp.abs(fm.pos),
        wv=jnp.abs(fm.wv),
        wo=jnp.abs(fm.wo),
        w1=-jnp.abs(fm.w1),
    )
    err = coded("E1615", quantize, dead, calib, TOKENS, match=r"activation `h` is 0\.0")
    assert "ReLU is dead on the calibration data" in str(err) and "calibrate on" in err.fix


def test_zero_activations_name_their_cause(fm):
    unused = fm.embed.at[: V - 1].set(0)  # only the last id, never calibrated on, has a row
    calib = np.zeros((2, T), int)
    model = fm.replace(embed=unused, pos=fm.pos * 0)
    coded("E1615", quantize, model, calib, TOKENS, match=r"activation `x0`.*embedding rows")


def test_a_ratio_outside_float64_is_refused_naming_the_point():
    ratios = dict.fromkeys(int8.REQUANT_POINTS, 0.5) | {"w1": float("inf"), "w2": 0.0}
    formulas = dict.fromkeys(int8.REQUANT_POINTS, "f")
    coded("E1615", check_ratios, ratios, formulas, match="ratio of `w1`, f = inf")
    coded("E1615", check_ratios, ratios | {"w1": 1.0}, formulas, match="of `w2`, f = 0.0")


def test_requant_pair_refuses_the_infinite_ratio_of_a_division_by_zero():
    for ratio in (float("inf"), float("nan"), np.float64("inf"), 0.0):
        coded("E0002", int8.requant_pair, ratio)


def test_requant_pair_and_exp_table_take_their_options_by_keyword():
    assert int8.requant_pair(0.3, max_shift=40) == int8.requant_pair(0.3)
    with pytest.raises(TypeError):
        int8.requant_pair(0.3, 40)
    assert int8.exp_table(0.1, length=3, one=100) == [100, 90, 82]
    with pytest.raises(TypeError):
        int8.exp_table(0.1, 3)


@pytest.mark.parametrize(
    "kwargs,code",
    [
        (dict(step=0.0), "E0002"),
        (dict(step=-0.1), "E0002"),
        (dict(step=float("nan")), "E0002"),
        (dict(step=float("inf")), "E0002"),
        (dict(step="0.1"), "E0003"),
        (dict(step=True), "E0003"),
        (dict(step=0.1, length=0), "E0002"),
        (dict(step=0.1, length=129), "E0002"),
        (dict(step=0.1, length=2.0), "E0003"),
        (dict(step=0.1, one=0), "E0002"),
        (dict(step=0.1, one=32768), "E0002"),
        (dict(step=0.1, one=None), "E0003"),
    ],
)
def test_exp_table_refusals(kwargs, code):
    coded(code, lambda: int8.exp_table(**kwargs))


@pytest.mark.parametrize(
    "args,code",
    [((0, 5, 1), "E0002"), ((2, 0, 1), "E0002"), ((2, 5, -1), "E0002"), ((2.0, 5, 1), "E0003")],
)
def test_make_sequences_checks_its_arguments(args, code):
    coded(code, make_sequences, *args)
