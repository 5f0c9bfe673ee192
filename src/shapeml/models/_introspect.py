"""Name-based views of a model: its params and buffers by dotted name, counts, masks."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator, Mapping
from typing import Any

import jax

from .._errors import ArgumentTypeError
from .._traceback import api_boundary
from .._validate import shorten
from ._checks import statics_of
from ._fields import FieldSpec
from ._mapped import child_dims
from ._model import Model
from ._stacked import count_of, is_stacked, layer

__all__ = [
    "buffers",
    "count_params",
    "declared",
    "decays",
    "is_param",
    "param_mask",
    "params",
    "statics",
    "tensors",
]


def _walk(
    m: Model, prefix: str = "", split: bool = True
) -> Iterator[tuple[str, FieldSpec, object]]:
    """`(dotted name, declaration, value)` of every tensor. Stacked sub-models are listed layer
    by layer (`blocks.0.w`, a slice) with `split`, else as the pytree holds them (`blocks.w`,
    every layer): the names `tree_map_with_path` pairs with leaves."""
    for name, spec in type(m).__shapeml_fields__.items():
        value = getattr(m, name)
        if spec.kind == "submodel":
            yield from _walk(value, f"{prefix}{name}.", split)
        elif spec.kind == "submodels":
            if not is_stacked(spec, value):
                for i, child in enumerate(value):
                    yield from _walk(child, f"{prefix}{name}.{i}.", split)
            elif not split:
                yield from _walk(value, f"{prefix}{name}.", split)
            else:
                for i in range(count_of(value, spec.count_in(m.dims))):
                    yield from _walk(layer(value, i), f"{prefix}{name}.{i}.", split)
        elif value is not None or not spec.optional:  # an absent optional tensor is no entry
            if m._frozen and spec.kind == "param":  # frozen: held, never trained
                spec = dataclasses.replace(spec, kind="buffer")
            yield prefix + name, spec, value


def _model(fn: str, m: object) -> Model:
    if not isinstance(m, Model):
        hint = (
            f"an instance, e.g. sm.{fn}({m.__name__}.init(seed=0))"
            if isinstance(m, type)
            else "a model"
        )
        raise ArgumentTypeError(
            f"sm.{fn}(m) takes an sm.Model, got {shorten(m)} ({type(m).__name__})",
            fix=f"pass {hint}",
        )
    return m


def tensors(m: Model) -> dict[str, tuple[str, jax.Array]]:
    """Every tensor of `m` by dotted name, as `(kind, array)` with kind "param" or "buffer"."""
    return {name: (spec.kind, value) for name, spec, value in _walk(m)}


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def params(m: Model) -> dict[str, jax.Array]:
    """The trained tensors of `m`, by dotted name (`blocks.0.w1`)."""
    return {name: v for name, spec, v in _walk(_model("params", m)) if spec.kind == "param"}


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def buffers(m: Model) -> dict[str, jax.Array]:
    """The saved-but-not-trained tensors of `m`, by dotted name."""
    return {name: v for name, spec, v in _walk(_model("buffers", m)) if spec.kind == "buffer"}


def decays(m: Model) -> dict[str, bool]:
    """Whether weight decay applies to each param of `m`, by dotted name: its `sm.param(decay=)`.

    `m` may be a params-only tree (buffers None), as an optimizer's gradients and updates are.
    """
    return {name: spec.decay for name, spec, _ in _walk(m, split=False) if spec.kind == "param"}


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def count_params(m: Model) -> int:
    """How many numbers `m`'s params hold (buffers excluded)."""
    return sum(int(v.size) for v in params(_model("count_params", m)).values())


def statics(m: Model) -> dict[str, object]:
    """The static configuration of `m` and its sub-models (`sm.static()`), by dotted name."""
    out = {name: getattr(m, name) for name in type(m).__shapeml_statics__}
    for name, spec in type(m).__shapeml_fields__.items():
        if spec.kind == "submodel":
            pairs = [(name, getattr(m, name))]
        elif spec.kind == "submodels":
            value = getattr(m, name)
            if is_stacked(spec, value):  # one set of statics, shared by every layer
                count = count_of(value, spec.count_in(m.dims))
                pairs = [(f"{name}.{i}", value) for i in range(count)]
            else:
                pairs = [(f"{name}.{i}", c) for i, c in enumerate(value)]
        else:
            continue
        for prefix, child in pairs:
            out.update({f"{prefix}.{k}": v for k, v in statics(child).items()})
    return out


def dotted_name(path) -> str:
    """The dotted name of a leaf's tree path (`blocks.0.w1`), as every name-based API spells it."""
    return jax.tree_util.keystr(path, simple=True, separator=".")


def param_mask(m: Model):
    """A pytree like `m` with True at every param leaf and False at every buffer leaf (each leaf
    paired with its declaration by its dotted path, not by position)."""
    kinds = {name: spec.kind for name, spec, _ in _walk(m, split=False)}
    return jax.tree_util.tree_map_with_path(lambda p, _: kinds[dotted_name(p)] == "param", m)


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def is_param(m: Model):
    """An equinox filter spec for `m`'s params: a pytree like `m` with True at each param and
    False at each buffer, so equinox and optax code trains the params only.

    `eqx.filter_grad` and `eqx.is_inexact_array` take every float array for a trained one, a
    float buffer (BatchNorm's statistics, a frozen table) included, while shapeml's `sm.grad` and
    optimizers never touch a buffer. Partition with this filter first: the params tree is what
    `eqx.filter_grad` and an optax optimizer see, and `eqx.combine` puts the model back together.

    Example:
        >>> params, rest = eqx.partition(m, sm.is_param(m))  # buffers go to `rest`
        >>> g = eqx.filter_grad(lambda p: loss(eqx.combine(p, rest), x, y))(params)
        >>> opt_state = tx.init(params)  # any optax transformation, params only
        >>> updates, opt_state = tx.update(g, opt_state, params)
        >>> m = eqx.apply_updates(m, updates)  # buffers unchanged
    """
    return param_mask(_model("is_param", m))


def declared(
    cls: type[Model], dims, statics: Mapping[str, Any] | None = None, prefix: str = ""
) -> dict[str, tuple[str, tuple[int, ...], object]]:
    """What a model of class `cls` with these dims holds: dotted name -> (kind, shape, dtype).

    `statics` are the static values by dotted name (`statics(m)`, or a file's); an option a
    parent's declaration sets is the declaration's, and a static given nowhere takes its default.
    They decide which optional tensors are present (so a file holding `up.b` is an unexpected
    entry for a parent that declares `up` without bias).
    """
    given = {} if statics is None else statics
    own = statics_of(cls, given, prefix)
    out = {}
    for name, spec in cls.__shapeml_fields__.items():
        if spec.kind in ("submodel", "submodels"):
            sub = child_dims(spec, dims)
            prefixes = (
                [f"{name}."]
                if spec.kind == "submodel"
                else [f"{name}.{i}." for i in range(spec.count_in(dims))]
            )
            options = {prefix + p + k: v for p in prefixes for k, v in spec.mapped.options_in(own)}
            merged = {**given, **options}  # once: a copy per sub-model is quadratic in their count
            for p in prefixes:
                inner = declared(spec.model, sub, merged, prefix + p)
                out.update({p + k: v for k, v in inner.items()})
        elif spec.present(own):
            out[name] = (spec.kind, spec.shape_in(dims), spec.dtype)
    return out
