"""Checkpoints: safetensors files keyed by dotted field name, checked by name, shape and dtype.

Writes are atomic (a temp folder next to the file, fsync, rename), so a crash mid-save leaves the old
file intact; reads never unpickle anything, and a bad file raises before any state changes.
"""

from __future__ import annotations

import os
import typing
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from .._errors import ArgumentTypeError, ShapemlError
from .._io import FileFormatError, FileMissingError, read_safetensors, write_safetensors
from .._job._single_file import in_job, on_host, write_from_job
from .._traceback import api_boundary
from .._validate import shorten
from ._checks import statics_of
from ._dims import Dims
from ._entries import entry_problems, first_problems
from ._introspect import declared, statics, tensors
from ._limits import check_size, max_bytes_of, tensor_count
from ._mapped import child_dims
from ._metadata import check_kinds, model_metadata, saved_dims, saved_statics
from ._model import Model, ShapeMismatchError

# `entry_problems`, `model_from_arrays` and `model_metadata` are the checkpoint codec that the
# optimizer's checkpoints (`shapeml.optim`) build on: a model's entries inside a larger file;
# `sm.load` (`_load`) reads a model file through `read_model_file` and the same codec.
__all__ = [
    "CheckpointError",
    "CheckpointFileError",
    "build_model",
    "entry_problems",
    "model_from_arrays",
    "model_metadata",
    "read_model_file",
    "save",
]


class CheckpointError(
    ShapemlError,
    ValueError,
    code="E1301",
    title="checkpoint does not match",
    explanation="""
A checkpoint's entries do not match the model it is loaded into. Every problem is reported at once:
entries the model needs but the file lacks (missing), entries the file has but the model does not
declare (unexpected, with the likely intended name), and entries whose shape or dtype differ.

Checkpoints are keyed by dotted field name (`w_e`, `blocks.0.w1`), so two same-shaped tensors can
never be swapped. If you renamed a field, rename the entry or load into the old class and
`replace` fields onto the new one.
""",
):
    pass


class CheckpointModelError(
    ShapemlError,
    ValueError,
    code="E1303",
    title="checkpoint is for another model or other dims",
    explanation="""
The checkpoint was saved from another model class, or with other dims or options (static fields)
than the model it is being loaded like. The message names the class, or each dim or option that
differs, with both values.

`sm.load(path, Cls)` takes the dims and options from the file; `sm.load(path, like=m)` requires
the file's dims to equal `m.dims` and its options `m`'s. Build the model with the file's dims and
options, e.g. `Spotter.init(seed=0, D=64)`, `nn.Linear.init(seed=0, bias=False)`.
""",
):
    pass


