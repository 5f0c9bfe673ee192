"""Checkpoints: safetensors files keyed by dotted field name, checked by name, shape and dtype.

Writes are atomic (a temp file in the same folder, fsync, rename), so a crash mid-save leaves the old
file intact; reads never unpickle anything, and a bad file raises before any state changes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from .._errors import ArgumentTypeError, ShapemlError, similar
from .._files import FileFormatError, FileMissingError, read_safetensors, write_safetensors
from .._version import __version__
from ._checks import child_dims
from ._dims import Dims
from ._introspect import declared, statics, tensors
from ._model import Model, ShapeMismatchError
from ._statics import from_json

# `entry_problems`, `model_from_arrays` and `model_metadata` are the checkpoint codec that the
# optimizer's checkpoints (`shapeml.optim`) build on: a model's entries inside a larger file.
__all__ = [
    "CheckpointError",
    "CheckpointFileError",
    "entry_problems",
    "load",
    "model_from_arrays",
    "model_metadata",
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
The checkpoint was saved from another model class, or with other dims than the model it is being
loaded like. The message names the class or each dim that differs, with both values.

`sm.load(path, Cls)` takes the dims from the file; `sm.load(path, like=m)` requires the file's dims
to equal `m.dims`. Build the model with the file's dims, e.g. `Spotter.init(seed=0, D=64)`.
""",
):
    pass


# The file layer's errors, under the names checkpoints have always used.
CheckpointFileError = FileFormatError
CheckpointMissingError = FileMissingError


def model_metadata(m: Model) -> dict[str, str]:
    cls = type(m)
    return {
        "shapeml.format": "model",
        "shapeml.class": f"{cls.__module__}.{cls.__qualname__}",
        "shapeml.dims": json.dumps({n: m.dims[n] for n in m.dims.free}),
        "shapeml.kinds": json.dumps({k: kind for k, (kind, _) in tensors(m).items()}),
        "shapeml.static": json.dumps(statics(m)),
        "shapeml.version": __version__,
    }


def save(path: str | os.PathLike, m: Model) -> Path:
    """Saves every param and buffer of `m` by dotted name, with its class, dims and version.

    The write is atomic: a crash mid-save leaves any old file at `path` intact.

    Example:
        >>> sm.save("spotter.safetensors", m)
    """
    if not isinstance(m, Model):
        raise ArgumentTypeError(f"sm.save(path, m) takes an sm.Model, got {type(m).__name__}")
    arrays = {k: v for k, (_, v) in tensors(m).items()}
    expected = {k: (shape, dtype) for k, (_, shape, dtype) in declared(type(m), m.dims).items()}
    problems = entry_problems(expected, {k: np.asarray(v) for k, v in arrays.items()})
    if problems:  # e.g. a vmapped ensemble: every tensor has a leading axis no `load` expects
        raise ShapeMismatchError(
            f"`{type(m).__name__}` holds tensors that differ from its declaration, so no load "
            "could read the file back:\n    " + "\n    ".join(problems),
            fix="save each member of an ensemble on its own: "
            "sm.save(path_i, jax.tree.map(lambda a: a[i], models))",
        )
    return write_safetensors(path, arrays, model_metadata(m))


def load(path: str | os.PathLike, cls: type[Model] | None = None, *, like: Model | None = None):
    """Loads a model saved by `sm.save`, checking every entry's name, shape and dtype.

    Args:
        path: the checkpoint file.
        cls: the model class; its dims are taken from the file.
        like: instead of `cls`, a model whose class and dims the file must match.

    Raises:
        CheckpointError: (E1301) listing every missing, unexpected, wrong-shape and wrong-dtype
            entry at once, with near-miss suggestions.
        CheckpointModelError: (E1303) if the file holds another class or other dims.
        CheckpointFileError: (E1302) for a truncated, corrupted or non-safetensors file.
    """
    if (cls is None) == (like is None):
        raise ArgumentTypeError("sm.load(path, Cls) or sm.load(path, like=model): give exactly one")
    cls = type(like) if like is not None else cls
    arrays, meta = read_safetensors(
        path, fix="re-save it with sm.save(path, model); if it was copied, check the copy finished"
    )
    return model_from_arrays(cls, arrays, meta, str(path), like_dims=like.dims if like else None)


