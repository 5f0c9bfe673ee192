"""Every core boundary validates before it acts: models, dims, checkpoints, files, @sm.shaped,
gradients, data and contracts answer a careless or hostile input with a coded error (or the
documented safe behaviour), never a raw exception, a hang, a huge allocation or a lost file."""

import json
import os
import re
import subprocess
import sys
import textwrap
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
from hypothesis import given, settings
from hypothesis import strategies as st
from jaxtyping import Array, Float, Int

import shapeml as sm
from shapeml import _io
from shapeml._io import _atomic, _safetensors, _temps
from shapeml.data import batches, shapes
from shapeml.testing import check_contract


class Block(sm.Model):
    dims = sm.Dims(D=4, F=6)
    w1: Float[Array, "D F"] = sm.param(sm.normal(std=0.1))


class Net(sm.Model):
    dims = sm.Dims(D=4, F=6, L=2, V=5)
    emb: Float[Array, "V D"] = sm.param(sm.normal())
    blocks: tuple[Block, ...] = sm.submodels(Block, "L")
    steps: Int[Array, ""] = sm.buffer(sm.full(5))


def coded(code: str):
    return pytest.raises(sm.ShapemlError, match=code)


# -- 1. sizes are bounded before anything is allocated ---------------------------------------


def test_init_refuses_a_field_larger_than_the_limit_before_drawing_anything():
    drawn = []

    def record(key, shape, dtype):
        drawn.append(shape)
        return jnp.zeros(shape, dtype)

    class Wide(sm.Model):
        dims = sm.Dims(V=5, D=4)
        small: Float[Array, " D"] = sm.param(record)
        emb: Float[Array, "V D"] = sm.param(record)

    with coded("E0906") as e:
        Wide.init(seed=0, D=10**12)
    assert drawn == []  # refused before a single initializer ran
    msg = str(e.value)
    assert "`emb` [V D] = [5 1000000000000] float32" in msg
    assert "20,000,000,000,000 bytes" in msg and "max_bytes=17,179,869,184" in msg
    assert isinstance(e.value, ValueError)


def test_the_whole_model_is_bounded_and_the_limit_is_explicitly_overridable():
    per_model = 4 * (5 * 4) + 2 * 4 * (4 * 6) + 4  # emb, two blocks, steps
    with coded("E0906") as e:
        Net.init(seed=0, max_bytes=per_model - 1)
    assert f"{per_model} bytes in all" in str(e.value) and "`blocks.0.w1`" in str(e.value)
    assert Net.init(seed=0, max_bytes=per_model).emb.shape == (5, 4)
    assert sm.models.DEFAULT_MAX_BYTES == 16 * 2**30


def test_a_huge_submodel_count_is_refused_without_enumerating_it():
    with coded("E0906") as e:
        Net.init(seed=0, L=10**9, max_bytes=10**15)
    assert "tensors and sub-models" in str(e.value)


@pytest.mark.parametrize(
    "value, code", [(-1, "E0002"), (1.5, "E0003"), ("1e9", "E0003"), (True, "E0003")]
)
def test_bad_max_bytes_is_coded(value, code, tmp_path):
    with coded(code):
        Net.init(seed=0, max_bytes=value)
    path = sm.save(tmp_path / "n.safetensors", Net.init(seed=0))
    with coded(code):
        sm.load(path, Net, max_bytes=value)


BAD_DIM_VALUES = [True, 2.5, "3", np.float32(3), -1, 2**70, None, [3], np.int64(2**63 - 1)]


@pytest.mark.parametrize("value", BAD_DIM_VALUES, ids=repr)
def test_bad_dim_values_are_coded_everywhere(value):
    if not isinstance(value, str):  # a string declares a derived dim: "3" is an expression
        with coded("E0903") as e:
            sm.Dims(D=value)
        assert "dim `D` must be a whole number >= 0" in str(e.value)
    with coded("E0904"):
        Net.init(seed=0, D=value)
    with coded("E0904"):
        Net.dims.resolve(D=value)


def test_numpy_integer_dims_are_taken_exactly():
    m = Net.init(seed=0, D=np.int64(3), L=np.int32(1))
    assert m.emb.shape == (5, 3) and type(m.dims.D) is int and len(m.blocks) == 1
    assert sm.Dims(D=np.uint8(7)).D == 7