# The file layer's errors, under the names checkpoints have always used.
CheckpointFileError = FileFormatError
CheckpointMissingError = FileMissingError


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def save(
    path: str | os.PathLike, m: Model, *, allow_nonfinite: bool | Collection[str] = False
) -> Path:
    """Saves every param and buffer of `m` by dotted name, with its class, dims and version.

    The write is atomic: a crash mid-save leaves any old file at `path` intact, and the next save
    there removes the temp the crash left.

    In a job of several processes whose model is split over their devices, call it in every
    process (as PyTorch's FSDP full state dict): each gives its shards, the whole model is
    gathered, process 0 writes the one file and the others return once it is complete. `sm.load`
    reads it in any process count; `sharding.load(..., mesh=, rules=)` places it on a job's
    mesh. A replicated (data-parallel) model is whole in every process: the process that calls
    it writes it (`if info.is_main: sm.save(...)`, as `torch.save` under `if rank == 0:`). For
    sharded, asynchronous checkpoints use `distributed.CheckpointManager`.

    Args:
        path: the file to write (its folder must exist).
        m: the model.
        allow_nonfinite: True to write NaN/inf values anyway, or the dotted names that may hold
            them; by default a model holding any is refused and nothing is written.

    Raises:
        NonFiniteError: (E1307) naming every tensor holding NaN or an infinity.
        ShapeMismatchError: (E0902) for a model whose tensors differ from its declaration.
        FolderMissingError: (E1305), FileAccessError: (E1306) when the file cannot be written.
        JobSaveError: (E2208) in a job, when not every process calls it, or in the others when
            process 0 could not write.

    Example:
        >>> sm.save("spotter.safetensors", m)
    """
    if not isinstance(m, Model):
        raise ArgumentTypeError(
            f"sm.save(path, m) takes an sm.Model, got {shorten(m)} ({type(m).__name__})",
            fix="pass the model second: sm.save(path, model)",
        )
    arrays = {k: v for k, (_, v) in tensors(m).items()}
    if any(isinstance(v, jax.core.Tracer) for v in arrays.values()):
        raise ArgumentTypeError(
            f"sm.save(path, m) was called inside a JAX transformation (jit, vmap, grad): the "
            f"tensors of `{type(m).__name__}` are traced, not values",
            fix="save outside the transformation, e.g. after the jitted step returns",
        )
    expected = {
        k: (shape, dtype) for k, (_, shape, dtype) in declared(type(m), m.dims, statics(m)).items()
    }
    problems = entry_problems(expected, arrays)
    if problems:  # e.g. a vmapped ensemble: every tensor has a leading axis no `load` expects
        raise ShapeMismatchError(
            f"`{type(m).__name__}` holds tensors that differ from its declaration, so no load "
            "could read the file back:\n    " + "\n    ".join(problems),
            fix="save each member of an ensemble on its own: "
            "sm.save(path_i, jax.tree.map(lambda a: a[i], models))",
        )
    meta = model_metadata(m)
    if in_job(arrays):  # shards on other processes' devices: gathered, written by process 0
        return write_from_job(
            path,
            arrays,
            lambda whole: write_safetensors(path, whole, meta, allow_nonfinite=allow_nonfinite),
        )
    return write_safetensors(path, on_host(arrays), meta, allow_nonfinite=allow_nonfinite)


@typing.no_type_check  # validates its arguments itself, with coded errors
def read_model_file(path, cls, like, max_bytes, allow_nonfinite):
    """What every model loader shares: the arguments checked, then the file read and checked
    to be a model file. Returns `(cls, arrays, metadata, max_bytes)`, for `model_from_arrays`."""
    if (cls is None) == (like is None):
        raise ArgumentTypeError(
            "sm.load(path, Cls) or sm.load(path, like=model): give exactly one",
            fix="pass the model class, or a model to load like",
        )
    if like is not None and not isinstance(like, Model):
        raise ArgumentTypeError(
            f"sm.load(path, like=...) takes a model, got {shorten(like)} ({type(like).__name__})",
            fix="pass a model instance as like=, or its class second: sm.load(path, Cls)",
        )
    if cls is not None and not (isinstance(cls, type) and issubclass(cls, Model)):
        hint = "sm.load(path, like=m)" if isinstance(cls, Model) else "sm.load(path, Spotter)"
        raise ArgumentTypeError(
            f"sm.load(path, cls) takes an sm.Model class, got {shorten(cls)} ({type(cls).__name__})",
            fix=f"pass the class the file was saved from, e.g. {hint}",
        )
    cls = type(like) if like is not None else cls
    limit = max_bytes_of(max_bytes)
    arrays, meta = read_safetensors(
        path,
        fix="re-save it with sm.save(path, model); if it was copied, check the copy finished",
        max_bytes=limit,
        allow_nonfinite=allow_nonfinite,
    )
    if meta.get("shapeml.format", "model") == "checkpoint":
        raise CheckpointModelError(
            f"`{path}` is a training checkpoint (a model and its optimizer), not a model file",
            fix="load it with sm.load_checkpoint(path, Cls)",
        )
    return cls, arrays, meta, limit


