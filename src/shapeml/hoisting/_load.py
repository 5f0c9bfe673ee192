"""`sm.load_exported`: read a file written by `sm.export` and call its program.

The file is read by the file layer (`shapeml._files.read_safetensors`: E1304 for a missing file,
E1302 for one that is not valid safetensors); this module checks what only an export has: its
format, checksums, and that the tensors fit the serialized program (E1506, E1507).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from .._files import read_safetensors
from ._errors import ArtifactCorruptError, ArtifactMismatchError
from ._export import FORMAT, VERSION, digest

_REEXPORT = "re-export the model with `sm.export(f, model, example_inputs, path)`"


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
        FileMissingError: (E1304) if there is no such file.
        FileFormatError: (E1302) if it is not a valid safetensors file (truncated, not one).
        ArtifactCorruptError: (E1506) if it is not an export, or a checksum fails.
        ArtifactMismatchError: (E1507) if the tensors do not match the program or manifest.
    """
    path = os.fspath(path)
    tensors, metadata = read_safetensors(path, fix=_REEXPORT)
    if metadata.get("format") != FORMAT:
        raise ArtifactCorruptError(
            f"{path} is a safetensors file but not a shapeml export (no `format: {FORMAT}`)",
            fix="load plain checkpoints with the checkpoint loader; write artifacts with sm.export",
        )
    if metadata.get("version") != VERSION:
        raise ArtifactMismatchError(
            f"{path} has export format version {metadata.get('version')!r}; this shapeml "
            f"reads version {VERSION}",
            fix="re-export the model with this version of shapeml",
        )
    try:
        program = base64.b64decode(metadata["program"], validate=True)
        manifest = json.loads(metadata["manifest"])
        n_inputs = int(metadata["n_inputs"])
    except Exception as e:
        raise ArtifactCorruptError(
            f"{path}: the export metadata is damaged ({type(e).__name__}: {e})",
            fix=_REEXPORT,
        ) from e
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
            fix=_REEXPORT,
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


def _restore(tensors: dict, entry: dict, path: str) -> jax.Array:
    name = entry["name"]
    want = [name + ".q", name + ".scale"] if entry["quantized"] else [name]
    missing = [k for k in want if k not in tensors]
    if missing:
        raise ArtifactMismatchError(
            f"{path}: tensor(s) {missing} listed in the manifest are not in the file",
            fix=_REEXPORT,
        )
    if not entry["quantized"]:
        arr = tensors[name]
    else:
        q, scale = tensors[name + ".q"], tensors[name + ".scale"]
        if q.shape[-1:] != scale.shape:
            raise ArtifactMismatchError(
                f"{path}: `{name}` has {q.shape[-1]} channels but {scale.shape} scales",
                fix=_REEXPORT,
            )
        arr = (q.astype(np.float32) * scale).astype(entry["dtype"])
    if list(arr.shape) != entry["shape"] or str(arr.dtype) != entry["dtype"]:
        raise ArtifactMismatchError(
            f"{path}: tensor `{name}` is {arr.dtype}{list(arr.shape)}, the manifest says "
            f"{entry['dtype']}{entry['shape']}",
            fix=_REEXPORT,
        )
    return jnp.asarray(arr)
