"""Exported artifacts under attack: truncated, bit-flipped, re-headed and random files, and loaded
programs called with the wrong inputs. Each must load correctly (and compute what the original
computes) or fail with a coded `ShapemlError`: never a raw exception, a hang or a large
allocation. `TRIED` counts the inputs (printed by the last test).
"""

from __future__ import annotations

import collections
import json
import tracemalloc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shapeml as sm
from shapeml.hoisting import ExportedInputError

TRIED: collections.Counter = collections.Counter()
# A load may hold the file and its dequantized tensors; anything far beyond is an allocation
# sized by what the file claims rather than by what it holds.
MAX_PEAK = 32 * 2**20
METADATA_KEYS = [
    "format",
    "version",
    "program",
    "program_sha256",
    "tensors_sha256",
    "manifest",
    "n_inputs",
    "jax_version",
]


def f(m, x, y):
    return jnp.tanh(x @ m["w"] + m["b"][None]) * y[:, :1]


def model():
    k1, k2 = jax.random.split(jax.random.key(0))
    return {"w": jax.random.normal(k1, (32, 48)), "b": jax.random.normal(k2, (48,))}


X = jnp.linspace(-1, 1, 3 * 32, dtype=jnp.float32).reshape(3, 32)
Y = jnp.ones((3, 2), jnp.float32)


class Artifacts(dict):
    def __repr__(self) -> str:  # hypothesis prints the arguments of a failing example
        return "Artifacts(None, 'int8')"


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """`{quantize: (file bytes, expected output)}` for a plain and an int8 export."""
    folder = tmp_path_factory.mktemp("exports")
    out = Artifacts()
    for quantize in (None, "int8"):
        path = folder / f"{quantize}.safetensors"
        sm.export(f, model(), (X, Y), path, quantize=quantize)
        out[quantize] = (path.read_bytes(), np.asarray(sm.load_exported(path)(X, Y)))
    np.testing.assert_allclose(out[None][1], np.asarray(f(model(), X, Y)), rtol=1e-5, atol=1e-5)
    return out


def _load_or_coded(path, expected: np.ndarray) -> str:
    """Loads `path`: a coded error, or a program computing `expected`. Returns what happened."""
    tracemalloc.start()
    try:
        loaded = sm.load_exported(path)
    except sm.ShapemlError as e:
        return e.code
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < MAX_PEAK, f"loading allocated {peak:,} bytes"
    np.testing.assert_allclose(np.asarray(loaded(X, Y)), expected, rtol=1e-6, atol=1e-6)
    return "loaded"


def _split(data: bytes) -> tuple[dict, bytes]:
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def _join(header: dict, body: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + body


QUANTIZE = st.sampled_from([None, "int8"])
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@FUZZ
@given(quantize=QUANTIZE, cut=st.floats(0, 1, exclude_max=True))
def test_truncated_artifacts(artifacts, tmp_path, quantize, cut):
    data, expected = artifacts[quantize]
    path = tmp_path / "cut.safetensors"
    path.write_bytes(data[: int(cut * len(data))])
    assert _load_or_coded(path, expected) != "loaded"
    TRIED["truncated"] += 1


@FUZZ
@given(
    quantize=QUANTIZE,
    flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), max_size=8),
)
def test_bytes_changed_anywhere(artifacts, tmp_path, quantize, flips):
    data, expected = artifacts[quantize]
    buf = bytearray(data)
    for where, value in flips:
        buf[int(where * len(buf))] = value
    path = tmp_path / "flip.safetensors"
    path.write_bytes(bytes(buf))
    _load_or_coded(path, expected)
    TRIED["bytes changed"] += 1


# Values a damaged or hostile header might hold, in JSON.
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
ENTRY_FIELDS = st.sampled_from(["name", "shape", "dtype", "quantized"])
ENTRY_VALUES = st.one_of(
    JSON_VALUES,
    st.lists(st.integers(-2, 2**40), max_size=4),
    st.sampled_from(["float32", "int8", "bfloat16", "object", "float64", "<U3", "boundary.0"]),
)


@FUZZ
@given(
    quantize=QUANTIZE,
    key=st.sampled_from(METADATA_KEYS),
    text=st.one_of(JSON_VALUES.map(json.dumps), st.text(max_size=40)),
)
def test_metadata_fields_replaced(artifacts, tmp_path, quantize, key, text):
    data, expected = artifacts[quantize]
    header, body = _split(data)
    header["__metadata__"][key] = text
    path = tmp_path / "meta.safetensors"
    path.write_bytes(_join(header, body))
    _load_or_coded(path, expected)
    TRIED["metadata field replaced"] += 1


@FUZZ
@given(
    quantize=QUANTIZE,
    at=st.integers(0, 3),
    field=ENTRY_FIELDS,
    value=ENTRY_VALUES,
    drop=st.booleans(),
)
def test_manifest_entries_changed(artifacts, tmp_path, quantize, at, field, value, drop):
    # The manifest is not under a checksum: every field of it must be checked on its own.
    data, expected = artifacts[quantize]
    header, body = _split(data)
    manifest = json.loads(header["__metadata__"]["manifest"])
    entry = manifest[at % len(manifest)]
    if drop:
        entry.pop(field)
    else:
        entry[field] = value
    header["__metadata__"]["manifest"] = json.dumps(manifest)
    path = tmp_path / "manifest.safetensors"
    path.write_bytes(_join(header, body))
    _load_or_coded(path, expected)
    TRIED["manifest entry changed"] += 1