HANGING_EXPRESSIONS = [
    "2 ** 2 ** 2 ** 2 ** 2 ** 2 ** 2",
    "((((A ** 64) ** 64) ** 64) ** 64) ** 64",
    "A ** 65",
    "A ** -1",
    "(A * A * A * A) * (A * A * A * A) * (A * A * A * A) * (A * A * A * A) * A * A",
    "9" * 600,
    "A + " * 200 + "A",
    "-" * 401 + "A",
    "(" * 300 + "A" + ")" * 300,
    "99999999999999999999999",
]


@pytest.mark.parametrize("expr", HANGING_EXPRESSIONS, ids=lambda e: e[:30])
def test_derived_dim_expressions_never_hang_or_grow(expr):
    with coded("E0903"):  # refused by the parser's bounds, never evaluated
        sm.Dims(A=2**16, B=expr)


def test_a_file_whose_dims_claim_a_huge_model_is_refused_before_building(tmp_path):
    path = sm.save(tmp_path / "n.safetensors", Net.init(seed=0))
    arrays, meta = _io.read_safetensors(path)
    for dims, needle in [({"L": 10**6}, "tensors and sub-models"), ({"V": 10**12}, "`emb`")]:
        meta["shapeml.dims"] = json.dumps({"D": 4, "F": 6, "L": 2, "V": 5, **dims})
        safetensors.numpy.save_file(dict(arrays), tmp_path / "huge.safetensors", metadata=meta)
        with coded("E0906") as e:
            sm.load(tmp_path / "huge.safetensors", Net)
        assert needle in str(e.value)


def test_load_refuses_a_file_over_max_bytes_before_reading_its_tensors(tmp_path, monkeypatch):
    path = sm.save(tmp_path / "n.safetensors", Net.init(seed=0))
    monkeypatch.setattr(_safetensors, "_read_tensors", lambda *a: pytest.fail("read a tensor"))
    with coded("E1308") as e:
        sm.load(path, Net, max_bytes=100)
    assert "more than max_bytes=100" in str(e.value)


def test_a_header_claiming_a_huge_tensor_is_refused_before_anything_is_allocated(
    tmp_path, monkeypatch
):
    # 1 TiB of float64, consistent in itself (dtype, shape and byte range agree), in a file of
    # 120 bytes: the library checks the claim against the file's size before a tensor is read.
    monkeypatch.setattr(_safetensors, "_read_tensors", lambda *a: pytest.fail("read a tensor"))
    header = {"w": {"dtype": "F64", "shape": [2**37], "data_offsets": [0, 2**40]}}
    path = tmp_path / "huge.safetensors"
    path.write_bytes(_raw_file(header, b"\0" * 48))
    with coded("E1302") as e:
        sm.load(path, Net)
    assert "do not end where the file ends" in str(e.value)


def test_a_file_that_shrinks_while_read_is_e1302(tmp_path, monkeypatch):
    path = sm.save(tmp_path / "n.safetensors", Net.init(seed=0))
    checked = _safetensors._checked

    def then_cut(f, *args):  # the header was read whole; the file is cut before its tensors are
        out = checked(f, *args)
        path.write_bytes(path.read_bytes()[:-8])
        return out

    monkeypatch.setattr(_safetensors, "_checked", then_cut)
    with coded("E1302") as e:
        sm.load(path, Net)
    assert "it changed while being read" in str(e.value)


# -- 2. sm.load and the reader ------------------------------------------------------------------


def _with_meta(tmp_path, **changes):
    path = sm.save(tmp_path / "n.safetensors", Net.init(seed=0))
    arrays, meta = _io.read_safetensors(path)
    meta.update(changes)
    meta = {k: v for k, v in meta.items() if v is not None}
    out = tmp_path / "mutated.safetensors"
    safetensors.numpy.save_file(dict(arrays), out, metadata=meta)
    return out


