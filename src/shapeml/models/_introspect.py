"""Name-based views of a model: its params and buffers by dotted name, counts, masks."""

from __future__ import annotations

from collections.abc import Iterator

import jax

from ._fields import FieldSpec
from ._model import Model, child_dims

__all__ = ["buffers", "count_params", "declared", "param_mask", "params", "tensors"]


def _walk(m: Model, prefix: str = "") -> Iterator[tuple[str, FieldSpec, object]]:
    for name, spec in type(m).__shapeml_fields__.items():
        value = getattr(m, name)
        if spec.kind == "submodel":
            yield from _walk(value, f"{prefix}{name}.")
        elif spec.kind == "submodels":
            for i, child in enumerate(value):
                yield from _walk(child, f"{prefix}{name}.{i}.")
        else:
            yield prefix + name, spec, value


def tensors(m: Model) -> dict[str, tuple[str, jax.Array]]:
    """Every tensor of `m` by dotted name, as `(kind, array)` with kind "param" or "buffer"."""
    return {name: (spec.kind, value) for name, spec, value in _walk(m)}


def params(m: Model) -> dict[str, jax.Array]:
    """The trained tensors of `m`, by dotted name (`blocks.0.w1`)."""
    return {name: v for name, spec, v in _walk(m) if spec.kind == "param"}


def buffers(m: Model) -> dict[str, jax.Array]:
    """The saved-but-not-trained tensors of `m`, by dotted name."""
    return {name: v for name, spec, v in _walk(m) if spec.kind == "buffer"}


def count_params(m: Model) -> int:
    """How many numbers `m`'s params hold (buffers excluded)."""
    return sum(int(v.size) for v in params(m).values())


def param_mask(m: Model):
    """A pytree like `m` with True at every param leaf and False at every buffer leaf."""
    kinds = iter([spec.kind == "param" for _, spec, _ in _walk(m)])
    return jax.tree.map(lambda _: next(kinds), m)


def declared(cls: type[Model], dims) -> dict[str, tuple[str, tuple[int, ...], object]]:
    """What a model of class `cls` with these dims holds: dotted name -> (kind, shape, dtype)."""
    out = {}
    for name, spec in cls.__shapeml_fields__.items():
        if spec.kind in ("submodel", "submodels"):
            sub = child_dims(spec.model, dims)
            inner = declared(spec.model, sub)
            prefixes = (
                [f"{name}."]
                if spec.kind == "submodel"
                else [f"{name}.{i}." for i in range(spec.count_in(dims))]
            )
            for p in prefixes:
                out.update({p + k: v for k, v in inner.items()})
        else:
            out[name] = (spec.kind, spec.shape_in(dims), spec.dtype)
    return out
