"""`sm.export`: the main program serialized with `jax.export` beside the prepared tensors.

One safetensors file (written by the file layer, `shapeml._io`) holds the prepared tensors
(optionally int8 per channel) and, in its metadata, the serialized program, a manifest of the
tensors and checksums of both. `sm.load_exported` (`_load.py`) reads it back without the model's
Python code or shapeml's tracing.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _jax_internals as ji
from .._io import (
    FileAccessError,
    FolderMissingError,
    NonFiniteError,
    as_path,
    names_text,
    nonfinite,
    write_safetensors,
)
from .._traceback import api_boundary
from .._validate import integer, shorten
from .._version import __version__
from ._errors import ExportError
from ._hoist import Hoisted, check_options
from ._static import is_array

FORMAT = "shapeml-export"
VERSION = "1"
# Tensors smaller than this are stored as they are: quantizing them saves nothing worth the error.
_MIN_QUANT_SIZE = 1024


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
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
        FolderMissingError: (E1305) if the folder of `path` does not exist.
        FileAccessError: (E1306) if `path` is a folder or cannot be written.
        ArgumentTypeError, ArgumentError: (E0003, E0002) for a non-callable `f`, a path that is
            not a str or Path, a negative or non-int `batch_axis` or `max_prepared_bytes`.

    Every argument is checked before anything is traced or written.
    """
    check_options(f, 0, max_prepared_bytes)
    path = _target(path)
    if batch_axis is not None:
        batch_axis = integer(
            "batch_axis", batch_axis, low=0, fix="pass the input axis to make symbolic, or None"
        )
    if not (quantize is None or (isinstance(quantize, str) and quantize == "int8")):
        raise ExportError(
            f"`quantize={shorten(quantize)}` is not a supported storage format",
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
    weights = {
        jax.tree_util.keystr(p): np.asarray(x)
        for p, x in jax.tree_util.tree_flatten_with_path(model)[0]
        if is_array(x)
    }
    bad_weights = nonfinite(weights)
    if bad_weights:
        raise NonFiniteError(
            f"the weights {names_text(bad_weights)} hold NaN or inf; nothing was exported",
            fix="export a model from a run that did not diverge (its last good checkpoint)",
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
    # One symbol for every input: each symbolic_shape call makes its own scope, and sizes from
    # two scopes cannot meet in one program (x * y would not broadcast).
    b = jax.export.symbolic_shape("b")[0]
    specs = [_spec(x, batch_axis, b) for x in in_leaves]
    hoisted = Hoisted(f, 0, max_prepared_bytes, cut_broadcasts=True, cache_size=1)
    prog, w_arrays, _, _ = hoisted._program_for((model, *jax.tree.unflatten(in_tree, specs)), {})
    w_dyn = [jnp.asarray(x) for x in w_arrays]
    boundary = [np.asarray(x) for x in prog.prepare(w_dyn)]
    per_call = prog.per_call(w_dyn)
    try:
        exported = jax.export.export(jax.jit(prog.main))(tuple(boundary), per_call, specs)
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
        "format": FORMAT,
        "version": VERSION,
        "shapeml_version": __version__,
        "jax_version": jax.__version__,
        "program": base64.b64encode(program).decode("ascii"),
        "program_sha256": hashlib.sha256(program).hexdigest(),
        "tensors_sha256": digest(tensors),
        "manifest": json.dumps(manifest),
        "n_inputs": str(len(specs)),
    }
    # The weights are finite (checked above): an infinity in a prepared tensor is computed on
    # purpose (a hoisted -inf attention mask), so it is stored as it is.
    write_safetensors(path, tensors, metadata, allow_nonfinite=True)


def _target(path) -> Path:
    """The path to write, checked before the export's work (tracing, preparing) starts: the
    file layer would check it again only when writing, after all that work."""
    path = as_path(path)
    if path.is_dir():
        raise FileAccessError(
            f"cannot export to `{path}`: it is a folder",
            fix=f"name a file in it, e.g. {str(path / 'model.safetensors')!r}",
        )
    if not path.parent.is_dir():
        raise FolderMissingError(
            f"cannot export to `{path}`: the folder `{path.parent}` does not exist",
            fix=f"create it first: Path({str(path.parent)!r}).mkdir(parents=True)",
        )
    return path


def _spec(x, batch_axis: int | None, b) -> jax.ShapeDtypeStruct:
    shape = list(x.shape)
    if batch_axis is not None and len(shape) > batch_axis:
        shape[batch_axis] = b
    return jax.ShapeDtypeStruct(tuple(shape), x.dtype)


def _quantize(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 with one float32 scale per channel of the last axis (symmetric, round half even)."""
    w32 = w.astype(np.float32)
    amax = np.max(np.abs(w32.reshape(-1, w32.shape[-1])), axis=0)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.round(w32 / scale), -127, 127).astype(np.int8)
    return q, scale


def digest(tensors: dict) -> str:
    """A checksum of named arrays: names, dtypes, shapes and bytes, in name order."""
    h = hashlib.sha256()
    for k in sorted(tensors):
        arr = np.ascontiguousarray(tensors[k])
        h.update(f"{k}:{arr.dtype}:{arr.shape};".encode())
        h.update(arr.tobytes())
    return h.hexdigest()