BAD_METADATA = [
    ("shapeml.dims", "5", "E1302"),
    ("shapeml.dims", "[1, 2]", "E1302"),
    ("shapeml.dims", "not json", "E1302"),
    ("shapeml.dims", '{"D": "x"}', "E1302"),
    ("shapeml.dims", '{"D": -1}', "E1302"),
    ("shapeml.dims", '{"D": 2.5}', "E1302"),
    ("shapeml.dims", '{"D": true}', "E1302"),
    ("shapeml.dims", '{"D": 1e400}', "E1302"),
    ("shapeml.dims", '{"D": 99999999999999999999999}', "E1302"),
    ("shapeml.dims", "[" * 100_000, "E1302"),
    ("shapeml.dims", '{"X": 3}', "E1303"),
    ("shapeml.dims", '{"D": 5}', "E1301"),
    ("shapeml.kinds", "5", "E1302"),
    ("shapeml.kinds", '{"emb": "weight"}', "E1302"),
    ("shapeml.kinds", "{", "E1302"),
    ("shapeml.static", "[1]", "E1302"),
    ("shapeml.static", "{", "E1302"),
    ("shapeml.static", '{"a": ' + "[" * 5000 + "]" * 5000 + "}", "E1302"),
    ("shapeml.format", "checkpoint", "E1303"),
    ("shapeml.class", "other.Thing", "E1303"),
]


@pytest.mark.parametrize("key, value, code", BAD_METADATA, ids=lambda v: str(v)[:20])
def test_malformed_metadata_is_coded_and_names_the_key(tmp_path, key, value, code):
    path = _with_meta(tmp_path, **{key: value})
    with coded(code) as e:
        sm.load(path, Net)
    if code == "E1302":
        assert f"`{key}`" in str(e.value)
    assert len(str(e.value)) < 2000


def test_missing_metadata_loads_with_the_class_dims_as_documented(tmp_path):
    path = _with_meta(tmp_path, **{k: None for k in ["shapeml.dims", "shapeml.kinds"]})
    assert sm.load(path, Net).dims == Net.dims
    plain = tmp_path / "plain.safetensors"
    m = Net.init(seed=3)
    safetensors.numpy.save_file(
        {k: np.asarray(v) for k, v in sm.params(m).items()} | {"steps": np.asarray(m.steps)}, plain
    )
    np.testing.assert_array_equal(sm.load(plain, Net).emb, m.emb)


def test_a_huge_metadata_value_is_never_copied_into_the_message(tmp_path):
    path = _with_meta(tmp_path, **{"shapeml.dims": "x" * 20_000_000})
    with coded("E1302") as e:
        sm.load(path, Net)
    assert len(str(e.value)) < 1000 and "20,000,000 characters" in str(e.value)


@pytest.mark.parametrize(
    "call, code",
    [
        (lambda p: sm.load(p, dict), "E0003"),
        (lambda p: sm.load(p, Net.init(seed=0)), "E0003"),
        (lambda p: sm.load(p, like=Net), "E0003"),
        (lambda p: sm.load(p, like={"emb": 1}), "E0003"),
        (lambda p: sm.load(p), "E0003"),
        (lambda p: sm.load(p, Net, like=Net.init(seed=0)), "E0003"),
        (lambda p: sm.load(3, Net), "E0003"),
        (lambda p: sm.load(str(p).encode(), Net), "E0003"),
        (lambda p: sm.load(str(p) + "\x00", Net), "E0002"),
        (lambda p: sm.load(p, Net, allow_nonfinite="emb"), "E0003"),
        (lambda p: sm.load(p.parent, Net), "E1304"),
        (lambda p: sm.load(p.parent / "nope", Net), "E1304"),
        (lambda p: sm.load(p, like=Net.init(seed=0, D=3)), "E1303"),
        (lambda p: sm.save(3, Net.init(seed=0)), "E0003"),
        (lambda p: sm.save(p, {"emb": 1}), "E0003"),
        (lambda p: sm.save(p.parent, Net.init(seed=0)), "E1306"),
        (lambda p: sm.save(p, Net.init(seed=0), allow_nonfinite=1), "E0003"),
        (lambda p: sm.save(p.parent / ("x" * 300), Net.init(seed=0)), "E1306"),
    ],
)
def test_bad_load_and_save_arguments_are_coded(tmp_path, call, code):
    path = sm.save(tmp_path / "n.safetensors", Net.init(seed=0))
    before = path.read_bytes()
    with coded(code):
        call(path)
    assert path.read_bytes() == before
    assert not [p for p in os.listdir(tmp_path) if p.endswith(_temps.SUFFIX)]


