"""`sm.load_exported`: read a file written by `sm.export` and call its program.

The file is read by the file layer (`shapeml._io.read_safetensors`: E1304 for a missing file,
E1302 for one that is not valid safetensors); this module checks what only an export has: its
format, metadata, checksums, and that the tensors fit the serialized program (E1506, E1507),
and, on every call, that the inputs fit the program (E1508).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import typing

import jax
import jax.numpy as jnp
import numpy as np

from .._io import read_safetensors
from .._traceback import api_boundary
from .._validate import shorten
from ._errors import ArtifactCorruptError, ArtifactMismatchError, ExportedInputError
from ._export import FORMAT, VERSION, digest

_REEXPORT = "re-export the model with `sm.export(f, model, example_inputs, path)`"


# What a manifest entry may say: the dtypes `sm.export` writes (the file layer reads no others).
_DTYPES = frozenset(
    ["float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8"]
    + ["uint64", "uint32", "uint16", "uint8", "bool", "float8_e4m3fn", "float8_e5m2"]
)
_MAX_INPUTS = 100_000


@api_boundary
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

    @typing.no_type_check  # validates its inputs itself, with E1508
    def __call__(self, *inputs):
        """Runs the program on `inputs`, checked first against `in_avals`.

        Raises:
            ExportedInputError: (E1508) naming the input, what it expects and what it got, for
                a wrong number of arrays, a non-array, or a wrong rank, dtype or size.
        """
        flat = jax.tree_util.tree_flatten_with_path(inputs)[0]
        if len(flat) != self._n_inputs:
            raise ExportedInputError(
                f"the program in {self.path} takes {self._n_inputs} input array(s), got "
                f"{len(flat)}",
                fix=f"pass inputs matching {self.in_avals}",
            )
        sizes: dict[str, tuple[int, str]] = {}
        leaves = []
        for (keys, x), aval in zip(flat, self.in_avals, strict=True):
            name = f"input {keys[0].idx}{jax.tree_util.keystr(keys[1:])}"
            leaves.append(_check_input(name, x, aval, sizes))
        try:
            return self._call(self._boundary, (), leaves)
        except (TypeError, ValueError) as e:  # a shape constraint the checks above do not model
            raise ExportedInputError(
                f"the program in {self.path} refused its inputs: {shorten(str(e), 300)}",
                fix=f"pass inputs matching {self.in_avals}",
            ) from None


def _check_input(name: str, x, aval, sizes: dict[str, tuple[int, str]]):
    """`x` if it fits `aval` (rank, dtype, fixed sizes; one value per symbolic size, >= 1)."""
    want = f"{aval.dtype}[{', '.join(map(str, aval.shape))}]"
    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    if not isinstance(shape, tuple) or dtype is None or isinstance(x, jax.ShapeDtypeStruct):
        raise ExportedInputError(
            f"{name} is {shorten(x)} ({type(x).__name__}), not an array; expected {want}",
            fix=f"pass jnp.asarray(x, jnp.{aval.dtype})",
        )
    got = f"{dtype}[{', '.join(map(str, shape))}]"
    if len(shape) != len(aval.shape):
        raise ExportedInputError(
            f"{name} has rank {len(shape)} ({got}); expected rank {len(aval.shape)} ({want})",
            fix="reshape it to the rank the program was exported with",
        )
    if dtype != aval.dtype:
        raise ExportedInputError(
            f"{name} has dtype {dtype} ({got}); expected {aval.dtype} ({want})",
            fix=f"cast it first: x.astype(jnp.{aval.dtype})",
        )
    for axis, (n, dim) in enumerate(zip(shape, aval.shape, strict=True)):
        if isinstance(dim, int):
            if n != dim:
                raise ExportedInputError(
                    f"{name} has size {n} on axis {axis} ({got}); expected {dim} ({want})",
                    fix=f"pass an array of shape {want}",
                )
            continue
        symbol = str(dim)
        if not symbol.isidentifier():
            continue  # an expression: the program itself checks it
        if n < 1:
            raise ExportedInputError(
                f"{name} has size {n} on the symbolic axis {axis} `{symbol}` ({got}); the "
                f"program takes `{symbol}` >= 1",
                fix="pass at least one row",
            )
        first = sizes.setdefault(symbol, (n, name))
        if first[0] != n:
            raise ExportedInputError(
                f"{name} has `{symbol}` = {n} on axis {axis} ({got}), but {first[1]} has "
                f"`{symbol}` = {first[0]}; every input shares `{symbol}`",
                fix=f"pass every input with the same size along `{symbol}`",
            )
    return x


@api_boundary
@typing.no_type_check  # validates its argument itself, with coded errors
def load_exported(path: str | os.PathLike) -> Exported:
    """Loads a file written by `sm.export`; returns a callable of the inputs.

    Everything is checked before it is used: the metadata's format, version, manifest and counts,
    then the checksums of the program and the tensors, then each tensor's shape and dtype against
    the manifest (before an int8 tensor is dequantized) and against the program.

    Raises:
        ArgumentTypeError, ArgumentError: (E0003, E0002) for a path that is not a str or Path.
        FileMissingError: (E1304) if there is no such file, or it is a folder.
        FileFormatError: (E1302) if it is not a valid safetensors file (truncated, not one).
        FileAccessError: (E1306) if the system refuses to read it (no permission, ...).
        ArtifactCorruptError: (E1506) if it is not an export, its metadata is damaged, or a
            checksum fails.
        ArtifactMismatchError: (E1507) if the tensors do not match the program or manifest.
    """
    # Non-finite values need no warning here: `sm.export` writes none (the file layer refuses
    # them), and a file changed after writing fails its checksum below.
    tensors, metadata = read_safetensors(path, fix=_REEXPORT, allow_nonfinite=True)
    path = os.fspath(path)
    if metadata.get("format") != FORMAT:
        raise ArtifactCorruptError(
            f"{path} is a safetensors file but not a shapeml export (no `format: {FORMAT}`)",
            fix="load plain checkpoints with the checkpoint loader; write artifacts with sm.export",
        )
    if metadata.get("version") != VERSION:
        raise ArtifactMismatchError(
            f"{path} has export format version {shorten(metadata.get('version'))}; this shapeml "
            f"reads version {VERSION}",
            fix="re-export the model with this version of shapeml",
        )
    program, manifest, n_inputs = _read_metadata(path, metadata)
    if hashlib.sha256(program).hexdigest() != metadata.get("program_sha256"):
        raise ArtifactCorruptError(
            f"{path}: the serialized program does not match its checksum",
            fix="re-export the model with `sm.export`; the file was damaged after writing",
        )
    if digest(tensors) != metadata.get("tensors_sha256"):
        raise ArtifactCorruptError(
            f"{path}: the stored tensors do not match their checksum",
            fix="re-export the model with `sm.export`; the file was damaged after writing",
        )
    try:
        exported = jax.export.deserialize(bytearray(program))
    except Exception as e:
        raise ArtifactCorruptError(
            f"{path}: jax.export could not read the program ({type(e).__name__}: "
            f"{shorten(str(e))})",
            fix="re-export with the JAX version that loads it; written with JAX "
            f"{shorten(metadata.get('jax_version'))}",
        ) from e
    if len(exported.in_avals) != len(manifest) + n_inputs:
        raise ArtifactMismatchError(
            f"{path}: the program takes {len(exported.in_avals)} arrays but the manifest lists "
            f"{len(manifest)} tensors and {n_inputs} inputs",
            fix=_REEXPORT,
        )
    boundary = []
    for entry, aval in zip(manifest, exported.in_avals, strict=False):
        arr = _restore(tensors, entry, path)
        if tuple(arr.shape) != tuple(aval.shape) or arr.dtype != aval.dtype:
            raise ArtifactMismatchError(
                f"{path}: tensor `{entry['name']}` is {arr.dtype}{list(arr.shape)} but the "
                f"program expects {aval.dtype}{list(aval.shape)}",
                fix="re-export the model with `sm.export`; tensors and program come from "
                "different exports",
            )
        boundary.append(jnp.asarray(arr))
    return Exported(exported, tuple(boundary), n_inputs, path)


def _read_metadata(path: str, metadata: dict) -> tuple[bytes, list[dict], int]:
    """`(program bytes, manifest, number of inputs)`, each checked for type and range.

    Raises:
        ArtifactCorruptError: (E1506) naming the damaged field.
    """

    def damaged(what: str) -> ArtifactCorruptError:
        return ArtifactCorruptError(
            f"{path}: the export metadata is damaged: {what}", fix=_REEXPORT
        )

    try:
        program = base64.b64decode(metadata.get("program", ""), validate=True)
    except (binascii.Error, ValueError):
        raise damaged("`program` is not base64") from None
    if not program:
        raise damaged("`program` is empty")
    n = metadata.get("n_inputs", "")
    if not (n.isascii() and n.isdigit() and len(n) <= 6) or int(n) > _MAX_INPUTS:
        raise damaged(f"`n_inputs` is {shorten(n)}, not a count of inputs")
    try:
        manifest = json.loads(metadata.get("manifest", ""))
    except (ValueError, RecursionError):
        raise damaged("`manifest` is not JSON") from None
    if not isinstance(manifest, list):
        raise damaged(f"`manifest` is a {type(manifest).__name__}, not a list")
    names = set()
    for i, entry in enumerate(manifest):
        problem = _entry_problem(entry)
        if problem is None and entry["name"] in names:
            problem = f"the name {entry['name']!r} is listed twice"
        if problem:
            raise damaged(f"manifest entry {i} {problem}")
        names.add(entry["name"])
    return program, manifest, int(n)


def _entry_problem(entry) -> str | None:
    """What is wrong with one manifest entry, or None."""
    if not isinstance(entry, dict) or set(entry) != {"name", "shape", "dtype", "quantized"}:
        return "is not {name, shape, dtype, quantized}"
    shape = entry["shape"]
    if not isinstance(entry["name"], str) or not entry["name"]:
        return "has no name"
    if not isinstance(shape, list) or not all(type(d) is int and 0 <= d < 2**62 for d in shape):
        return f"has the shape {shorten(shape)}, not a list of sizes"
    if not isinstance(entry["dtype"], str) or entry["dtype"] not in _DTYPES:
        return f"has the dtype {shorten(entry['dtype'])}"
    if not isinstance(entry["quantized"], bool):
        return "does not say whether it is quantized"
    return None


def _restore(tensors: dict, entry: dict, path: str) -> np.ndarray:
    """The tensor of a (checked) manifest entry, checked against the entry before it is
    dequantized: the float tensor is allocated only once its int8 source has the listed shape."""
    name, shape = entry["name"], tuple(entry["shape"])
    want = [name + ".q", name + ".scale"] if entry["quantized"] else [name]
    missing = [k for k in want if k not in tensors]
    if missing:
        raise ArtifactMismatchError(
            f"{path}: tensor(s) {missing} listed in the manifest are not in the file",
            fix=_REEXPORT,
        )

    def mismatch(arr, label: str, dtype: str, want_shape: tuple) -> ArtifactMismatchError:
        return ArtifactMismatchError(
            f"{path}: tensor `{label}` is {arr.dtype}{list(arr.shape)}, the manifest says "
            f"{dtype}{list(want_shape)}",
            fix=_REEXPORT,
        )

    if not entry["quantized"]:
        arr = tensors[name]
        if arr.shape != shape or str(arr.dtype) != entry["dtype"]:
            raise mismatch(arr, name, entry["dtype"], shape)
        return arr
    q, scale = tensors[name + ".q"], tensors[name + ".scale"]
    if q.shape != shape or q.dtype != np.int8 or not shape:
        raise mismatch(q, name + ".q", "int8", shape)
    if scale.shape != shape[-1:] or scale.dtype != np.float32:
        raise mismatch(scale, name + ".scale", "float32", shape[-1:])
    if not np.dtype(entry["dtype"]).kind == "f" and entry["dtype"] != "bfloat16":
        raise mismatch(q, name, entry["dtype"], shape)
    return (q.astype(np.float32) * scale).astype(entry["dtype"])
