"""Loading and validating int8 model files (the JSON import/export): round trips and every
validation error, also when a checkpoint (`sm.load`) holds bad tables."""

import copy
import json

import numpy as np
import pytest
import safetensors
import safetensors.numpy

import shapeml as sm
from shapeml import ShapemlError, int8
from shapeml.int8 import Int8Model


@pytest.fixture(scope="module")
def base():
    return Int8Model.random(0, d=16, heads=2, d_ff=24, vocab=7, ctx=5, table_len=9).to_dict()


def bad(base, edit):
    obj = copy.deepcopy(base)
    edit(obj)
    return obj


def test_round_trip_through_a_file(base, tmp_path):
    m = Int8Model.from_json(base)
    path = tmp_path / "m.json"
    text = m.to_json(path)
    assert path.read_text() == text
    m2 = Int8Model.from_json(path)
    assert m2.to_dict() == base
    assert m2.generate([1, 2], 3) == m.generate([1, 2], 3)
    assert json.loads(path.read_text())["format"] == int8.FORMAT
    assert list(tmp_path.iterdir()) == [path]  # no temp file left behind


def test_the_model_is_an_sm_model_in_shared_dims(base, tmp_path):
    m = Int8Model.from_json(base)
    assert isinstance(m, sm.Model) and issubclass(Int8Model, sm.Model)
    assert dict(m.dims) == {"V": 7, "T": 5, "D": 16, "H": 2, "F": 24, "E": 9, "Dh": 8}
    assert m.file_dims == base["dims"]
    assert m.tokens == tuple(base["tokens"]) and m.meta == base["meta"]
    assert m.requant == {k: tuple(v) for k, v in base["requant"].items()}
    assert [m.requant_pairs[i].tolist() for i in range(10)] == [
        base["requant"][n] for n in int8.REQUANT_POINTS
    ]
    assert m.wq.dtype == np.int8 and m.exp_table.dtype == np.int32
    assert list(m.tensors) == list(base["tensors"])
    sm.save(tmp_path / "m.safetensors", m)
    assert sm.load(tmp_path / "m.safetensors", Int8Model).to_dict() == base


def test_init_builds_a_valid_model_of_zero_weights():
    m = Int8Model.init(0, tokens=("a", "b", "c"), V=3, T=4)
    assert m.file_dims == {"d": 32, "heads": 4, "d_ff": 64, "vocab": 3, "ctx": 4}
    assert m.generate([1, 2], 2) == m.reference_generate([1, 2], 2)[0] == [0, 0]
    with pytest.raises(int8.Int8ShapeError, match="V = 3"):
        Int8Model.init(0, tokens=("a",), V=3)


def test_bad_tables_are_refused_outside_the_json_path_too(base):
    # every build runs the same checks: replace, sm.load, direct construction
    m = Int8Model.from_json(base)
    pairs = np.array(m.requant_pairs)
    pairs[0, 1] = 0
    with pytest.raises(int8.Int8RequantError, match="shift S = 0"):
        m.replace(requant_pairs=pairs)
    with pytest.raises(int8.Int8ExpTableError, match="increases"):
        m.replace(exp_table=np.arange(9, dtype=np.int32))
    with pytest.raises(int8.Int8ShapeError, match="V = 7"):
        m.replace(tokens=("a", "b"))
    with pytest.raises(ShapemlError, match="wq"):
        m.replace(wq=np.zeros((16, 15), np.int8))


