"""docs/int8.md as the specification: what it states is checked against the code, from the doc's
own text, so the two cannot drift.

- The overflow table: its formulas are parsed from the doc, evaluated at the doc's caps (every
  bound must stay below 2**31) and compared with the validator's bounds (`Int8Model.bounds`) and
  with what `from_json` accepts and refuses, and in which order.
- `requant_pair`: an independent implementation of the doc's written rule, in exact rational
  arithmetic (`fractions.Fraction`), against the library's, ties and edges included.
- The exporter: the doc's quantization recipe, implemented here in plain numpy from the text,
  rebuilds the shipped file's requant pairs, exp table and tensors from the shipped float model,
  exactly; and `quantize` gives the same.
"""

import json
import math
import re
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import shapeml as sm
from shapeml import int8
from shapeml._errors import ShapemlError
from shapeml.apps.int8_sort import TINY_FLOAT_PATH, TINY_MODEL_PATH
from shapeml.apps.int8_sort.corpus import TOKENS, make_sequences
from shapeml.apps.int8_sort.quantize import quantize
from shapeml.int8 import Int8Model
from shapeml.zoo.transformer import Transformer

DOC = (Path(__file__).parents[1] / "docs" / "int8.md").read_text()
INT32_MAX = 2**31 - 1


def _section(title: str) -> str:
    start = DOC.index(f"## {title}")
    end = DOC.index("\n## ", start + 1)
    return DOC[start:end]


