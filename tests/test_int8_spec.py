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

import ast
import inspect
import json
import math
import re
from fractions import Fraction
from pathlib import Path

import jax.numpy as jnp
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

LETTERS = "abcdefghijkl"


def doc_make_sequences(n: int, length: int, seed: int) -> np.ndarray:
    """docs/int8.md, "Corpus": the generator behind `make_sequences`, from the text."""
    rng = np.random.default_rng(seed)
    ids = {c: i for i, c in enumerate(LETTERS + ">|")}
    rows = []
    for _ in range(n):
        text = ""
        while len(text) < length:
            k = int(rng.integers(2, 7))
            letters = rng.choice(12, size=k, replace=False)
            text += "".join(LETTERS[i] for i in letters) + ">"
            text += "".join(LETTERS[i] for i in sorted(letters)) + "|"
        rows.append([ids[c] for c in text[:length]])
    return np.asarray(rows, np.int32)


WEIGHT_ORDER = ("wq", "wk", "wv", "wo", "w1", "w2", "embed")
ACT_ORDER = ("x0", "q", "k", "v", "attn", "x1", "h", "x2")


class DocRefusal(Exception):  # noqa: N818 (a result, not an error)
    """The doc says E1615 here, for `name`."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


def doc_quantize(w: dict[str, np.ndarray], calib: np.ndarray, heads: int) -> dict:
    """docs/int8.md, "Post-training quantization (the exporter)", Computation 1 to 8, from the
    text; `w` holds `embed`, `pos` and layer 0 of the others. Raises `DocRefusal` at step 4 / 6."""
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
    sw = {name: float(np.abs(w[name]).max()) / 127 for name in WEIGHT_ORDER}
    for name in (*WEIGHT_ORDER, *ACT_ORDER):  # step 4: the first degenerate scale
        scale = sw[name] if name in sw else s[name]
        if not (scale > 0 and math.isfinite(scale)):
            raise DocRefusal(name)
    s_e = sw.pop("embed")

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
    for name, r in ratios.items():  # step 6's guard
        if not (r > 0 and math.isfinite(r)):
            raise DocRefusal(name)
    tensors = {"embed": q8(w["embed"], s["x0"]), "positions": q8(w["pos"], s["x0"])}
    tensors |= {name: q8(w[name], sw[name]) for name in ("wq", "wk", "wv", "wo", "w1", "w2")}
    tensors["eq"] = q8(w["embed"], s_e)
    scales = dict(s) | {f"w_{name}": v for name, v in sw.items()} | {"eq": s_e}
    return {
        "requant": {name: list(doc_requant_pair(r)) for name, r in ratios.items()},
        "exp_table": [math.floor(32767 * math.exp(-0.1 * i) + 0.5) for i in range(128)],
        "tensors": tensors,
        "scales": scales,
    }


def _weights(fm: Transformer) -> dict[str, np.ndarray]:
    w = {name: np.asarray(getattr(fm, name), np.float64) for name in ("embed", "pos")}
    w |= {
        n: np.asarray(getattr(fm, n)[0], np.float64) for n in ("wq", "wk", "wv", "wo", "w1", "w2")
    }
    return w


def test_make_sequences_is_the_doc_generator():
    for n, length, seed in [(3, 64, 0), (5, 7, 500), (2, 1, 2**40), (1, 200, 3)]:
        np.testing.assert_array_equal(
            make_sequences(n, length, seed=seed), doc_make_sequences(n, length, seed)
        )
    assert make_sequences(2, 9, seed=1).dtype == np.int32


def test_the_shipped_file_is_rebuilt_from_the_doc():
    shipped = json.loads(TINY_MODEL_PATH.read_text())
    fm = sm.load(TINY_FLOAT_PATH, Transformer)
    seed = shipped["meta"]["train"]["seed"]
    calib = doc_make_sequences(256, shipped["dims"]["ctx"], seed + 500)
    rebuilt = doc_quantize(_weights(fm), calib, shipped["dims"]["heads"])
    assert rebuilt["requant"] == shipped["requant"]
    assert rebuilt["exp_table"] == shipped["exp_table"]
    assert list(rebuilt["tensors"]) == list(shipped["tensors"])
    for name, values in rebuilt["tensors"].items():
        assert values == shipped["tensors"][name], name
    # and the library's quantizer writes the same file
    out = quantize(fm, calib, TOKENS)
    assert out["requant"] == shipped["requant"] and out["tensors"] == shipped["tensors"]
    # the float pass's sums run in BLAS's order: the scales agree to their last few bits
    assert rebuilt["scales"] == pytest.approx(shipped["meta"]["scales"], rel=1e-13)
    assert out["meta"]["scales"] == pytest.approx(shipped["meta"]["scales"], rel=1e-13)


def _variants() -> dict[str, Transformer]:
    """Small float models: trained-like random ones and every kind of degenerate one."""
    base = Transformer.init(seed=3, V=9, T=8, D=8, H=2, F=12, L=1)
    out = {f"random{s}": Transformer.init(seed=s, V=9, T=8, D=8, H=2, F=12, L=1) for s in (0, 1)}
    for name in ("wq", "wk", "wv", "wo", "w1", "w2", "embed"):
        out[f"zero {name}"] = base.replace(**{name: getattr(base, name) * 0})
    # x0, q, v and h zero on the calibration data with every weight nonzero: only id 8 (never in
    # the calibration ids) has an embedding, the positions are zero, and the ReLU is dead when
    # x1 = x0 (+ attention) is non-negative and w1 is not positive
    only_last = base.embed.at[:-1].set(0)
    out["zero x0"] = base.replace(embed=only_last, pos=base.pos * 0)
    col0 = jnp.zeros((9, 8)).at[:, 0].set(1.0)  # every row (1, 0, ..., 0)
    out["zero q"] = base.replace(embed=col0, pos=base.pos * 0, wq=base.wq.at[0, 0].set(0))
    out["zero v"] = base.replace(embed=col0, pos=base.pos * 0, wv=base.wv.at[0, 0].set(0))
    out["dead relu"] = base.replace(
        embed=jnp.abs(base.embed),
        pos=jnp.abs(base.pos),
        wv=jnp.abs(base.wv),
        wo=jnp.abs(base.wo),
        w1=-jnp.abs(base.w1),
    )
    out["tiny weights"] = base.replace(wq=base.wq * 1e-30, w2=base.w2 * 1e-30)
    return out


@pytest.mark.parametrize("name,fm", list(_variants().items()), ids=list(_variants()))
def test_quantize_is_the_doc_exporter_degenerate_models_included(name, fm):
    calib = np.random.default_rng(7).integers(0, 8, size=(5, 8))  # never id 8
    try:
        want = doc_quantize(_weights(fm), calib, fm.dims.H)
    except DocRefusal as r:
        with pytest.raises(int8.Int8ScaleError) as info:
            quantize(fm, calib, [f"t{i}" for i in range(9)])
        assert info.value.code == "E1615"
        assert re.search(rf"of (weight|activation) `{r.name}`", str(info.value)), str(info.value)
        if name.startswith("zero "):
            assert r.name == name[5:]  # the doc's order names the root cause
        if name == "dead relu":
            assert r.name == "h" and "ReLU is dead" in str(info.value)
        return
    assert name.startswith(("random", "tiny")), name
    out = quantize(fm, calib, [f"t{i}" for i in range(9)], {"note": 1})
    assert out["requant"] == want["requant"] and out["exp_table"] == want["exp_table"]
    assert out["tensors"] == want["tensors"]
    assert list(out["meta"]) == ["note", "scales"] and out["meta"]["note"] == 1
    assert list(out["meta"]["scales"]) == list(want["scales"])
    assert out["meta"]["scales"] == pytest.approx(want["scales"], rel=1e-13)
    Int8Model.from_json(out)


# -- every signature the doc writes is the code's ---------------------------------------------


def _doc_signature(f) -> str:
    """A signature as docs/int8.md writes it: names and defaults, `*` for keyword-only."""
    parts, star = [], False
    for p in inspect.signature(f).parameters.values():
        if p.name == "self":
            continue
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        if p.default is p.empty:
            parts.append(p.name)
        else:
            default = p.default
            shown = f"int8.{default.__name__}" if callable(default) else repr(default)
            parts.append(f"{p.name}={shown}")
    return ", ".join(parts)


def _callables() -> dict[str, object]:
    from shapeml.apps.int8_sort import corpus

    names = {f"m.{n}": getattr(Int8Model, n) for n in dir(Int8Model) if not n.startswith("_")}
    names |= {f"int8.{n}": getattr(int8, n) for n in int8.__all__}
    names |= {"quantize": quantize, "corpus.make_sequences": corpus.make_sequences}
    return {k: v for k, v in names.items() if callable(v) and not isinstance(v, type)}


def test_the_call_table_writes_every_signature_as_the_code_has_it():
    section = DOC[DOC.index("### What each call returns") : DOC.index("## Text")]
    rows = re.findall(r"^\| `((?:m|int8)\.\w+)\(([^`]*)\)`", section, re.M)
    assert len(rows) >= 20
    funcs = _callables()
    for name, args in rows:
        assert args == _doc_signature(funcs[name]), name


def test_every_call_the_doc_writes_binds_to_the_code():
    funcs = _callables()
    by_name = funcs | {k.split(".")[-1]: v for k, v in funcs.items() if not k.startswith("m.")}
    seen = 0
    for span in re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", DOC, flags=re.S)):
        head = re.match(r"((?:m\.|int8\.|corpus\.)?\w+)\(", span)
        if head is None or head[1] not in by_name:
            continue
        try:  # a signature's bare `*` is not call syntax: what follows it is keywords anyway
            call = ast.parse(span.replace("*, ", ""), mode="eval").body
        except SyntaxError:
            continue
        if any(isinstance(a, ast.Constant) and a.value is Ellipsis for a in call.args):
            continue  # `int8.reference_step(m, ...)`: "and the rest", not a call
        f = by_name[head[1]]
        params = inspect.signature(f).parameters
        args = [None] * (len(call.args) + ("self" in params))
        try:
            inspect.signature(f).bind(*args, **{k.arg: None for k in call.keywords})
        except TypeError as e:
            raise AssertionError(f"docs/int8.md writes `{span}`: {e}") from None
        seen += 1
    assert seen >= 30
