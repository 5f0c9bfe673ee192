"""Every int8 boundary checks before it acts (issue 11): token ids, positions, prompts and `n` on
their exact values, the JSON reader on every way a file can be broken, and the `shapeml int8`
flags before any work. Each failure is a coded error naming the problem, never a raw exception.
"""

import json

import jax
import numpy as np
import pytest

from shapeml import int8
from shapeml._errors import ShapemlError
from shapeml.apps.int8_sort import TINY_MODEL_PATH
from shapeml.apps.int8_sort.cli import main
from shapeml.int8 import Int8Model, Tokenizer

DIMS = dict(d=16, heads=2, d_ff=8, vocab=6, ctx=5, table_len=8)
NOT_IDS = [3.7, "5", True, np.int64(2**40), -1, 6, 2**70, np.float32(1), None, [1], np.array([1])]


@pytest.fixture(scope="module")
def m():
    return Int8Model.random(0, **DIMS)


def _zeros(m):
    return np.zeros((m.ctx, m.d), np.int8), np.zeros((m.ctx, m.d), np.int8)


def coded(cls, code, fn, *args, **kw):
    with pytest.raises(cls) as info:
        fn(*args, **kw)
    assert isinstance(info.value, ShapemlError) and info.value.code == code, info.value
    assert len(str(info.value)) < 600  # shortened, never the whole value
    return info.value


@pytest.mark.parametrize("tok", NOT_IDS, ids=repr)
def test_token_ids_are_checked_before_conversion(m, tok):
    coded(int8.Int8TokenError, "E1608", m.decode_step, tok, 0, m.init_cache())
    coded(int8.Int8TokenError, "E1608", m.reference_step, tok, 0, *_zeros(m))
    coded(int8.Int8TokenError, "E1608", m.step_intermediates, tok, 0, m.init_cache())
    coded(int8.Int8TokenError, "E1608", m.generate, [1, tok], 1)
    coded(int8.Int8TokenError, "E1608", m.reference_generate, [tok], 1)
    coded(int8.Int8TokenError, "E1608", m.decode, [0, tok])


def test_decode_refuses_negative_ids_instead_of_indexing_from_the_end(m):
    err = coded(int8.Int8TokenError, "E1608", m.decode, [-1])
    assert "`ids[0]` = -1" in str(err)
    coded(int8.Int8TokenError, "E1608", m.decode, np.array([0, -1]))
    coded(int8.Int8TokenError, "E1608", m.decode, np.array([0, 6], np.uint8))
    coded(int8.Int8TokenError, "E1608", m.decode, "t1 t2")
    coded(int8.Int8TokenError, "E1608", m.decode, 3)
    assert m.decode(np.array([1, 2])) == m.decode([1, 2]) == "t1 t2"
    assert m.decode([]) == ""


@pytest.mark.parametrize("pos", [2.5, True, "1", np.float64(1.0), 2**70, -1, 5, None])
def test_positions_are_checked_before_conversion(m, pos):
    coded(int8.Int8PositionError, "E1610", m.decode_step, 1, pos, m.init_cache())
    coded(int8.Int8PositionError, "E1610", m.reference_step, 1, pos, *_zeros(m))


def test_integer_scalars_of_any_kind_are_accepted(m):
    logits, nxt, cache = m.decode_step(np.int64(1), np.int32(0), m.init_cache())
    ref = m.reference_step(1, 0, *_zeros(m))
    assert int(nxt) == int(ref["next"])
    # the returned `next` (a 0-d JAX array) feeds the next step as it is
    _, nxt2, _ = m.decode_step(nxt, jax.numpy.int32(1), cache)
    ref2 = m.reference_step(int(nxt), 1, ref["k_cache"], ref["v_cache"])
    assert int(nxt2) == int(ref2["next"])


@pytest.mark.parametrize("n", [-1, 2.5, True, "3", None, np.float64(2.0)])
def test_n_is_checked(m, n):
    coded(int8.Int8PromptError, "E1609", m.generate, [1], n)
    coded(int8.Int8PromptError, "E1609", m.reference_generate, [1], n)


