"""Property tests of the checkpoint reader: random, truncated and mutated files written by `sm.save`
either load correctly or raise a coded `ShapemlError`; never a raw exception, a hang or a large
allocation (measured with tracemalloc)."""

import json
import tempfile
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jaxtyping import Array, Float, Int

import shapeml as sm


class Block(sm.Model):
    dims = sm.Dims(D=4, F=6)
    w1: Float[Array, "D F"] = sm.param(sm.normal(std=0.1))


class Net(sm.Model):
    dims = sm.Dims(D=4, F=6, L=2, V=5)
    emb: Float[Array, "V D"] = sm.param(sm.normal())
    blocks: tuple[Block, ...] = sm.submodels(Block, "L")
    steps: Int[Array, ""] = sm.buffer(sm.full(5))


FOLDER = Path(tempfile.mkdtemp(prefix="shapeml-fuzz-"))
ORIGINAL = Net.init(seed=0)
GOOD = sm.save(FOLDER / "good.safetensors", ORIGINAL).read_bytes()
HEADER_LEN = int.from_bytes(GOOD[:8], "little")
HEADER = json.loads(GOOD[8 : 8 + HEADER_LEN])
BODY = GOOD[8 + HEADER_LEN :]
NAMES = sorted(k for k in HEADER if k != "__metadata__")
# The file is ~350 bytes; reading it may allocate a few times that, never megabytes.
MAX_PEAK = 8 * 2**20
TRIED = {"random": 0, "truncated": 0, "flipped": 0, "header": 0, "metadata": 0, "length": 0}
FAST = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)


def load_outcome(data: bytes, kind: str):
    """Loads `data` as a checkpoint: the model, or the coded error; anything else fails."""
    TRIED[kind] += 1
    path = FOLDER / f"{kind}.safetensors"
    path.write_bytes(data)
    tracemalloc.start()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                result = sm.load(path, Net)
            except sm.ShapemlError as e:
                result = e
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MAX_PEAK, f"reading {len(data)} bytes allocated {peak:,}"
    for w in caught:
        assert isinstance(w.message, sm.ShapemlWarning), w.message
    if isinstance(result, sm.ShapemlError):
        assert result.code.startswith("E") and len(str(result)) < 3000
    else:
        assert isinstance(result, Net) and result.dims.D > 0
        assert result.emb.shape == (result.dims.V, result.dims.D)
    return result


def encode(header: dict, body: bytes = BODY, length: int | None = None) -> bytes:
    text = json.dumps(header).encode()
    return (len(text) if length is None else length).to_bytes(8, "little") + text + body


def test_the_unmutated_file_loads_exactly():
    m = load_outcome(GOOD, "header")
    assert isinstance(m, Net)
    for name in NAMES:
        np.testing.assert_array_equal(
            np.asarray(sm.params(m).get(name, m.steps)),
            np.asarray(sm.params(ORIGINAL).get(name, ORIGINAL.steps)),
        )


@FAST
@given(st.binary(max_size=1024) | st.binary(min_size=8, max_size=8).map(lambda b: b + b"{}"))
def test_random_bytes(data):
    load_outcome(data, "random")


@FAST
@given(st.integers(0, len(GOOD) - 1))
def test_truncated_files(cut):
    assert isinstance(load_outcome(GOOD[:cut], "truncated"), sm.ShapemlError)


@FAST
@given(st.lists(st.tuples(st.integers(0, len(GOOD) - 1), st.integers(0, 255)), max_size=6))
def test_flipped_bytes(flips):
    data = bytearray(GOOD)
    for at, value in flips:
        data[at] = value
    load_outcome(bytes(data), "flipped")