def test_sizes_bounds_and_tokens_are_checked_on_every_build(base, tmp_path):
    # the JSON path's size, bounds and token checks run on init, replace and sm.load too
    # the caps come first: they are the real guard (under them no int32 bound can overflow)
    with pytest.raises(int8.Int8SizeError, match="`dims.ctx` = 140000 exceeds"):
        Int8Model.init(0, tokens=tuple("abc"), V=3, T=140000, D=8, H=2, F=8)
    with pytest.raises(int8.Int8SizeError, match="`dims.ctx` = 9000 exceeds"):
        Int8Model.init(0, tokens=tuple("abc"), V=3, T=9000, D=8, H=2, F=8)
    with pytest.raises(int8.Int8SizeError, match="does not divide"):
        Int8Model.init(0, tokens=tuple("abc"), V=3, D=8, H=3)
    m = Int8Model.from_json(base)
    with pytest.raises(int8.Int8VocabularyError, match="two ids the same way"):
        m.replace(tokens=("a",) * 7)
    with pytest.raises(int8.Int8VocabularyError, match="empty string"):
        m.replace(tokens=("", *m.tokens[1:]))
    # sm.load: a checkpoint whose statics or dims break the invariants is refused
    sm.save(tmp_path / "m.safetensors", m)
    arrays = safetensors.numpy.load_file(tmp_path / "m.safetensors")
    with safetensors.safe_open(tmp_path / "m.safetensors", "np") as f:
        meta = f.metadata()
    meta = dict(meta, **{"shapeml.static": json.dumps({"tokens": ["a"] * 7, "meta_json": "{}"})})
    safetensors.numpy.save_file(arrays, tmp_path / "dup.safetensors", meta)
    with pytest.raises(int8.Int8VocabularyError, match="two ids the same way"):
        sm.load(tmp_path / "dup.safetensors", Int8Model)
    dims = dict(V=3, T=140000, D=8, H=2, F=8, E=4)
    big = {
        n: np.zeros(s.shape_in(Int8Model.dims.resolve(**dims)), np.int8)
        for n, s in Int8Model.__shapeml_fields__.items()
        if s.dtype == np.int8
    }
    big["exp_table"] = np.array([4, 3, 2, 1], np.int32)
    big["requant_pairs"] = np.ones((10, 2), np.int32)
    meta = dict(
        meta,
        **{
            "shapeml.static": json.dumps({"tokens": list("abc"), "meta_json": "{}"}),
            "shapeml.dims": json.dumps(dims),
        },
    )
    safetensors.numpy.save_file(big, tmp_path / "big.safetensors", meta)
    with pytest.raises(int8.Int8SizeError, match="`dims.ctx` = 140000 exceeds the limit 8192"):
        sm.load(tmp_path / "big.safetensors", Int8Model)


def test_shape_errors_name_the_files_dims(base):
    obj = bad(base, _set(["tensors", "positions"], [0] * 3))
    with pytest.raises(int8.Int8ShapeError, match=r"\[ctx d\] = \(5, 16\)"):
        Int8Model.from_json(obj)
    obj = bad(base, _set(["tensors", "wq"], [0] * 3))
    with pytest.raises(int8.Int8ShapeError, match=r"\[d heads\*\(d/heads\)\]"):
        Int8Model.from_json(obj)


def _set(path, value):
    def edit(obj):
        *head, last = path
        for k in head:
            obj = obj[k]
        obj[last] = value

    return edit


def _del(path):
    def edit(obj):
        *head, last = path
        for k in head:
            obj = obj[k]
        del obj[last]

    return edit


