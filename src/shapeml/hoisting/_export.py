"""Baked artifacts: the main program serialized with `jax.export` beside the prepared tensors.

One safetensors file holds the prepared tensors (optionally int8 per channel) and, in its
metadata, the serialized program, a manifest of the tensors and checksums of both. Loading it
needs neither the model's Python code nor shapeml's tracing.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import safetensors
import safetensors.numpy

from .. import _jax_internals as ji
from .._files import atomic_write
from .._version import __version__
from ._errors import ArtifactCorruptError, ArtifactMismatchError, ExportError
from ._hoist import Hoisted
from ._program import is_array

_FORMAT = "shapeml-export"
_VERSION = "1"
# Tensors smaller than this are stored as they are: quantizing them saves nothing worth the error.
_MIN_QUANT_SIZE = 1024


def export(
    f: Callable,
    model: Any,
    example_inputs: Sequence,
    path: str | os.PathLike,
    *,
    quantize: str | None = None,
    batch_axis: int | None = 0,
    max_prepared_bytes: int | None = None,
) -> None:
    """Writes `f(model, *inputs)` as one file runnable without the model's code.

    The weight-only part is evaluated now (as `sm.hoist` splits it); the per-call part is
    serialized with `jax.export`, with axis `batch_axis` of every input leaf symbolic (one shared
    size `b`), so the loaded function accepts any batch size.

    Args:
        f: the function, `f(model, *inputs)`.
        model: the weights, a pytree of arrays without PRNG keys.
        example_inputs: a tuple of inputs (arrays or `jax.ShapeDtypeStruct`s) giving the
            structure, dtypes and non-batch sizes.
        path: the file to write (atomically: a temporary file, fsync, rename).
        quantize: None to store tensors as computed, or "int8" to store every float tensor of
            rank >= 2 and >= 1024 elements as int8 with one float32 scale per last-axis channel
            (dequantized once, at load).
        batch_axis: the input axis made symbolic, or None for fixed shapes.
        max_prepared_bytes: as in `sm.hoist`.

    Raises:
        ExportError: (E1505) for keys in the weights, non-array inputs, or an unknown `quantize`.
    """
    if quantize not in (None, "int8"):
        raise ExportError(
            f"`quantize={quantize!r}` is not a supported storage format",
            fix='pass quantize=None or quantize="int8"',
        )
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    w_leaves = jax.tree.leaves(model)
    for x in w_leaves:
        if hasattr(x, "dtype") and ji.is_key_dtype(x.dtype):
            raise ExportError(
                "the weights hold a PRNG key; an exported program cannot keep per-call keys in "
                "its stored weights",
                fix="pass the key as an input: `f(model, x, key)`",
            )
    in_leaves, in_tree = jax.tree.flatten(tuple(example_inputs))
    bad = [
        type(x).__name__
        for x in in_leaves
        if not isinstance(x, (jax.Array, np.ndarray, jax.ShapeDtypeStruct))
    ]
    if bad:
        raise ExportError(
            f"example input leaves must be arrays or jax.ShapeDtypeStruct, got {bad}",
            fix="pass configuration through a closure (`functools.partial`), data as arrays",
        )
    specs = [_spec(x, batch_axis) for x in in_leaves]
    hoisted = Hoisted(f, 0, max_prepared_bytes, cut_broadcasts=True, cache_size=1)
    prog = hoisted._program((model, *jax.tree.unflatten(in_tree, specs)), {})[0]
    w_dyn = [jnp.asarray(x) for x in w_leaves if is_array(x)]
    boundary = [np.asarray(x) for x in prog.prepare(w_dyn)]
    per_call = prog.per_call(w_dyn)
    try:
        exported = jax.export.export(prog.main)(tuple(boundary), per_call, specs)
        program = bytes(exported.serialize())
    except Exception as e:  # jax.export's own errors name the unsupported part
        raise ExportError(
            f"jax.export could not serialize the per-call program: {e}",
            fix="use standard containers (tuples, lists, dicts) for inputs and outputs",
        ) from e

    tensors, manifest = {}, []
    for i, arr in enumerate(boundary):
        name = f"boundary.{i}"
        quant = (
            quantize == "int8"
            and jnp.issubdtype(arr.dtype, jnp.floating)
            and arr.ndim >= 2
            and arr.size >= _MIN_QUANT_SIZE
        )
        if quant:
            q, scale = _quantize(arr)
            tensors[name + ".q"], tensors[name + ".scale"] = q, scale
        else:
            tensors[name] = arr
        manifest.append(
            {
                "name": name,
                "shape": list(arr.shape),
                "dtype": str(arr.dtype),
                "quantized": bool(quant),
            }
        )
    metadata = {
        "format": _FORMAT,
        "version": _VERSION,
        "shapeml_version": __version__,
        "jax_version": jax.__version__,
        "program": base64.b64encode(program).decode("ascii"),
        "program_sha256": hashlib.sha256(program).hexdigest(),
        "tensors_sha256": _digest(tensors),
        "manifest": json.dumps(manifest),
        "n_inputs": str(len(specs)),
    }
    _atomic_save(tensors, os.fspath(path), metadata)


class Exported:
    """A loaded artifact: call it with the inputs (any batch size along the symbolic axis)."""

    def __init__(self, exported, boundary: tuple, n_inputs: int, path: str):
        self._exported = exported
        self._boundary = boundary
        self._n_inputs = n_inputs
        self._call = jax.jit(exported.call)
        self.path = path

    @property
    def in_avals(self) -> tuple:
        """Abstract values of the inputs, with the symbolic batch size `b`."""
        return tuple(self._exported.in_avals[len(self._boundary) :])

    def __call__(self, *inputs):
        leaves = jax.tree.leaves(inputs)
        if len(leaves) != self._n_inputs:
            raise ArtifactMismatchError(
                f"the program in {self.path} takes {self._n_inputs} input arrays, got "
                f"{len(leaves)}",
                fix=f"pass inputs matching {self.in_avals}",
            )
        return self._call(self._boundary, (), leaves)


def load_exported(path: str | os.PathLike) -> Exported:
    """Loads a file written by `sm.export`; returns a callable of the inputs.

    Raises:
        ArtifactCorruptError: (E1506) if the file is missing, unreadable, not an export, or a
            checksum fails.
        ArtifactMismatchError: (E1507) if the tensors do not match the program or manifest.
    """
    path = os.fspath(path)
    try:
        with safetensors.safe_open(path, framework="numpy") as fh:
            metadata = fh.metadata() or {}
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 (not a dict)
    except Exception as e:
        raise ArtifactCorruptError(
            f"{path} is not a readable safetensors file ({type(e).__name__}: {e})",
            fix="re-export the model with `sm.export(f, model, example_inputs, path)`",
        ) from e
    if metadata.get("format") != _FORMAT:
        raise ArtifactCorruptError(
            f"{path} is a safetensors file but not a shapeml export (no `format: {_FORMAT}`)",
            fix="load plain checkpoints with the checkpoint loader; write artifacts with sm.export",
        )
    if metadata.get("version") != _VERSION:
        raise ArtifactMismatchError(
            f"{path} has export format version {metadata.get('version')!r}; this shapeml "
            f"reads version {_VERSION}",
            fix="re-export the model with this version of shapeml",
        )
    try:
        program = base64.b64decode(metadata["program"], validate=True)
        manifest = json.loads(metadata["manifest"])
        n_inputs = int(metadata["n_inputs"])
    except Exception as e:
        raise ArtifactCorruptError(
            f"{path}: the export metadata is damaged ({type(e).__name__}: {e})",
            fix="re-export the model with `sm.export`",
        ) from e
    if hashlib.sha256(program).hexdigest() != metadata.get("program_sha256"):
        raise ArtifactCorruptError(
            f"{path}: the serialized program does not match its checksum",
            fix="re-export the model with `sm.export`; the file was damaged after writing",
        )
    if _digest(tensors) != metadata.get("tensors_sha256"):
        raise ArtifactCorruptError(
            f"{path}: the stored tensors do not match their checksum",
            fix="re-export the model with `sm.export`; the file was damaged after writing",
        )
    try:
        exported = jax.export.deserialize(bytearray(program))
    except Exception as e:
        raise ArtifactCorruptError(
            f"{path}: jax.export could not read the program ({type(e).__name__}: {e})",
            fix="re-export with the JAX version that loads it; written with JAX "
            f"{metadata.get('jax_version')}",
        ) from e
    boundary = tuple(_restore(tensors, entry, path) for entry in manifest)
    expected = exported.in_avals[: len(boundary)]
    if len(exported.in_avals) != len(boundary) + n_inputs:
        raise ArtifactMismatchError(
            f"{path}: the program takes {len(exported.in_avals)} arrays but the manifest lists "
            f"{len(boundary)} tensors and {n_inputs} inputs",
            fix="re-export the model with `sm.export`",
        )
    for entry, arr, aval in zip(manifest, boundary, expected):
        if tuple(arr.shape) != tuple(aval.shape) or arr.dtype != aval.dtype:
            raise ArtifactMismatchError(
                f"{path}: tensor `{entry['name']}` is {arr.dtype}{list(arr.shape)} but the "
                f"program expects {aval.dtype}{list(aval.shape)}",
                fix="re-export the model with `sm.export`; tensors and program come from "
                "different exports",
            )
    return Exported(exported, boundary, n_inputs, path)


def _spec(x, batch_axis: int | None) -> jax.ShapeDtypeStruct:
    shape = list(x.shape)
    if batch_axis is not None and len(shape) > batch_axis:
        shape[batch_axis] = jax.export.symbolic_shape("b")[0]
    return jax.ShapeDtypeStruct(tuple(shape), x.dtype)


def _quantize(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 with one float32 scale per channel of the last axis (symmetric, round half even)."""
    w32 = w.astype(np.float32)
    amax = np.max(np.abs(w32.reshape(-1, w32.shape[-1])), axis=0)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.round(w32 / scale), -127, 127).astype(np.int8)
    return q, scale


