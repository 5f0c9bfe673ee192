"""Size limits of a model, checked from its class and dims before a single byte is allocated.

`Model.init` and `sm.load` compute what the model will hold (bytes, and how many tensors and
sub-models) from the declarations alone, without building anything or enumerating repeated
sub-models, and refuse a model larger than `max_bytes` (default 16 GiB) with a coded error naming
the largest field, its shape and its bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from .._errors import ShapemlError
from .._validate import held_dtype, integer
from ._checks import dims_str, statics_of
from ._dims import Dims
from ._mapped import child_dims

__all__ = ["DEFAULT_MAX_BYTES", "MAX_PARTS", "ModelTooLargeError", "check_size", "max_bytes_of"]

DEFAULT_MAX_BYTES = 16 * 2**30
"""The most a model or file may hold unless `max_bytes=` says otherwise: 16 GiB."""
# Each tensor and sub-model is a Python object built one by one; more than this is a typo'd count
# (`L=10**9`), not a model.
MAX_PARTS = 2**17


class ModelTooLargeError(
    ShapemlError,
    ValueError,
    code="E0906",
    title="model too large to build",
    explanation="""
`Model.init` or `sm.load` was asked for a model that holds more than its size limit: a field, or
all fields together, larger than `max_bytes` (default 16 GiB), or more than 131,072 tensors and
sub-models. The check runs on the declarations and dims before anything is allocated; the message
names the largest field, its shape in dims and in numbers, and its bytes.

Usually a dim is mistyped (`D=10**12`, `L=100000`). If the model really is that large, raise the
limit explicitly: `Net.init(seed=0, D=65536, max_bytes=64 * 2**30)`,
`sm.load(path, Net, max_bytes=64 * 2**30)`.
""",
):
    pass


class _Field(NamedTuple):
    name: str
    expr: str
    shape: tuple[int, ...]
    dtype: Any
    nbytes: int


class _Footprint(NamedTuple):
    nbytes: int
    parts: int  # tensors and sub-models
    tensors: int  # those that are not optional
    largest: _Field | None


def _footprint(cls: type, dims: Dims, prefix: str, statics: Mapping[str, Any]) -> _Footprint:
    """What a `cls` at dotted `prefix` holds. Repeated sub-models are counted from the first
    (never enumerated): their optional tensors are taken to be as the first one's."""
    nbytes, parts, tensors, largest = 0, 0, 0, None
    own = statics_of(cls, statics, prefix)
    for name, spec in cls.__shapeml_fields__.items():
        if spec.kind in ("submodel", "submodels"):
            count = 1 if spec.kind == "submodel" else spec.count_in(dims)
            sub = f"{prefix}{name}." + ("" if spec.kind == "submodel" else "0.")
            options = {sub + k: v for k, v in spec.mapped.options_in(own)}
            child = _footprint(spec.model, child_dims(spec, dims), sub, {**statics, **options})
            nbytes, parts = nbytes + count * child.nbytes, parts + count * (1 + child.parts)
            tensors += count * child.tensors
            field = child.largest if count else None
        elif not spec.present(own):
            continue
        else:
            shape = spec.shape_in(dims, f"`{cls.__name__}.{name}`")
            held_dtype(spec.dtype, f"`{cls.__name__}.{name}`")  # E0004 before any allocation
            size = math.prod(shape) * spec.dtype.itemsize
            field = _Field(prefix + name, spec.shape_str, shape, spec.dtype, size)
            nbytes, parts = nbytes + size, parts + 1
            tensors += not spec.optional  # an optional one may be absent from some repeats
        if field is not None and (largest is None or field.nbytes > largest.nbytes):
            largest = field
    return _Footprint(nbytes, parts, tensors, largest)


def tensor_count(cls: type, dims: Dims, statics: Mapping[str, Any]) -> int:
    """How many tensors a `cls` with these dims holds at least (its optional ones not counted),
    counted without enumerating them."""
    return _footprint(cls, dims, "", statics).tensors


def _size(n: int) -> str:
    return f"{n:,} bytes ({n / 2**30:,.1f} GiB)" if n >= 2**30 else f"{n:,} bytes"


def max_bytes_of(max_bytes: Any) -> int:
    """The limit to use: `max_bytes` checked as a whole number >= 0, or the default for None."""
    if max_bytes is None:
        return DEFAULT_MAX_BYTES
    return integer("max_bytes", max_bytes, low=0, fix="pass max_bytes as a whole number of bytes")


def check_size(
    cls: type, dims: Dims, max_bytes: int, what: str, statics: Mapping[str, Any] | None = None
) -> None:
    """Refuses (E0906) a `cls` with these dims holding more than `max_bytes` or `MAX_PARTS` parts,
    and (E0004) one declaring a dtype this process cannot hold (float64 without x64).

    Args:
        what: the action, for the message ("`Net.init`", "loading `m.safetensors` as `Net`").
        statics: static values by dotted name (which optional tensors are present); those not
            given take the declared options and defaults.
    """
    fp = _footprint(cls, dims, "", {} if statics is None else statics)
    where = f"{what}: `{cls.__name__}` ({dims_str(dims)})"
    fix = f"check the dims; if the model really is this large, pass max_bytes={max(fp.nbytes, 1)}"
    big = fp.largest
    if big is not None and big.nbytes > max_bytes:
        raise ModelTooLargeError(
            f"{where} would allocate its field `{big.name}` [{big.expr}] = "
            f"[{' '.join(map(str, big.shape))}] {big.dtype.name}: {_size(big.nbytes)}, more "
            f"than max_bytes={max_bytes:,} (the whole model: {_size(fp.nbytes)})",
            fix=fix,
        )
    if fp.nbytes > max_bytes:
        largest = f"; its largest field is `{big.name}`, {_size(big.nbytes)}" if big else ""
        raise ModelTooLargeError(
            f"{where} would allocate {_size(fp.nbytes)} in all, more than "
            f"max_bytes={max_bytes:,}{largest}",
            fix=fix,
        )
    if fp.parts > MAX_PARTS:
        raise ModelTooLargeError(
            f"{where} would build {fp.parts:,} tensors and sub-models, more than {MAX_PARTS:,}",
            fix="check the counts of its sub-models (`sm.submodels(Block, 'L')`: L)",
        )