def doc_overflow_table() -> dict[str, str]:
    """intermediate -> formula, as the doc's "Overflow bounds" table writes them."""
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]+)` \|$", _section("Overflow bounds"), re.M)
    assert len(rows) >= 10, rows
    return dict(rows)


def doc_caps() -> dict[str, int]:
    """The size caps, as the doc's validation order states them."""
    text = _section("The model file")
    dim_cap = int(re.search(r"`d, heads, d_ff, ctx <= (\d+)`", text)[1])
    vocab_cap = int(re.search(r"`vocab <= (\d+)`", text)[1])
    weights = re.search(r"at most `2\*\*(\d+)` int8 weights", text)[1]
    return dict(
        d=dim_cap,
        heads=dim_cap,
        d_ff=dim_cap,
        ctx=dim_cap,
        vocab=vocab_cap,
        weights=2 ** int(weights),
    )


def evaluate(formula: str, d: int, dh: int, F: int, T: int, table0: int) -> int:
    expr = formula.replace("exp_table[0]", "table0")
    assert re.fullmatch(r"[\w\s*+()]+", expr), formula  # products and sums of the names only
    return eval(expr, {}, dict(d=d, dh=dh, F=F, T=T, table0=table0))  # noqa: S307


def test_the_overflow_table_at_the_caps_stays_below_int32():
    caps = doc_caps()
    worst = {
        name: evaluate(f, d=caps["d"], dh=caps["d"], F=caps["d_ff"], T=caps["ctx"], table0=32767)
        for name, f in doc_overflow_table().items()
    }
    assert max(worst.values()) <= INT32_MAX // 4  # the doc's "a factor of 4 to spare"
    # the doc's figures: the divisor is the largest, then the numerator, then dist
    assert worst["2 * z"] == 536_854_528 == max(worst.values()) and worst["2 * z"] < 2**29
    assert worst["254 * e + z"] == 276_750_082 and worst["dist"] == 2**28
    # the divisor 2*z exceeds the numerator's bound (254 + T) * e0 whenever T > 254
    assert worst["2 * z"] > worst["254 * e + z"]


@pytest.mark.parametrize(
    "dims",
    [
        dict(d=16, heads=2, d_ff=24, vocab=7, ctx=5, table_len=8),
        dict(d=24, heads=3, d_ff=40, vocab=11, ctx=9, table_len=128),
    ],
)
def test_the_validator_bounds_are_the_doc_table(dims):
    m = Int8Model.random(0, **dims)
    table = doc_overflow_table()
    bounds = m.bounds()
    assert list(bounds) == list(table)  # same intermediates, same order
    t0 = int(m.exp_table[0])
    for name, (bound, formula) in bounds.items():
        assert formula == table[name]
        dh = dims["d"] // dims["heads"]
        want = evaluate(formula, d=dims["d"], dh=dh, F=dims["d_ff"], T=dims["ctx"], table0=t0)
        assert bound == want, name


def _big_file(d: int, heads: int, d_ff: int, ctx: int, vocab: int) -> dict:
    """A file with the given dims, a full-scale exp table and (too short) placeholder tensors."""
    base = json.loads(TINY_MODEL_PATH.read_text())
    return dict(
        base,
        dims=dict(d=d, heads=heads, d_ff=d_ff, vocab=vocab, ctx=ctx),
        tokens=[f"t{i}" for i in range(vocab)],
        exp_table=int8.exp_table(0.1),
    )


def test_the_validator_passes_the_bounds_of_the_largest_capped_dims():
    caps = doc_caps()
    # ctx and d_ff at their caps, one head (dh = d), within the weight cap: the bounds step
    # passes (no E1606), the first failure is the placeholder tensors' length (E1602)
    obj = _big_file(d=1024, heads=1, d_ff=caps["d_ff"], ctx=caps["ctx"], vocab=64)
    with pytest.raises(int8.Int8ShapeError, match="tensors.embed"):
        Int8Model.from_json(obj)


@pytest.mark.parametrize(
    "dims,text",
    [
        # beyond a cap, where a bound would also overflow: the cap (E1607) is checked first
        (dict(d=16, heads=1, d_ff=8, ctx=70_000, vocab=4), "`dims.ctx` = 70000 exceeds"),
        (dict(d=2**18, heads=1, d_ff=8, ctx=4, vocab=4), "`dims.d` = 262144 exceeds"),
        (dict(d=16, heads=1, d_ff=2**18, ctx=4, vocab=4), "`dims.d_ff` = 262144 exceeds"),
    ],
)
def test_caps_come_before_bounds(dims, text):
    table, caps = doc_overflow_table(), doc_caps()
    worst = max(
        evaluate(f, d=dims["d"], dh=dims["d"], F=dims["d_ff"], T=dims["ctx"], table0=32767)
        for f in table.values()
    )
    assert worst > INT32_MAX and any(dims[k] > caps[k] for k in dims)
    with pytest.raises(int8.Int8SizeError, match=re.escape(text)) as info:
        Int8Model.from_json(_big_file(**dims))
    assert info.value.code == "E1607"


# -- requant_pair: the doc's rule, written again in exact arithmetic ---------------------------


def doc_requant_pair(scale: float, max_shift: int = 40) -> tuple[int, int]:
    """docs/int8.md, "Post-training quantization", step 6, in rationals."""
    x = Fraction(scale)  # "the exact value of its float64"
    fitting = [s for s in range(1, max_shift + 1) if x * 2**s <= INT32_MAX]
    s = max(fitting) if fitting else 1
    m = math.floor(x * 2**s + Fraction(1, 2))  # nearest, ties up
    return min(max(m, 1), INT32_MAX), s


def _scales(n: int) -> list[float]:
    rng = np.random.default_rng(0)
    out = [float(v) for v in 10.0 ** rng.uniform(-14, 11, n)]
    out += [float(v) for v in rng.uniform(0, 1, n // 4)]
    # exact ties: scale * 2**S = k + 1/2 for the shift the rule picks
    for k in rng.integers(2**30, 2**31 - 1, n // 4):
        out.append((int(k) + 0.5) / 2**40 / 2 ** int(rng.integers(0, 9)))
    out += [(2**30 + 0.5) / 2**40, (2**31 - 1.5) / 2**40, 0.5 / 2**40, 0.49 / 2**40]
    out += [5e-324, 1e-300, 2.0**-41, 2.0**30, 2.0**30 + 1, 1e300, 1.7976931348623157e308]
    out += [(2**31 - 1) / 2**s for s in (1, 5, 40)] + [2**31 / 2**s for s in (1, 5, 40)]
    return out


def test_requant_pair_is_the_doc_rule():
    scales = _scales(400)
    for scale in scales:
        for max_shift in (40, 62, 1):
            assert int8.requant_pair(scale, max_shift=max_shift) == doc_requant_pair(
                scale, max_shift
            ), (scale, max_shift)
    # the doc's named cases
    assert int8.requant_pair((2**30 + 0.5) / 2**40) == (2**30 + 1, 40)  # a tie rounds up
    assert int8.requant_pair(0.49 / 2**40) == (1, 40)  # never M = 0
    assert int8.requant_pair(1e300) == (INT32_MAX, 1)  # saturates, no overflow
    assert len(scales) > 500


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), True, "1", None])
def test_requant_pair_refuses_what_is_not_a_positive_finite_scale(bad):
    with pytest.raises(ShapemlError) as info:
        int8.requant_pair(bad)
    assert info.value.code in ("E0002", "E0003")
    with pytest.raises(ShapemlError):
        int8.requant_pair(1.0, max_shift=63)


# -- the exporter, rebuilt from the doc's recipe --------------------------------------------


def doc_quantize(w: dict[str, np.ndarray], calib: np.ndarray, heads: int) -> dict:
    """docs/int8.md, "Post-training quantization", steps 2 to 7, from the text."""
    n, t = calib.shape
    d = w["embed"].shape[1]
    dh = d // heads
    x0 = w["embed"][calib] + w["pos"][:t]
    q, k, v = x0 @ w["wq"], x0 @ w["wk"], x0 @ w["wv"]
    attn = np.zeros_like(q)
    causal = np.tril(np.ones((t, t), bool))
    for a in range(heads):
        cols = slice(a * dh, (a + 1) * dh)
        s = np.einsum("bid,bjd->bij", q[..., cols], k[..., cols]) / math.sqrt(dh)
        s = np.where(causal, s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p = p / p.sum(-1, keepdims=True)
        attn[..., cols] = p @ v[..., cols]
    x1 = x0 + attn @ w["wo"]
    h = np.maximum(x1 @ w["w1"], 0)
    x2 = x1 + h @ w["w2"]
    act = dict(x0=x0, x1=x1, x2=x2, q=q, k=k, v=v, attn=attn, h=h)
    s = {name: float(np.abs(a).max()) / 127 for name, a in act.items()}
    sw = {name: float(np.abs(w[name]).max()) / 127 for name in ("wq", "wk", "wv", "wo", "w1", "w2")}
    s_e = float(np.abs(w["embed"]).max()) / 127

    def q8(x, scale):
        return np.clip(np.floor(x / scale + 0.5), -128, 127).astype(int).reshape(-1).tolist()

    ratios = {
        "q": s["x0"] * sw["wq"] / s["q"],
        "k": s["x0"] * sw["wk"] / s["k"],
        "v": s["x0"] * sw["wv"] / s["v"],
        "score": s["q"] * s["k"] / (math.sqrt(dh) * 0.1),
        "attn": s["v"] / (127 * s["attn"]),
        "wo": s["attn"] * sw["wo"] / s["x1"],
        "res1": s["x0"] / s["x1"],
        "w1": s["x1"] * sw["w1"] / s["h"],
        "w2": s["h"] * sw["w2"] / s["x2"],
        "res2": s["x1"] / s["x2"],
    }
    tensors = {"embed": q8(w["embed"], s["x0"]), "positions": q8(w["pos"], s["x0"])}
    tensors |= {name: q8(w[name], sw[name]) for name in ("wq", "wk", "wv", "wo", "w1", "w2")}
    tensors["eq"] = q8(w["embed"], s_e)
    return {
        "requant": {name: list(doc_requant_pair(r)) for name, r in ratios.items()},
        "exp_table": [math.floor(32767 * math.exp(-0.1 * i) + 0.5) for i in range(128)],
        "tensors": tensors,
    }


def test_the_shipped_file_is_rebuilt_from_the_doc():
    shipped = json.loads(TINY_MODEL_PATH.read_text())
    fm = sm.load(TINY_FLOAT_PATH, Transformer)
    w = {name: np.asarray(getattr(fm, name), np.float64) for name in ("embed", "pos")}
    w |= {
        n: np.asarray(getattr(fm, n)[0], np.float64) for n in ("wq", "wk", "wv", "wo", "w1", "w2")
    }
    seed = shipped["meta"]["train"]["seed"]
    calib = make_sequences(256, shipped["dims"]["ctx"], seed=seed + 500)
    rebuilt = doc_quantize(w, calib, shipped["dims"]["heads"])
    assert rebuilt["requant"] == shipped["requant"]
    assert rebuilt["exp_table"] == shipped["exp_table"]
    assert list(rebuilt["tensors"]) == list(shipped["tensors"])
    for name, values in rebuilt["tensors"].items():
        assert values == shipped["tensors"][name], name
    # and the library's quantizer writes the same file
    out = quantize(fm, calib, TOKENS)
    assert out["requant"] == shipped["requant"] and out["tensors"] == shipped["tensors"]