def test_unreadable_files_and_unwritable_folders_are_e1306(tmp_path, monkeypatch):
    path = sm.save(tmp_path / "n.safetensors", Net.init(seed=0))

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    def not_opened(*args, **kwargs):  # how the library reports any failure to open a file
        raise FileNotFoundError(f"No such file or directory: {path}")

    with monkeypatch.context() as mp:
        mp.setattr(_safetensors, "safe_open", not_opened)
        mp.setattr(_safetensors, "open", denied, raising=False)
        with pytest.raises(OSError, match="E1306") as e:
            sm.load(path, Net)
        assert "Permission denied" in str(e.value) and isinstance(e.value, sm.ShapemlError)
    with monkeypatch.context() as mp:
        mp.setattr(_atomic.tempfile, "mkdtemp", denied)
        with coded("E1306"):
            sm.save(path, Net.init(seed=1))
    if os.geteuid() != 0:  # root reads anything: the real permission bits only bind others
        path.chmod(0)
        with coded("E1306"):
            sm.load(path, Net)
        path.chmod(0o644)
    assert sm.load(path, Net).dims == Net.dims


def _raw_file(header: dict, body: bytes) -> bytes:
    text = json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text + body


HEADERS = [
    ({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8),
    ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 12]}}, b"\0" * 12),
    ({"w": {"dtype": "F64", "shape": [10**12], "data_offsets": [0, 8 * 10**12]}}, b"\0" * 8),
    ({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4),
    ({"w": {"dtype": "F32", "shape": [1.0], "data_offsets": [0, 4]}}, b"\0" * 4),
    ({"w": {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}}, b"\0" * 4),
    ({"w": {"dtype": "F32", "shape": [1] * 65, "data_offsets": [0, 4]}}, b"\0" * 4),
    ({"w": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 8),
    ({"w": {"dtype": 5, "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),
    ({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, b"\0" * 4),
    ({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}, b"\0" * 4),
    ({"w": {"dtype": "F32", "shape": [1]}}, b"\0" * 4),
    ({"w": [1, 2]}, b"\0" * 4),
    (
        {
            "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
            "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
        },
        b"\0" * 4,
    ),
    ({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8),
    ({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 8),
    ({"__metadata__": {"a": 1}}, b""),
    ({"__metadata__": [1]}, b""),
    ([1, 2], b""),
]


@pytest.mark.parametrize("header, body", HEADERS, ids=lambda v: str(v)[:40])
def test_headers_that_disagree_with_the_bytes_are_e1302(tmp_path, header, body):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(_raw_file(header, body))
    with coded("E1302") as e:
        _io.read_safetensors(path)
    assert "bad.safetensors" in str(e.value) and len(str(e.value)) < 1000


def test_non_utf8_headers_are_e1302(tmp_path):
    text = b'{"w\xff": 1}'
    path = tmp_path / "bad.safetensors"
    path.write_bytes(len(text).to_bytes(8, "little") + text + b"\0" * 4)
    with coded("E1302") as e:
        _io.read_safetensors(path)
    assert "its header is not UTF-8 text" in str(e.value)


ENTRY = '{"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}'
OTHER = '{"dtype": "I32", "shape": [1], "data_offsets": [0, 4]}'


@pytest.mark.parametrize(
    "text",
    [
        f'{{"w": {ENTRY}, "w": {ENTRY}}}',  # a name twice
        f'{{"w": {ENTRY}, "w": {OTHER}}}',  # a name twice, with another dtype
        '{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "x": 1}}',  # a key more
    ],
)
def test_headers_the_library_reads_are_read_as_it_reads_them(tmp_path, text):
    # The safetensors library (and so torch and transformers) reads these: a duplicate name is
    # JSON's last one, an unknown key is ignored. shapeml reads the same tensors, never others.
    path = tmp_path / "odd.safetensors"
    path.write_bytes(len(text).to_bytes(8, "little") + text.encode() + b"\1\0\0\0")
    ours, _ = _io.read_safetensors(path)
    theirs = safetensors.numpy.load_file(path)
    assert ours.keys() == theirs.keys() == {"w"}
    assert ours["w"].dtype == theirs["w"].dtype and ours["w"].tobytes() == theirs["w"].tobytes()


def test_reader_matches_the_safetensors_library_on_every_dtype(tmp_path):
    arrays = {
        "f64": np.arange(3, dtype=np.float64),
        "bf16": np.arange(4).astype(jnp.bfloat16).reshape(2, 2),
        "f8": np.arange(3).astype(jnp.float8_e4m3fn),
        "i8": np.arange(-2, 3, dtype=np.int8),
        "u64": np.array([2**64 - 1], np.uint64),
        "b": np.array([True, False]),
        "scalar": np.array(7, np.int32),
        "empty": np.zeros((0, 3), np.float32),
    }
    path = _io.write_safetensors(tmp_path / "a.safetensors", arrays, {"k": "v"})
    ours, meta = _io.read_safetensors(path)
    theirs = dict(safetensors.deserialize(path.read_bytes()))  # the library's own parser
    assert meta == {"k": "v"} and sorted(ours) == sorted(theirs) == sorted(arrays)
    for k, a in arrays.items():
        assert ours[k].dtype == a.dtype and ours[k].shape == a.shape == tuple(theirs[k]["shape"])
        assert ours[k].tobytes() == a.tobytes() == bytes(theirs[k]["data"])
        assert not ours[k].flags.writeable
    plain = {k: a for k, a in arrays.items() if k not in ("bf16", "f8")}
    safetensors.numpy.save_file(plain, tmp_path / "b.safetensors", metadata={"k": "v"})
    again, _ = _io.read_safetensors(tmp_path / "b.safetensors")
    assert all(again[k].tobytes() == a.tobytes() for k, a in plain.items())


@pytest.mark.parametrize(
    "arrays, metadata",
    [
        ({"w": np.array(["a"])}, {}),
        ({"w": np.zeros(2, np.complex64)}, {}),
        ({3: np.zeros(2)}, {}),
        ({"__metadata__": np.zeros(2)}, {}),
        ({"w": np.zeros(2)}, {"k": 1}),
        ({"w": np.zeros(2)}, "meta"),
        ([np.zeros(2)], {}),
    ],
)
def test_writer_refuses_what_it_cannot_store(tmp_path, arrays, metadata):
    with coded("E0003"):
        _io.write_safetensors(tmp_path / "w.safetensors", arrays, metadata)
    assert os.listdir(tmp_path) == []


class _NoArray:
    def __array__(self, *args, **kwargs):
        raise RuntimeError("no array here")


def test_saving_traced_values_or_non_bytes_is_e0003(tmp_path):
    @jax.jit
    def step(m):
        sm.save(tmp_path / "in_jit.safetensors", m)
        return m.emb

    with coded("E0003") as e:
        step(Net.init(seed=0))
    assert "inside a JAX transformation" in str(e.value)
    with coded("E0003"):
        _io.write_safetensors(tmp_path / "w", {"w": _NoArray()}, {})
    with coded("E0003"):
        _io.atomic_write(tmp_path / "t.txt", "text, not bytes")
    assert os.listdir(tmp_path) == []


# -- 3. non-finite values ------------------------------------------------------------------------


def _poisoned():
    m = Net.init(seed=0)
    return m.replace(
        emb=m.emb.at[0, 0].set(jnp.nan),
        blocks=(m.blocks[0].replace(w1=m.blocks[0].w1.at[1, 1].set(-jnp.inf)), m.blocks[1]),
    )


def test_save_refuses_nan_and_inf_naming_the_fields_and_keeps_the_old_file(tmp_path):
    path = sm.save(tmp_path / "n.safetensors", Net.init(seed=0))
    before = path.read_bytes()
    with coded("E1307") as e:
        sm.save(path, _poisoned())
    assert "`blocks.0.w1`, `emb` hold NaN or infinite values" in str(e.value)
    assert isinstance(e.value, ValueError) and path.read_bytes() == before
    assert os.listdir(tmp_path) == ["n.safetensors"]
    with coded("E1307") as e:
        sm.save(path, _poisoned(), allow_nonfinite=("emb",))
    assert "`blocks.0.w1` hold" in str(e.value)


def test_nonfinite_is_written_on_request_and_warns_on_load(tmp_path):
    path = sm.save(tmp_path / "n.safetensors", _poisoned(), allow_nonfinite=True)
    with pytest.warns(sm.ShapemlWarning, match="W1301") as w:
        m = sm.load(path, Net)
    assert "`blocks.0.w1`, `emb` hold NaN or infinite values" in str(w[0].message)
    assert np.isnan(m.emb[0, 0]) and np.isneginf(m.blocks[0].w1[1, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sm.load(path, Net, allow_nonfinite=True)
        sm.load(path, Net, allow_nonfinite=["emb", "blocks.0.w1"])
    with pytest.warns(sm.ShapemlWarning, match=r"W1301.*`emb` hold"):
        sm.load(path, Net, allow_nonfinite=["blocks.0.w1"])


def test_every_writer_checks_through_write_safetensors_in_every_float_dtype(tmp_path):
    for dtype in [np.float16, jnp.bfloat16, jnp.float8_e5m2, np.float64]:
        with coded("E1307"):
            _io.write_safetensors(tmp_path / "x", {"a": np.array([1, np.inf], dtype)}, {})
    ints = {"i": np.array([-1, 2**31 - 1], np.int32), "b": np.array([True])}
    path = _io.write_safetensors(tmp_path / "x", ints, {})  # positional signature unchanged
    assert safetensors.numpy.load_file(path)["i"][1] == 2**31 - 1


# -- 4. atomic writes leave no temp file, even after a crash ---------------------------------


def test_temp_names_are_recognizable(tmp_path, monkeypatch):
    seen = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (seen.append(a), real_replace(a, b)))
    sm.save(tmp_path / "m.safetensors", Net.init(seed=0))
    folder, name = os.path.split(seen[0])  # the file is written inside a temp folder of its own
    assert name == "m.safetensors"
    pattern = r"\.m\.safetensors\.[0-9a-f]{6}-\d+\.[a-z0-9_]{8}\.shapeml-tmp"
    assert re.fullmatch(pattern, os.path.basename(folder))


def test_a_failure_mid_write_leaves_no_temp_and_the_old_file(tmp_path):
    path = _io.atomic_write(tmp_path / "f.bin", b"old")

    def half(f):
        f.write(b"new, half written")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _io.atomic_write(path, half)
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["f.bin"]


def _temp_name(target: str, pid: int, host: str | None = None) -> str:
    return f".{target}.{host or _temps._HOST}-{pid}.abcd1234{_temps.SUFFIX}"


def test_stale_temps_of_dead_writers_are_removed_by_the_next_save(tmp_path):
    dead = _temp_name("m.safetensors", 99_999_999)
    alive = _temp_name("m.safetensors", os.getppid())
    elsewhere = _temp_name("m.safetensors", 99_999_999, host="ffffff")
    other_target = _temp_name("m.safetensors.bak", 99_999_999)
    legacy_old, legacy_new = ".m.safetensors.k2j4h5g6.tmp", ".m.safetensors.zzzzzzzz.tmp"
    for name in [dead, alive, elsewhere, other_target, legacy_old, legacy_new]:
        (tmp_path / name).write_bytes(b"partial")
    os.utime(tmp_path / legacy_old, (time.time() - 7200, time.time() - 7200))
    sm.save(tmp_path / "m.safetensors", Net.init(seed=0))
    left = sorted(os.listdir(tmp_path))
    # a dead writer's temp of another target in the folder is just as abandoned
    assert left == sorted(["m.safetensors", alive, elsewhere, legacy_new])


def test_a_killed_save_leaves_a_temp_that_the_next_save_removes(tmp_path):
    target = tmp_path / "m.bin"
    script = textwrap.dedent(
        f"""
        import os
        from shapeml import _io
        os.replace = lambda *a: os._exit(9)  # killed after writing, before the rename
        _io.atomic_write({str(target)!r}, b"x" * 1000)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert out.returncode == 9, out.stderr.decode()
    stale = [p for p in os.listdir(tmp_path) if p.endswith(_temps.SUFFIX)]
    assert len(stale) == 1 and stale[0].startswith(".m.bin.")
    _io.atomic_write(target, b"good")
    assert os.listdir(tmp_path) == ["m.bin"] and target.read_bytes() == b"good"


# -- 5. @sm.shaped, gradients, data, contracts, the model API ----------------------------------


class Head(sm.Model):
    dims = sm.Dims(D=3, C=2)
    w: Float[Array, "D C"] = sm.param(sm.normal(std=0.1))


RUNS = []


@sm.shaped
def head(m: Head, x: Float[Array, "b D"]) -> Float[Array, "b C"]:
    RUNS.append(1)
    return x @ m.w


@sm.shaped
def plain(x: Float[Array, " n"], scale: float = 1.0) -> Float[Array, " n"]:
    RUNS.append(1)
    return x * scale


X = jnp.ones((2, 3))


@pytest.mark.parametrize(
    "call",
    [
        lambda m: head(m, X, X),
        lambda m: head(m),
        lambda m: head(),
        lambda m: head(m, x=X, y=X),
        lambda m: head(m, X, x=X),
        lambda m: head(m, image=X),
        lambda m: plain(jnp.ones(3), 2.0, 3.0),
        lambda m: plain(scale=2.0),
        lambda m: plain(jnp.ones(3), sclae=2.0),
    ],
)
def test_shaped_calls_that_do_not_match_the_signature_are_e1003(call):
    RUNS.clear()
    with coded("E1003") as e:
        call(Head.init(seed=0))
    assert RUNS == [] and isinstance(e.value, TypeError) and "was called with" in str(e.value)


def test_shaped_refuses_what_it_cannot_check():
    with coded("E0003"):
        sm.shaped(3)

    @sm.shaped
    def f(x: "NoSuchType") -> int:  # noqa: F821 - the unresolvable annotation under test
        return 1

    with coded("E1004"):
        f(1)


@pytest.mark.parametrize(
    "call, code",
    [
        (lambda m: sm.value_and_grad(3, m), "E0003"),
        (lambda m: sm.value_and_grad(lambda m: jnp.sum(m.w), {"w": m.w}), "E0003"),
        (lambda m: sm.grad(lambda m: jnp.sum(m.w), m, has_aux="no"), "E0003"),
        (lambda m: sm.grad(lambda m: jnp.sum(m.w), m)["nope"], "E0908"),
        (lambda m: sm.grad(lambda m: jnp.sum(m.w), m)[3], "E0908"),
        (lambda m: sm.norm({"w": m.w}), "E0003"),
        (lambda m: sm.norm(m), "E0003"),
        (lambda m: sm.grad(lambda m: m.w, m), "E1106"),
        (lambda m: sm.grad(lambda m: "loss", m), "E1106"),
        (lambda m: sm.grad(lambda m: None, m), "E1106"),
        (lambda m: sm.grad(lambda m: jnp.sum(m.w).astype(jnp.int32), m), "E1106"),
        (lambda m: sm.grad(lambda m: jnp.sum(m.w).astype(jnp.complex64), m), "E1106"),
        (lambda m: sm.grad(lambda m: jnp.sum(m.w), m, has_aux=True), "E1106"),
    ],
)
def test_bad_gradient_inputs_are_coded(call, code):
    with coded(code):
        call(Head.init(seed=0))


def test_unknown_param_error_is_still_a_key_error():
    g = sm.grad(lambda m: jnp.sum(m.w), Head.init(seed=0))
    with pytest.raises(KeyError, match="a param with a similar name exists: `w`"):
        g["W"]


@pytest.mark.parametrize(
    "kwargs, code",
    [
        (dict(batch_size=0), "E0002"),
        (dict(batch_size=-1), "E0002"),
        (dict(batch_size=9), "E0002"),
        (dict(batch_size=2.5), "E0003"),
        (dict(batch_size=True), "E0003"),
        (dict(batch_size="2"), "E0003"),
        (dict(batch_size=2, seed=-1), "E0002"),
        (dict(batch_size=2, seed=1.5), "E0003"),
        (dict(batch_size=2, epochs=0), "E0002"),
        (dict(batch_size=2, epochs=2.5), "E0003"),
        (dict(batch_size=2, drop_last="no"), "E0003"),
    ],
)
def test_bad_batch_arguments_are_coded_when_called_not_when_iterated(kwargs, code):
    with coded(code):
        batches(np.arange(8), np.arange(8), **kwargs)  # no next(): checked at the call


@pytest.mark.parametrize(
    "arrays, code",
    [
        ((), "E0002"),
        ((np.arange(3), np.arange(4)), "E0002"),
        ((np.zeros((0, 2)),), "E0002"),
        ((np.float32(1),), "E0003"),
        ((5,), "E0003"),
        (([1, 2, 3],), "E0003"),
    ],
)
def test_bad_batch_arrays_are_coded(arrays, code):
    with coded(code):
        batches(*arrays, batch_size=1)


def test_finite_epochs_end_as_an_iterator_does():
    assert len(list(batches(np.arange(4), batch_size=2, epochs=1))) == 2


@pytest.mark.parametrize(
    "n, seed, code",
    [
        (2.5, 0, "E0003"),
        ("3", 0, "E0003"),
        (-1, 0, "E0002"),
        (2**40, 0, "E0002"),
        (4, -1, "E0002"),
        (4, 1.5, "E0003"),
        (True, 0, "E0003"),
    ],
)
def test_bad_draw_arguments_are_coded(n, seed, code):
    with coded(code):
        shapes.draw(n, seed=seed)
    assert shapes.MAX_IMAGES == 2**16


@pytest.mark.parametrize(
    "call, code",
    [
        (lambda: check_contract(3), "E0003"),
        (lambda: check_contract(head, Head, sizes=5), "E0003"),
        (lambda: check_contract(head, Head, sizes={"b": 3}), "E0003"),
        (lambda: check_contract(head, Head, sizes={"b": []}), "E0003"),
        (lambda: check_contract(head, Head, sizes={"b": [1.5]}), "E0003"),
        (lambda: check_contract(head, Head, sizes={"b": [-1]}), "E0002"),
        (lambda: check_contract(head, Head, dims=[1]), "E0003"),
        (lambda: check_contract(head, Head, dims={"D": "x"}), "E0003"),
        (lambda: check_contract(lambda x: x), "E0003"),
    ],
)
def test_bad_contract_arguments_are_coded(call, code):
    with coded(code):
        call()


@pytest.mark.parametrize(
    "call, code",
    [
        (lambda m: Net.init(seed=2.5), "E0003"),
        (lambda m: Net.init(seed="x"), "E0003"),
        (lambda m: Net.init(seed=True), "E0003"),
        (lambda m: Net.init(seed=2**70), "E0002"),
        (lambda m: Net.init(seed=jnp.ones(3)), "E0003"),
        (lambda m: Net.init(seed=jnp.arange(3)), "E0003"),
        (lambda m: Net(dims=5), "E0003"),
        (lambda m: Net(dims={1: 2}), "E0003"),
        (lambda m: Net(dims={"D": "x"}), "E0904"),
        (lambda m: m.replace(emb=[[1.0, 2.0], [3.0]]), "E0902"),
        (lambda m: m.replace(emb=None), "E0902"),
        (lambda m: m.replace(blocks=5), "E0902"),
        (lambda m: sm.params({}), "E0003"),
        (lambda m: sm.buffers(3), "E0003"),
        (lambda m: sm.count_params(Net), "E0003"),
        (lambda m: sm.normal(std=[0.1]), "E0003"),
        # a string is an expression of the dims, checked when the model is declared
        (lambda m: sm.normal(std="0.02 *"), "E0002"),
        (lambda m: sm.normal(std=-1), "E0002"),
        (lambda m: sm.normal(mean=float("nan")), "E0002"),
        (lambda m: sm.uniform(lo=1.0, hi=0.0), "E0002"),
        (lambda m: sm.uniform(lo=float("inf")), "E0002"),
        (lambda m: sm.full("x"), "E0003"),
        (lambda m: sm.submodels(Block, -1), "E0905"),
        (lambda m: sm.submodels(Block, 2.5), "E0905"),
    ],
)
def test_careless_model_api_calls_are_coded(call, code):
    with coded(code):
        call(Net.init(seed=0))


def test_seeds_take_64_bit_numpy_and_traced_ints():
    a = Net.init(seed=np.uint64(2**64 - 1))
    b = Net.init(seed=2**64 - 1)
    np.testing.assert_array_equal(a.emb, b.emb)
    # the high 32 bits count: without x64, jax.random.key alone would keep only the low ones
    c, d = Net.init(seed=2**32 + 5), Net.init(seed=5)
    assert not np.array_equal(c.emb, d.emb)
    np.testing.assert_array_equal(d.emb, Net.init(seed=np.int64(5)).emb)
    ens = jax.vmap(lambda s: Net.init(seed=s))(jnp.arange(2))
    assert ens.emb.shape == (2, 5, 4)


EXPRESSIONS = st.recursive(
    st.integers(-10, 2**70).map(str) | st.sampled_from(["A", "B", "Q"]),
    lambda e: (
        st.tuples(e, st.sampled_from(["+", "-", "*", "//", "/", "%", "**"]), e).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"
        )
        | e.map(lambda x: f"-{x}")
    ),
    max_leaves=24,
)


@settings(max_examples=300, deadline=None, database=None)
@given(EXPRESSIONS)
def test_random_dim_expressions_give_a_bounded_value_or_e0903(expr):
    try:
        value = sm.Dims(A=2**31, B=3, C=expr).C
    except sm.ShapemlError as e:
        assert e.code == "E0903"
    else:
        assert type(value) is int and 0 <= value <= 2**62
        names = {"A": 2**31, "B": 3}
        assert value == eval(expr, {"__builtins__": {}}, names)  # noqa: S307 - the reference