def _restore(tensors: dict, entry: dict, path: str) -> jax.Array:
    name = entry["name"]
    want = [name + ".q", name + ".scale"] if entry["quantized"] else [name]
    missing = [k for k in want if k not in tensors]
    if missing:
        raise ArtifactMismatchError(
            f"{path}: tensor(s) {missing} listed in the manifest are not in the file",
            fix="re-export the model with `sm.export`",
        )
    if not entry["quantized"]:
        arr = tensors[name]
    else:
        q, scale = tensors[name + ".q"], tensors[name + ".scale"]
        if q.shape[-1:] != scale.shape:
            raise ArtifactMismatchError(
                f"{path}: `{name}` has {q.shape[-1]} channels but {scale.shape} scales",
                fix="re-export the model with `sm.export`",
            )
        arr = (q.astype(np.float32) * scale).astype(entry["dtype"])
    if list(arr.shape) != entry["shape"] or str(arr.dtype) != entry["dtype"]:
        raise ArtifactMismatchError(
            f"{path}: tensor `{name}` is {arr.dtype}{list(arr.shape)}, the manifest says "
            f"{entry['dtype']}{entry['shape']}",
            fix="re-export the model with `sm.export`",
        )
    return jnp.asarray(arr)


def _digest(tensors: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(tensors):
        arr = np.ascontiguousarray(tensors[k])
        h.update(f"{k}:{arr.dtype}:{arr.shape};".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def _atomic_save(tensors: dict, path: str, metadata: dict) -> None:
    atomic_write(path, safetensors.numpy.save(tensors, metadata=metadata))