def model_from_arrays(
    cls: type[Model],
    arrays: Mapping[str, np.ndarray],
    meta: Mapping[str, str],
    source: str,
    like_dims: Dims | None = None,
) -> Model:
    """Builds a `cls` from dotted-name arrays and checkpoint metadata, checking everything."""
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
    expected = {k: (shape, dtype) for k, (_, shape, dtype) in declared(cls, dims).items()}
    problems = entry_problems(expected, arrays)
    if problems:
        raise CheckpointError(
            f"`{source}` does not match `{cls.__name__}` ({' '.join(f'{k}={v}' for k, v in dims.items())}): "
            f"{len(problems)} problem(s):\n    " + "\n    ".join(problems),
            fix="load into the model class and dims the file was saved from, or rename the entries",
        )
    return _build(cls, dims, arrays, "", _file_statics(cls, meta, source))


def entry_problems(expected: Mapping[str, tuple], arrays: Mapping[str, np.ndarray]) -> list[str]:
    """Every missing, unexpected (with near-miss hints), wrong-shape and wrong-dtype entry.

    `expected` maps each name to `(shape, dtype)`.
    """
    problems = []
    missing = [k for k in expected if k not in arrays]
    for k in missing:
        problems.append(f"missing: `{k}` {_fmt(*expected[k])}")
    for k in arrays:
        if k not in expected:
            hint = similar(k, missing, what="missing entry")
            problems.append(
                f"unexpected: `{k}` {_fmt(arrays[k].shape, arrays[k].dtype)}"
                + (f" ({hint})" if hint else "")
            )
    for k, (shape, dtype) in expected.items():
        if k in arrays:
            a = arrays[k]
            if tuple(a.shape) != tuple(shape):
                problems.append(
                    f"wrong shape: `{k}` expected {_fmt(shape, dtype)}, "
                    f"file has {_fmt(a.shape, a.dtype)}"
                )
            elif np.dtype(a.dtype) != np.dtype(dtype):
                problems.append(
                    f"wrong dtype: `{k}` expected {np.dtype(dtype).name}, "
                    f"file has {np.dtype(a.dtype).name}"
                )
    return problems


def _file_dims(cls: type[Model], meta: Mapping[str, str], source: str) -> Dims:
    try:
        saved = json.loads(meta.get("shapeml.dims", "{}"))
    except json.JSONDecodeError:
        raise CheckpointFileError(
            f"`{source}` has unreadable dims metadata", fix="re-save it with sm.save"
        ) from None
    unknown = [k for k in saved if k not in cls.dims]
    if unknown:
        raise CheckpointModelError(
            f"`{source}` was saved with dims {unknown} that `{cls.__name__}` does not declare",
            fix="load it into the model class it was saved from",
        )
    return cls.dims.resolve(**{k: v for k, v in saved.items() if k in cls.dims.free})


def _file_statics(cls: type[Model], meta: Mapping[str, str], source: str) -> dict:
    try:
        saved = json.loads(meta.get("shapeml.static", "{}"))
        if not isinstance(saved, dict):
            raise ValueError(type(saved).__name__)
    except ValueError:  # JSONDecodeError is a ValueError
        raise CheckpointFileError(
            f"`{source}` has unreadable static-field metadata", fix="re-save it with sm.save"
        ) from None
    return {k: from_json(v) for k, v in saved.items()}


def _fmt(shape, dtype) -> str:
    return f"[{' '.join(map(str, shape))}] {np.dtype(dtype).name}"


def _build(
    cls: type[Model], dims: Dims, arrays: Mapping[str, np.ndarray], prefix: str, saved: dict
) -> Model:
    values = {k: saved[prefix + k] for k in cls.__shapeml_statics__ if prefix + k in saved}
    for name, spec in cls.__shapeml_fields__.items():
        if spec.kind == "submodel":
            values[name] = _build(
                spec.model, child_dims(spec.model, dims), arrays, f"{prefix}{name}.", saved
            )
        elif spec.kind == "submodels":
            sub = child_dims(spec.model, dims)
            values[name] = tuple(
                _build(spec.model, sub, arrays, f"{prefix}{name}.{i}.", saved)
                for i in range(spec.count_in(dims))
            )
        else:
            values[name] = jnp.asarray(arrays[prefix + name])
    return cls(dims=dims, **values)
