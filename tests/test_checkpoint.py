"""Checkpoints: round trips, every mismatch reported at once, atomic writes, bad files."""

import json
import os
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
from jaxtyping import Array, Bool, Float, Int

import shapeml as sm


class Block(sm.Model):
    dims = sm.Dims(D=4, F=6)
    w1: Float[Array, "D F"] = sm.param(sm.normal(std=0.1))
    w2: Float[Array, "F D"] = sm.param(sm.normal(std=0.1))


class Net(sm.Model):
    dims = sm.Dims(D=4, F=6, L=2)
    emb: Float[Array, "D D"] = sm.param(sm.normal())
    blocks: tuple[Block, ...] = sm.submodels(Block, "L")
    steps: Int[Array, ""] = sm.buffer(sm.full(5))


def assert_same(a, b):
    assert type(a) is type(b) and a.dims == b.dims
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)


def test_round_trip_with_buffers_submodels_and_dims(tmp_path):
    m = Net.init(seed=1, D=8)
    path = sm.save(tmp_path / "net.safetensors", m)
    assert_same(sm.load(path, Net), m)
    assert_same(sm.load(path, like=m), m)
    arrays = safetensors.numpy.load_file(path)
    assert sorted(arrays) == [
        "blocks.0.w1",
        "blocks.0.w2",
        "blocks.1.w1",
        "blocks.1.w2",
        "emb",
        "steps",
    ]


def test_metadata_names_class_dims_and_version(tmp_path):
    path = sm.save(tmp_path / "net.safetensors", Net.init(seed=1, L=3))
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        meta = json.loads(f.read(n))["__metadata__"]
    assert meta["shapeml.class"].endswith("Net")
    assert json.loads(meta["shapeml.dims"]) == {"D": 4, "F": 6, "L": 3}
    assert meta["shapeml.version"] == sm.__version__


def test_load_reports_every_problem_at_once(tmp_path):
    m = Net.init(seed=0)
    arrays = {k: np.asarray(v) for k, v in {**sm.params(m), **sm.buffers(m)}.items()}
    arrays["blocks.0.W1"] = arrays.pop("blocks.0.w1")  # renamed
    del arrays["blocks.1.w2"]  # missing
    arrays["emb"] = np.zeros((4, 5), np.float32)  # wrong shape
    arrays["steps"] = np.zeros((), np.float32)  # wrong dtype
    arrays["extra"] = np.zeros(2, np.float32)  # unexpected
    meta = {"shapeml.class": "tests.Net", "shapeml.dims": json.dumps({"D": 4, "F": 6, "L": 2})}
    path = tmp_path / "bad.safetensors"
    safetensors.numpy.save_file(arrays, path, metadata=meta)
    with pytest.raises(sm.ShapemlError, match="E1301") as e:
        sm.load(path, Net)
    msg = str(e.value)
    assert "6 problem(s)" in msg
    assert "missing: `blocks.0.w1` [4 6] float32" in msg
    assert "missing: `blocks.1.w2` [6 4] float32" in msg
    assert (
        "unexpected: `blocks.0.W1` [4 6] float32 (a missing entry with a similar name exists: `blocks.0.w1`)"
        in msg
    )
    assert "unexpected: `extra`" in msg
    assert "wrong shape: `emb` expected [4 4] float32, file has [4 5] float32" in msg
    assert "wrong dtype: `steps` expected int32, file has float32" in msg


def test_dims_mismatch_is_named(tmp_path):
    path = sm.save(tmp_path / "wide.safetensors", Net.init(seed=0, D=8))
    with pytest.raises(sm.ShapemlError, match="E1303") as e:
        sm.load(path, like=Net.init(seed=0))
    assert "other dims" in str(e.value) and "D: file 8, model 4" in str(e.value)
    with pytest.raises(sm.ShapemlError, match="E1303") as e:
        sm.load(path, Block)
    assert "holds a" in str(e.value) and "not a `Block`" in str(e.value)


def test_atomic_save_keeps_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "net.safetensors"
    old = Net.init(seed=0)
    sm.save(path, old)
    before = path.read_bytes()

    def crash(*args):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError, match="simulated"):
        sm.save(path, Net.init(seed=1))
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["net.safetensors"]  # no temp file left


@pytest.mark.parametrize(
    "mangle, needle",
    [
        (lambda b: b[: len(b) // 2], "not a valid safetensors checkpoint"),
        (lambda b: b[:5], "too short"),
        (lambda b: b"", "too short"),
        (lambda b: b"\x80\x04\x95" + b"pickle" * 20, "header claims"),
        (lambda b: b[:8] + b"{not json" + b[17:], "not JSON"),
        (lambda b: b[:-7], "not a valid safetensors checkpoint"),
    ],
)
def test_corrupted_and_truncated_files_raise_e1302(tmp_path, mangle, needle):
    path = tmp_path / "net.safetensors"
    sm.save(path, Net.init(seed=0))
    path.write_bytes(mangle(path.read_bytes()))
    with pytest.raises(sm.ShapemlError, match="E1302") as e:
        sm.load(path, Net)
    assert needle in str(e.value)


def test_missing_file_raises_e1304(tmp_path):
    with pytest.raises(FileNotFoundError, match="E1304"):
        sm.load(tmp_path / "nope.safetensors", Net)


def test_loaded_model_runs_under_jit(tmp_path):
    m = Net.init(seed=2)
    loaded = sm.load(sm.save(tmp_path / "n.safetensors", m), Net)
    f = jax.jit(lambda m: jnp.sum(m.emb @ m.blocks[0].w1))
    np.testing.assert_allclose(f(loaded), f(m), rtol=1e-6)


def test_bfloat16_and_bool_round_trip(tmp_path):
    class Half(sm.Model):
        dims = sm.Dims(D=4)
        w: Float[Array, "D D"] = sm.param(sm.normal(), dtype=jnp.bfloat16)
        mask: Bool[Array, " D"] = sm.buffer(sm.ones)

    m = Half.init(seed=0)
    assert_same(sm.load(sm.save(tmp_path / "half.safetensors", m), Half), m)


def test_save_refuses_what_load_could_not_read_and_missing_folders(tmp_path):
    ensemble = jax.vmap(lambda s: Net.init(seed=s))(jnp.arange(3))
    with pytest.raises(sm.ShapemlError, match="E0902") as e:
        sm.save(tmp_path / "ens.safetensors", ensemble)
    assert "save each member of an ensemble" in str(e.value)
    assert not (tmp_path / "ens.safetensors").exists()
    with pytest.raises(FileNotFoundError, match="E1305") as e:
        sm.save(tmp_path / "no" / "such" / "net.safetensors", Net.init())
    assert "the folder" in str(e.value) and "no/such" in str(e.value)
