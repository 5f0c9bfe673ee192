"""Property tests of the int8 boundaries: mutated model files (as parsed objects and as text),
random token ids, positions, prompts, `n` and vocabularies either give a correct result or raise a
coded `ShapemlError`; never a raw exception, a hang or a large allocation (tracemalloc).

Each test counts the inputs it tried and asserts that both outcomes occurred, so a generator that
stopped producing valid (or invalid) inputs would be noticed.
"""

import contextlib
import json
import tempfile
import tracemalloc
from collections import Counter
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shapeml._errors import ShapemlError
from shapeml.apps.int8_sort import TINY_MODEL_PATH
from shapeml.int8 import Int8Model, Tokenizer

TEXT = TINY_MODEL_PATH.read_text()
BASE = json.loads(TEXT)
FOLDER = Path(tempfile.mkdtemp(prefix="shapeml-fuzz-int8-"))
# The file is 37 KB; validating it builds a few copies of its 5,000 values: never tens of MB.
MAX_PEAK = 32 * 2**20
FAST = settings(
    max_examples=80,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# JSON values of every kind, including the hostile ones: huge integers, floats, deep nesting.
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.integers(min_value=-130, max_value=130),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=12,
)


def _paths(obj, prefix=()):
    """Every path into the object: keys of dicts, indices of short lists and of a few list items."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i in sorted({0, len(obj) // 2, len(obj) - 1}) if obj else []:
            yield from _paths(obj[i], (*prefix, i))


PATHS = [p for p in _paths(BASE) if p and p[0] != "meta"]


def _mutate(obj, path, op, value):
    *head, last = path
    target = obj
    for k in head:
        target = target[k]
    if op == "delete":
        if isinstance(target, dict):
            del target[last]
        else:
            target.pop(last)
    elif op == "set":
        target[last] = value
    elif op == "wrap":  # nesting changed: the value inside a list
        target[last] = [target[last]]
    elif op == "resize" and isinstance(target[last], list):  # lengths changed
        lst = target[last]
        target[last] = lst[: len(lst) // 2] if value is None else lst + [0] * 3
    elif op == "extra" and isinstance(target, dict):
        target[str(value)[:10] + "_extra"] = 1


def outcome(fn, tried: Counter, kind: str):
    """Runs `fn`: its result or a coded error; anything else, a hang or a large peak fails."""
    tracemalloc.start()
    try:
        try:
            result = fn()
            tried[f"{kind}: ok"] += 1
        except ShapemlError as e:
            assert e.code and e.code[0] in "EW", e
            assert len(str(e)) < 2000, "message not shortened"
            result = e
            tried[f"{kind}: {e.code}"] += 1
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MAX_PEAK, f"peak allocation {peak / 2**20:.1f} MiB"
    return result


def _check_model(m):
    """A model the validator let through decodes a step."""
    k = np.zeros((m.ctx, m.d), np.int8)
    r = m.reference_step(0, 0, k, k.copy())
    assert 0 <= int(r["next"]) < m.vocab


def _summary(tried: Counter) -> int:
    total = sum(tried.values())
    print(f"{total} inputs: {dict(sorted(tried.items()))}")
    return total


# A mutated file is validated (and a valid one built) under tracemalloc: ~0.1 s each.
SLOW = settings(FAST, max_examples=30)


def test_mutated_model_objects(record_property):
    tried = Counter()

    @SLOW
    @given(
        st.lists(
            st.tuples(
                st.sampled_from(PATHS),
                st.sampled_from(["delete", "set", "wrap", "resize", "extra"]),
                st.one_of(st.none(), VALUES),
            ),
            min_size=0,
            max_size=3,
        )
    )
    def run(edits):
        obj = json.loads(TEXT)  # a fresh copy, faster than copy.deepcopy
        for path, op, value in edits:
            # an earlier edit may have removed or replaced the path: then the edit does not apply
            with contextlib.suppress(KeyError, IndexError, TypeError):
                _mutate(obj, path, op, value)
        result = outcome(lambda: Int8Model.from_json(obj), tried, "object")
        if not isinstance(result, ShapemlError):
            _check_model(result)

    run()
    total = _summary(tried)
    record_property("inputs", total)
    assert total >= 30
    assert tried["object: ok"] > 0 and len(tried) >= 5  # valid files and many different codes


def test_mutated_model_text(record_property):
    tried = Counter()
    path = FOLDER / "m.json"

    @SLOW
    @given(
        st.integers(min_value=0, max_value=len(TEXT)),
        st.sampled_from(["truncate", "insert", "replace", "nest", "keep"]),
        st.binary(max_size=12),
    )
    def run(at, op, data):
        raw = TEXT.encode()
        if op == "truncate":
            raw = raw[:at]
        elif op == "insert":
            raw = raw[:at] + data + raw[at:]
        elif op == "replace":
            raw = raw[:at] + data + raw[at + len(data) :]
        elif op == "nest":  # nesting far past the parser's recursion limit
            raw = b"[" * (at * 3) + raw + b"]" * (at * 3)
        path.write_bytes(raw)
        result = outcome(lambda: Int8Model.from_json(path), tried, "text")
        if not isinstance(result, ShapemlError):
            _check_model(result)

    run()
    total = _summary(tried)
    record_property("inputs", total)
    assert total >= 30 and tried["text: ok"] > 0 and tried["text: E1614"] > 0


MODEL = Int8Model.random(0, d=16, heads=2, d_ff=8, vocab=6, ctx=5, table_len=8)
# Compile once outside the measured calls: tracing under tracemalloc is slow and not the point.
MODEL.decode_step(0, 0, MODEL.init_cache())
MODEL.generate([0], 1)
Int8Model.from_json(BASE)
IDS = st.one_of(
    st.integers(min_value=-3, max_value=8),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.booleans(),
    st.text(max_size=3),
    st.none(),
    st.builds(np.int64, st.integers(min_value=-(2**63), max_value=2**63 - 1)),
    st.builds(np.uint8, st.integers(min_value=0, max_value=255)),
    st.builds(np.float32, st.floats(width=32)),
    st.builds(np.array, st.integers(min_value=-2, max_value=8)),
    st.lists(st.integers(min_value=0, max_value=5), max_size=2),
)


# Half the draws small integers, most of them valid ids and positions; half anything of IDS.
NEAR = st.one_of(st.integers(min_value=-1, max_value=6), IDS)
PROMPTS = st.one_of(
    st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=4),
    st.lists(NEAR, max_size=7),
    IDS,
)


def test_random_tokens_and_positions(record_property):
    tried = Counter()
    zeros = np.zeros((MODEL.ctx, MODEL.d), np.int8)

    @FAST
    @given(NEAR, NEAR)
    def run(tok, pos):
        ref = outcome(lambda: MODEL.reference_step(tok, pos, zeros, zeros), tried, "reference")
        got = outcome(lambda: MODEL.decode_step(tok, pos, MODEL.init_cache()), tried, "step")
        if isinstance(ref, ShapemlError):  # the two paths refuse the same inputs, alike
            assert isinstance(got, ShapemlError) and got.code == ref.code
        else:
            assert int(got[1]) == int(ref["next"])
            assert np.array_equal(np.asarray(got[0]), ref["logits"])

    run()
    total = _summary(tried)
    record_property("inputs", total)
    assert tried["step: ok"] > 0 and tried["step: E1608"] > 0 and tried["step: E1610"] > 0


def test_random_prompts_and_n(record_property):
    tried = Counter()

    @FAST
    @given(PROMPTS, NEAR)
    def run(prompt, n):
        ref = outcome(lambda: MODEL.reference_generate(prompt, n), tried, "reference")
        got = outcome(lambda: MODEL.generate(prompt, n), tried, "generate")
        if isinstance(ref, ShapemlError):
            assert isinstance(got, ShapemlError) and got.code == ref.code
        else:
            assert got == ref[0] and len(got) == int(n)

    run()
    total = _summary(tried)
    record_property("inputs", total)
    assert tried["generate: ok"] > 0 and tried["generate: E1609"] > 0


def test_random_vocabularies_round_trip(record_property):
    tried = Counter()

    @FAST
    @given(
        st.lists(st.one_of(st.text(max_size=1), st.text(max_size=4)), min_size=1, max_size=6),
        st.lists(NEAR, max_size=6),
    )
    def run(tokens, ids):
        tok = outcome(lambda: Tokenizer(tuple(tokens)), tried, "vocabulary")
        if isinstance(tok, ShapemlError):
            assert tok.code in ("E1601", "E1613")
            return
        text = outcome(lambda: tok.decode(ids), tried, "decode")
        if not isinstance(text, ShapemlError):
            assert tok.encode(text) == [int(i) for i in ids]  # the rules make text round-trip

    run()
    total = _summary(tried)
    record_property("inputs", total)
    assert tried["vocabulary: E1613"] > 0 and tried["decode: ok"] > 0
    assert tried["decode: E1608"] > 0