CASES = [
    # (edit, error class, code, text the message must contain)
    (_del(["tensors"]), int8.Int8FileError, "E1601", "missing the key `tensors`"),
    (_del(["tensors", "w1"]), int8.Int8FileError, "E1601", "`tensors` is missing the key `w1`"),
    (
        _del(["requant", "score"]),
        int8.Int8FileError,
        "E1601",
        "`requant` is missing the key `score`",
    ),
    (_set(["tensors", "w3"], [1]), int8.Int8FileError, "E1601", "`w3`"),
    (_set(["dim"], {}), int8.Int8FileError, "E1601", "similar name exists: `dims`"),
    (_set(["format"], "other"), int8.Int8FormatError, "E1612", "`format` is 'other'"),
    (_set(["format"], ["x"] * 10**5), int8.Int8FormatError, "E1612", "list of 100,000 items"),
    (
        _set(["tensors", "wq"], "abc"),
        int8.Int8FileError,
        "E1601",
        "`tensors.wq` must be a flat list",
    ),
    (_set(["tokens"], ["a"] * 7), int8.Int8VocabularyError, "E1613", "ids 0 and 1 are both 'a'"),
    (_set(["tokens", 3], ""), int8.Int8VocabularyError, "E1613", "`tokens[3]` is the empty"),
    (_set(["tokens", 2], "a b"), int8.Int8VocabularyError, "E1613", "`tokens[2]` = 'a b' holds"),
    (_set(["tokens", 2], 5), int8.Int8FileError, "E1601", "list of strings"),
    (_set(["meta"], [1]), int8.Int8FileError, "E1601", "`meta`"),
    (_set(["tensors", "wq"], [0] * 255), int8.Int8ShapeError, "E1602", "needs 256"),
    (_set(["tensors", "positions"], [0] * 81), int8.Int8ShapeError, "E1602", "[ctx d] = (5, 16)"),
    (_set(["tokens"], ["a", "b"]), int8.Int8ShapeError, "E1602", "dims.vocab = V = 7"),
    (_set(["tensors", "w2", 5], 128), int8.Int8ValueError, "E1603", "`tensors.w2[5]` = 128"),
    (_set(["tensors", "eq", 0], -129), int8.Int8ValueError, "E1603", "-129"),
    (_set(["tensors", "wv", 3], 1.5), int8.Int8ValueError, "E1603", "`tensors.wv[3]` = 1.5"),
    (_set(["tensors", "wv", 2], True), int8.Int8ValueError, "E1603", "`tensors.wv[2]` = True"),
    (_set(["exp_table"], []), int8.Int8ExpTableError, "E1604", "holds 0"),
    (_set(["exp_table"], [100, 50, 60]), int8.Int8ExpTableError, "E1604", "index 2: 50 then 60"),
    (_set(["exp_table"], [0, 0]), int8.Int8ExpTableError, "E1604", "`exp_table[0]` is 0"),
    (_set(["exp_table"], [40000, 1]), int8.Int8ExpTableError, "E1604", "40000"),
    (_set(["exp_table"], [5] * 129), int8.Int8ExpTableError, "E1604", "holds 129"),
    (_set(["exp_table"], "x"), int8.Int8FileError, "E1601", "`exp_table`"),
    (_set(["requant", "w1"], [1, 63]), int8.Int8RequantError, "E1605", "`requant.w1` shift S = 63"),
    (_set(["requant", "q"], [1, 0]), int8.Int8RequantError, "E1605", "shift S = 0"),
    (
        _set(["requant", "wo"], [2**31, 5]),
        int8.Int8RequantError,
        "E1605",
        "multiplier M = 2147483648",
    ),
    (_set(["requant", "v"], [0, 5]), int8.Int8RequantError, "E1605", "M = 0"),
    (_set(["requant", "k"], [3]), int8.Int8RequantError, "E1605", "pair [M, S]"),
    (_set(["dims", "d"], 200_000), int8.Int8SizeError, "E1607", "`dims.d` = 200000 exceeds"),
    (_set(["dims", "d_ff"], 140_000), int8.Int8SizeError, "E1607", "`dims.d_ff` = 140000"),
    (_set(["dims", "ctx"], 2**70), int8.Int8SizeError, "E1607", f"`dims.ctx` = {2**70}"),
    (_set(["dims", "vocab"], 10**9), int8.Int8SizeError, "E1607", "`dims.vocab` = 1000000000"),
    (_set(["dims", "heads"], 3), int8.Int8SizeError, "E1607", "does not divide `dims.d`=16"),
    (_set(["dims", "ctx"], 0), int8.Int8SizeError, "E1607", "`dims.ctx` must be a positive"),
    (_set(["dims", "d"], "16"), int8.Int8SizeError, "E1607", "`dims.d`"),
    (_set(["dims", "d_ff"], 8000), int8.Int8SizeError, "E1607", "weights"),
]


@pytest.mark.parametrize("edit,cls,code,text", CASES, ids=[c[3][:30] for c in CASES])
def test_every_validation_error(base, edit, cls, code, text):
    obj = bad(base, edit)
    if code == "E1607" and text == "weights":  # within every cap, too many weights in all
        obj["dims"].update(d=8192, d_ff=8192, heads=1)
    with pytest.raises(cls) as info:
        Int8Model.from_json(obj)
    err = info.value
    assert isinstance(err, ShapemlError) and err.code == code
    assert text in str(err), str(err)
    assert "help:" in str(err)


def test_not_an_object(tmp_path):
    path = tmp_path / "m.json"
    path.write_text("[1, 2]")
    with pytest.raises(int8.Int8FileError, match="must be a JSON object"):
        Int8Model.from_json(path)


def test_absurd_sizes_fail_before_allocation(base):
    # tensors are still the small ones: the dims check must fire first, without building arrays
    obj = bad(base, _set(["dims", "vocab"], 60000))
    obj["dims"]["ctx"] = 8000
    obj["dims"]["d"] = 8192
    obj["dims"]["heads"] = 1
    with pytest.raises(int8.Int8SizeError, match="weights"):
        Int8Model.from_json(obj)


def test_bounds_and_summary(base):
    m = Int8Model.from_json(base)
    b = m.bounds()
    assert b["q_acc, k_acc, v_acc"][0] == 16 * 128 * 128
    assert b["254 * e + z"][0] == (254 + 5) * int(m.exp_table[0])
    assert b["2 * z"][0] == 2 * 5 * int(m.exp_table[0])
    assert all(v < 2**31 for v, _ in b.values())
    s = m.summary()
    assert "wq" in s and "M=" in s and "2147483647" in s
    assert np.asarray(m.tensors["w1"]).shape == (16, 24)