@FAST
@given(
    st.one_of(
        st.integers(0, 2**64 - 1),
        st.integers(HEADER_LEN - 16, HEADER_LEN + 16),
        st.sampled_from([0, 1, len(GOOD), 2**63, 2**64 - 1, 100 * 2**20 + 1]),
    )
)
def test_lying_length_fields(length):
    outcome = load_outcome(encode(HEADER, length=length), "length")
    if length != len(json.dumps(HEADER).encode()):
        assert isinstance(outcome, sm.ShapemlError)


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
DTYPES = st.sampled_from(
    ["F32", "F64", "F16", "BF16", "I32", "I64", "U8", "BOOL", "C64", "", "f32"]
)
SHAPES = st.one_of(
    st.lists(st.integers(-2, 8), max_size=4),
    st.lists(st.sampled_from([0, 1, 2**31, 2**62, 2**64]), max_size=70),
    JSON_VALUES,
)
OFFSETS = st.one_of(
    st.lists(st.integers(-4, len(BODY) + 4), min_size=2, max_size=2),
    st.lists(st.integers(0, 2**64), max_size=3),
    JSON_VALUES,
)


@st.composite
def mutated_headers(draw):
    header = json.loads(json.dumps(HEADER))
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(NAMES))
        if not isinstance(header[name], dict):
            header[name] = {}
        what = draw(st.sampled_from(["dtype", "shape", "data_offsets", "drop", "entry", "add"]))
        if what == "dtype":
            header[name]["dtype"] = draw(DTYPES | JSON_VALUES)
        elif what == "shape":
            header[name]["shape"] = draw(SHAPES)
        elif what == "data_offsets":
            header[name]["data_offsets"] = draw(OFFSETS)
        elif what == "drop" and isinstance(header[name], dict):
            header[name].pop(draw(st.sampled_from(sorted(header[name]) or ["x"])), None)
        elif what == "entry":
            header[name] = draw(JSON_VALUES)
        else:
            header[draw(st.text(max_size=8))] = {
                "dtype": draw(DTYPES),
                "shape": draw(SHAPES),
                "data_offsets": draw(OFFSETS),
            }
    body = draw(st.sampled_from([BODY, BODY[:-4], BODY + b"\0" * 4, b""]))
    return encode(header, body)


@FAST
@given(mutated_headers())
def test_mutated_header_entries(data):
    load_outcome(data, "header")


META_KEYS = ["shapeml.dims", "shapeml.kinds", "shapeml.static", "shapeml.class", "shapeml.format"]


@st.composite
def mutated_metadata(draw):
    header = json.loads(json.dumps(HEADER))
    meta = header["__metadata__"]
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(META_KEYS))
        choice = draw(st.sampled_from(["json", "text", "drop", "dims"]))
        if choice == "json":
            meta[key] = json.dumps(draw(JSON_VALUES))
        elif choice == "text":
            meta[key] = draw(st.text(max_size=40))
        elif choice == "drop":
            meta.pop(key, None)
        else:
            dims = {k: draw(st.integers(-3, 2**64) | JSON_VALUES) for k in ["D", "L", "V", "X"]}
            meta["shapeml.dims"] = json.dumps(
                {k: v for k, v in dims.items() if draw(st.booleans())}
            )
    if draw(st.booleans()):
        header["__metadata__"] = draw(JSON_VALUES)
    return encode(header)


@FAST
@given(mutated_metadata())
def test_mutated_metadata(data):
    load_outcome(data, "metadata")


@pytest.mark.parametrize("blocks", [40_000, 43_690])
def test_dims_that_declare_more_tensors_than_the_file_holds_are_refused_before_listing_them(
    blocks,
):
    # A file whose dims say L=43,690 with D=0 (no bytes: under every size limit) once made the
    # loader list every block's tensors, its statics copied per block: minutes of CPU, 12 MB.
    header = json.loads(GOOD[8 : 8 + HEADER_LEN])
    dims = {**json.loads(header["__metadata__"]["shapeml.dims"]), "L": blocks, "D": 0}
    header["__metadata__"]["shapeml.dims"] = json.dumps(dims)
    error = load_outcome(encode(header), "metadata")  # within the memory bound, coded
    assert isinstance(error, sm.models.CheckpointError), error
    assert f"holds {len(NAMES)} tensor(s), but `Net`" in str(error)
    assert f"L={blocks}" in str(error) and f"has at least {blocks + 2}" in str(error)