def test_n_zero_generates_nothing(m):
    assert m.generate([1], 0) == [] == m.generate([1, 2, 3], 0)
    gen, preds = m.reference_generate([1, 2, 3], 0)
    assert gen == [] and preds == m.prompt_next_tokens([1, 2, 3])[:2]
    buf, preds, _ = m.generate_arrays([1, 2, 3], 0)
    assert np.asarray(buf).tolist() == [1, 2, 3, 0, 0, 0]
    assert np.asarray(preds).tolist() == [*gen_preds(m, [1, 2, 3]), 0, 0, 0]


def gen_preds(m, prompt):
    return m.reference_generate(prompt, 0)[1]


@pytest.mark.parametrize("prompt", ["t1 t2", b"\x01", None, 5, {1: 2}, list(range(10**6))])
def test_prompts_that_are_not_token_lists(m, prompt):
    coded(int8.Int8PromptError, "E1609", m.generate, prompt, 1)


@pytest.mark.parametrize("tp", [[1], 2.5, 0, -1, "2", True])
def test_tp_is_checked(m, tp):
    coded(int8.Int8TensorParallelError, "E1611", m.decode_step, 1, 0, m.init_cache(), tp=tp)


# -- vocabulary and text -----------------------------------------------------------------------


def test_vocabulary_rules():
    coded(int8.Int8VocabularyError, "E1613", Tokenizer, ("a", "b", "a"))
    coded(int8.Int8VocabularyError, "E1613", Tokenizer, ("ab", ""))
    coded(int8.Int8VocabularyError, "E1613", Tokenizer, ("ab", "c d"))
    coded(int8.Int8VocabularyError, "E1613", Tokenizer, ("ab", "c\u00a0"))  # unicode space
    # a character vocabulary may hold whitespace: each character is a token
    tok = Tokenizer((" ", "a", "\n"))
    assert tok.encode(" a\n") == [0, 1, 2] and tok.decode([2, 0, 1]) == "\n a"
    words = Tokenizer(("ab", "c", "d"))
    assert words.encode("  ab\tc \n d ") == [0, 1, 2] and words.decode([0, 2]) == "ab d"
    assert words.encode("") == [] == words.encode("   ")
    coded(int8.Int8TokenError, "E1608", words.encode, "ab x")


# -- the JSON reader ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def text():
    return TINY_MODEL_PATH.read_text()


def _file(tmp_path, data: str | bytes):
    path = tmp_path / "m.json"
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def test_truncated_file(tmp_path, text):
    err = coded(int8.Int8JsonError, "E1614", Int8Model.from_json, _file(tmp_path, text[:5000]))
    assert "line 1" in str(err)


def test_not_utf8(tmp_path, text):
    data = text.encode().replace(b'"fcak', b'"\xff\xfe', 1)
    coded(ShapemlError, "E1302", Int8Model.from_json, _file(tmp_path, data))