@FUZZ
@given(
    quantize=QUANTIZE,
    field=st.sampled_from(["dtype", "shape", "data_offsets"]),
    value=ENTRY_VALUES,
)
def test_tensor_headers_changed(artifacts, tmp_path, quantize, field, value):
    data, expected = artifacts[quantize]
    header, body = _split(data)
    name = sorted(k for k in header if k != "__metadata__")[0]
    header[name][field] = value
    path = tmp_path / "tensor.safetensors"
    path.write_bytes(_join(header, body))
    _load_or_coded(path, expected)
    TRIED["tensor header changed"] += 1


@FUZZ
@given(blob=st.binary(max_size=2048), claim=st.integers(0, 2**64 - 1), prefix=st.booleans())
def test_random_files(tmp_path, blob, claim, prefix):
    path = tmp_path / "random.safetensors"
    path.write_bytes((claim.to_bytes(8, "little") if prefix else b"") + blob)
    assert _load_or_coded(path, np.zeros(0)) != "loaded"
    TRIED["random file"] += 1


def test_a_manifest_claiming_a_huge_tensor_allocates_nothing(artifacts, tmp_path):
    data, expected = artifacts["int8"]
    header, body = _split(data)
    manifest = json.loads(header["__metadata__"]["manifest"])
    for entry in manifest:
        entry["shape"] = [2**31, 2**20]
    header["__metadata__"]["manifest"] = json.dumps(manifest)
    path = tmp_path / "huge.safetensors"
    path.write_bytes(_join(header, body))
    assert _load_or_coded(path, expected) == "E1507"


def test_the_untouched_artifacts_still_load(artifacts, tmp_path):
    for quantize, (data, expected) in artifacts.items():
        path = tmp_path / f"{quantize}.safetensors"
        path.write_bytes(data)
        assert _load_or_coded(path, expected) == "loaded"


# --- calling a loaded program -------------------------------------------------------------------


@pytest.fixture(scope="module")
def loaded(artifacts, tmp_path_factory):
    path = tmp_path_factory.mktemp("call") / "a.safetensors"
    path.write_bytes(artifacts[None][0])
    return sm.load_exported(path)


@pytest.mark.parametrize(
    ("inputs", "match"),
    [
        ((X,), "takes 2 input"),
        ((X, Y, Y), "takes 2 input"),
        ((), "takes 2 input"),
        ((X[:, :31], Y), "size 31 on axis 1"),
        ((X.astype(jnp.int32), Y), "dtype int32"),
        ((X.astype(jnp.float16), Y), "dtype float16"),
        ((np.asarray(X, np.float64), Y), "dtype float64"),
        ((X[0], Y), "rank 1"),
        ((X[None], Y), "rank 3"),
        ((X, Y[:2]), "`b` = 2"),
        ((X[:0], Y[:0]), "`b` >= 1"),
        (("x", Y), "not an array"),
        ((jax.ShapeDtypeStruct(X.shape, X.dtype), Y), "not an array"),
        ((X, None), "takes 2 input"),
        (([[1.0] * 32], Y), "takes 2 input"),
    ],
)
def test_a_loaded_program_names_the_wrong_input(loaded, inputs, match):
    with pytest.raises(ExportedInputError, match=match):
        loaded(*inputs)
    TRIED["loaded program inputs"] += 1


def test_a_loaded_program_takes_any_batch_and_works_under_jit(loaded):
    want = np.asarray(f(model(), X[:1], Y[:1]))
    np.testing.assert_allclose(np.asarray(loaded(X[:1], Y[:1])), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        np.asarray(jax.jit(loaded)(X[:1], Y[:1])), want, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"path": 3}, "E0003"),
        ({"path": "a\0b.safetensors"}, "E0002"),
        ({"path": "no/such/folder/a.safetensors"}, "E1305"),
        ({"path": "."}, "E1306"),
        ({"batch_axis": -1}, "E0002"),
        ({"batch_axis": 1.0}, "E0003"),
        ({"batch_axis": True}, "E0003"),
        ({"quantize": "int4"}, "E1505"),
        ({"quantize": ["int8"]}, "E1505"),
        ({"max_prepared_bytes": -1}, "E0002"),
        ({"f": "f"}, "E0003"),
    ],
)
def test_export_checks_every_argument_before_writing(tmp_path, monkeypatch, kwargs, code):
    monkeypatch.chdir(tmp_path)
    args = {"f": f, "path": tmp_path / "out.safetensors", **kwargs}
    path = args.pop("path")
    fn = args.pop("f")
    with pytest.raises(sm.ShapemlError) as info:
        sm.export(fn, model(), (X, Y), path, **args)
    assert info.value.code == code
    assert list(tmp_path.iterdir()) == []  # nothing written, not even a temp file
    TRIED["export arguments"] += 1


@pytest.mark.parametrize("path", [3, None, "missing.safetensors", ".", "a\0b"])
def test_load_exported_refuses_bad_paths_with_codes(tmp_path, monkeypatch, path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(sm.ShapemlError):
        sm.load_exported(path)
    TRIED["load paths"] += 1


def test_zz_report_how_many_bad_inputs_were_tried(capsys):
    with capsys.disabled():
        print("\nexport inputs tried:", dict(TRIED), "total", sum(TRIED.values()))