def model_from_arrays(
    cls: type[Model],
    arrays: Mapping[str, Any],
    meta: Mapping[str, str],
    source: str,
    like_dims: Dims | None = None,
    *,
    max_bytes: int | None = None,
    like_statics: Mapping[str, Any] | None = None,
) -> Model:
    """Builds a `cls` from dotted-name arrays and checkpoint metadata, checking everything.

    The metadata is checked first (E1302 for a malformed value), then the model's size from its
    dims (E0906 beyond `max_bytes`, default 16 GiB), then every entry (E1301), then it is built.
    """
    saved_class = meta.get("shapeml.class", "")
    if saved_class and saved_class.rsplit(".", 1)[-1] != cls.__qualname__.rsplit(".", 1)[-1]:
        raise CheckpointModelError(
            f"`{source}` holds a `{saved_class}`, not a `{cls.__qualname__}`",
            fix=f"load it with the class it was saved from: sm.load(path, {saved_class.rsplit('.', 1)[-1]})",
        )
    dims = _file_dims(cls, meta, source)
    if like_dims is not None and dims != like_dims:
        diff = ", ".join(
            f"{k}: file {dims[k]}, model {like_dims[k]}" for k in dims if dims[k] != like_dims[k]
        )
        raise CheckpointModelError(
            f"`{source}` was saved with other dims than the model it is loaded like ({diff})",
            fix=f"load with sm.load(path, {cls.__name__}) to take the file's dims",
        )
    check_kinds(meta, source)
    saved = saved_statics(meta, source)
    if like_statics is not None:
        _check_like_statics(saved, like_statics, source, cls)
    check_size(cls, dims, max_bytes_of(max_bytes), f"loading `{source}`", saved)
    count = tensor_count(cls, dims, saved)
    if count > len(arrays):  # refused before the names are listed: a file's dims may say L=10**5
        raise CheckpointError(
            f"`{source}` holds {len(arrays)} tensor(s), but `{cls.__name__}` "
            f"({' '.join(f'{k}={v}' for k, v in dims.items())}) has at least {count}",
            fix="load into the model class and dims the file was saved from",
        )
    expected = {k: (shape, dtype) for k, (_, shape, dtype) in declared(cls, dims, saved).items()}
    problems = entry_problems(expected, arrays)
    if problems:
        raise CheckpointError(
            f"`{source}` does not match `{cls.__name__}` ({' '.join(f'{k}={v}' for k, v in dims.items())}): "
            f"{len(problems)} problem(s):\n    " + "\n    ".join(first_problems(problems)),
            fix="load into the model class and dims the file was saved from, or rename the entries",
        )
    return build_model(cls, dims, arrays, "", saved)


def _check_like_statics(saved: Mapping, like: Mapping, source: str, cls: type) -> None:
    """E1303 unless a file saved every static of the model it is loaded like with its value (a
    file that names no statics, not written by shapeml, is taken as it is)."""
    if not saved:
        return
    diff = [
        f"{k}: file {saved.get(k)!r}, model {v!r}" for k, v in like.items() if saved.get(k) != v
    ]
    if diff:
        raise CheckpointModelError(
            f"`{source}` was saved with other options than the model it is loaded like "
            f"({'; '.join(diff[:8])})",
            fix=f"load with sm.load(path, {cls.__name__}) to take the file's options, or build "
            "the model with the file's options",
        )


def _file_dims(cls: type[Model], meta: Mapping[str, str], source: str) -> Dims:
    saved = saved_dims(meta, source)
    unknown = [k for k in saved if k not in cls.dims]
    if unknown:
        raise CheckpointModelError(
            f"`{source}` was saved with dims {shorten(unknown)} that `{cls.__name__}` does not "
            "declare",
            fix="load it into the model class it was saved from",
        )
    return cls.dims.resolve(**{k: v for k, v in saved.items() if k in cls.dims.free})


def build_model(
    cls: type[Model], dims: Dims, arrays: Mapping[str, Any], prefix: str, saved: Mapping
) -> Model:
    """A `cls` with these dims from its entries by dotted name (already checked) and statics."""
    own = statics_of(cls, saved, prefix)
    values: dict[str, Any] = dict(own)
    for name, spec in cls.__shapeml_fields__.items():
        if spec.kind in ("submodel", "submodels"):
            sub = child_dims(spec, dims)
            paths = (
                [f"{prefix}{name}."]
                if spec.kind == "submodel"
                else [f"{prefix}{name}.{i}." for i in range(spec.count_in(dims))]
            )
            options = {p + k: v for p in paths for k, v in spec.mapped.options_in(own)}
            merged = {**saved, **options}  # once: a copy per sub-model is quadratic in their count
            models = [build_model(spec.model, sub, arrays, p, merged) for p in paths]
            values[name] = models[0] if spec.kind == "submodel" else tuple(models)
        elif spec.present(own):
            values[name] = jnp.asarray(arrays[prefix + name])
    return cls(dims=dims, **values)