def test_nesting_100k_deep(tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    err = coded(int8.Int8JsonError, "E1614", Int8Model.from_json, _file(tmp_path, deep))
    assert "nested deeper" in str(err)
    obj = json.loads(TINY_MODEL_PATH.read_text())
    obj["meta"] = '{"a": ' * 5 + "[" * 100_000 + "]" * 100_000 + "}" * 5
    coded(int8.Int8JsonError, "E1614", Int8Model.from_json, _file(tmp_path, _raw(obj)))


@pytest.mark.parametrize(
    "old,new,key",
    [
        ('"format":', '"format":"x","format":', "'format'"),  # at the top level
        ('"heads":4', '"heads":4,"heads":8', "'heads'"),  # inside dims
        ('"d_ff":64,', '"d_ff":64,"d_ff":64,', "'d_ff'"),  # even with the same value
        ('"meta":{', '"meta":{"a":1,"a":2,', "'a'"),  # inside the free-form notes
    ],
)
def test_a_key_repeated_in_one_object_is_refused(tmp_path, text, old, new, key):
    assert old in text
    path = _file(tmp_path, text.replace(old, new, 1))
    err = coded(int8.Int8JsonError, "E1614", Int8Model.from_json, path)
    assert f"repeats the key {key}" in str(err)


def _raw(obj):
    """The file with `meta` spliced in as raw JSON text."""
    meta = obj.pop("meta")
    return json.dumps(obj)[:-1] + ', "meta": ' + meta + "}"


def test_deep_values_in_a_parsed_object(text):
    deep = []
    for _ in range(100_000):
        deep = [deep]
    obj = json.loads(text)
    obj["meta"] = {"x": deep}
    coded(int8.Int8FileError, "E1601", Int8Model.from_json, obj)
    obj = json.loads(text)
    obj["tensors"]["wq"][3] = deep
    err = coded(int8.Int8ValueError, "E1603", Int8Model.from_json, obj)
    assert "nested too deep to show" in str(err)


def test_huge_numbers(tmp_path, text):
    obj = json.loads(text)
    obj["tensors"]["w1"][7] = 2**70
    err = coded(int8.Int8ValueError, "E1603", Int8Model.from_json, _file(tmp_path, json.dumps(obj)))
    assert "`tensors.w1[7]` = 1180591620717411303424" in str(err)
    obj = json.loads(text)
    obj["exp_table"][0] = 2**70
    coded(int8.Int8ExpTableError, "E1604", Int8Model.from_json, obj)
    obj = json.loads(text)
    obj["requant"]["q"] = [2**70, 3]
    coded(int8.Int8RequantError, "E1605", Int8Model.from_json, obj)
    big = text.replace('"d":32', '"d":' + "9" * 5000, 1)  # past Python's int-parsing limit
    coded(int8.Int8JsonError, "E1614", Int8Model.from_json, _file(tmp_path, big))


@pytest.mark.parametrize(
    "path,value,cls,code",
    [
        (("tensors", "wq"), [[1, 2]] * 1024, int8.Int8ValueError, "E1603"),  # mis-nested
        (("tensors", "wq"), [[1, 2]] * 3, int8.Int8ShapeError, "E1602"),  # ragged
        (("tensors", "wq"), {"0": 1}, int8.Int8FileError, "E1601"),
        (("dims",), [32, 4, 64, 14, 64], int8.Int8FileError, "E1601"),
        (("dims", "d"), [32], int8.Int8SizeError, "E1607"),
        (("requant", "q"), [[1], [2]], int8.Int8RequantError, "E1605"),
        (("requant",), [[1, 2]] * 10, int8.Int8FileError, "E1601"),
        (("exp_table",), [[32767]], int8.Int8ExpTableError, "E1604"),
        (("tokens",), [["a"]] * 14, int8.Int8FileError, "E1601"),
        (("format",), "x" * 10**7, int8.Int8FormatError, "E1612"),
        (("tensors", "eq"), list(range(1000)), int8.Int8ShapeError, "E1602"),
    ],
)
def test_mis_nested_and_ragged_tables(text, path, value, cls, code):
    obj = json.loads(text)
    target = obj
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    coded(cls, code, Int8Model.from_json, obj)


def test_a_huge_file_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:  # sparse: no disk is used, no byte is read
        f.truncate(2**29 + 1)
    err = coded(int8.Int8JsonError, "E1614", Int8Model.from_json, path)
    assert "536,870,913 bytes" in str(err)


# -- the `shapeml int8` command ------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "--prompt", "fcak>", "--repeat", "0"],
        ["generate", "--prompt", "fcak>", "--repeat", "-3"],
        ["generate", "--prompt", "fcak>", "-n", "0"],
        ["generate", "--prompt", "fcak>", "-n", "2.5"],
        ["generate", "--prompt", "fcak>", "--tp", "0"],
        ["generate", "--prompt", "fcak>", "--tp", "x"],
        ["train", "--steps", "-5"],
        ["train", "--lr", "nan"],
        ["train", "--d", "100000"],
        ["train", "--batch", "0"],
        ["train", "--seed", "-1"],
    ],
)
def test_bad_flags_are_one_coded_line_and_status_2(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: [E2101]") and "\n" not in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv,code",
    [
        (["generate", "--prompt", "fcak>", "--model", "/no/such/model.json"], "E"),
        (["generate", "--prompt", ""], "E2101"),
        (["check", "/no/such/model.json"], "E"),
        (["train", "--heads", "3", "--steps", "1"], "E2101"),
        (["train", "--out", "/no/such/folder/m.json", "--steps", "1"], "E2102"),
        (["train", "--out", "m.json", "--float-out", "/no/such/f.safetensors"], "E2102"),
    ],
)
def test_bad_paths_and_combinations_are_caught_before_any_work(argv, code, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: [{code}") and "\n" not in err and "Traceback" not in err


def test_a_bad_model_file_is_a_failure_status_1(tmp_path, capsys):
    path = _file(tmp_path, "[" * 100_000)
    assert main(["check", str(path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: [E1614]") and "\n" not in err
