"""Checks of the values a model is built from: each field against its declaration."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._cast import cast_host_array
from .._errors import ArgumentTypeError
from .._validate import held_dtype, integer, shorten
from ._dims import Dims
from ._fields import FieldSpec
from ._mapped import child_dims
from ._stacked import check_stacked, stack, unstack

__all__ = ["check_fields", "describe_spec", "dims_str", "key_of", "statics_of"]

_SEED_FIX = "pass a whole number, a jax.random.key, or an int array (e.g. under jax.vmap)"


def key_of(seed: Any) -> jax.Array:
    """The PRNG key `init` draws from: `seed` itself if it is a key, else `jax.random.key(seed)`.

    A Python or numpy int must fit in 64 bits; an array (a tracer under `jax.vmap`) must have an
    integer dtype. Floats, bools and strings are refused rather than truncated.

    Raises:
        ArgumentTypeError: (E0003) / ArgumentError: (E0002) for a seed that is none of these.
    """
    if isinstance(seed, jax.Array) or (isinstance(seed, np.ndarray) and seed.ndim > 0):
        if jax.dtypes.issubdtype(seed.dtype, jax.dtypes.prng_key):
            return seed
        if seed.ndim > 0 or not jnp.issubdtype(seed.dtype, jnp.integer):
            raise ArgumentTypeError(
                f"`seed` must be one integer, got an array of {seed.dtype} {list(seed.shape)}",
                fix=_SEED_FIX + "; for an ensemble: jax.vmap(M.init)(jnp.arange(n))",
            )
        return jax.random.key(seed)
    n = integer("seed", seed, low=-(2**63), high=2**64 - 1, fix=_SEED_FIX) % 2**64
    # `jax.random.key` keeps only the low 32 bits without x64: the high half is folded in, so
    # every 64-bit seed gives its own key (and seeds below 2**32 keep their usual key).
    low, high = n & 0xFFFFFFFF, n >> 32
    key = jax.random.key(low)
    return key if high == 0 else jax.random.fold_in(key, high)


def statics_of(cls: type, given: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The static values of a `cls` at dotted `prefix`: from `given` (by dotted name), else the
    class default (a static without either is left out)."""
    out = {}
    for k, default in cls.__shapeml_statics__.items():
        value = given.get(prefix + k, default)
        if value is not dataclasses.MISSING:
            out[k] = value
    return out


def dims_str(dims: Mapping[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in dims.items())


def describe_spec(spec: FieldSpec, dims: Mapping[str, int]) -> str:
    if spec.kind == "submodel":
        return repr(spec.mapped)
    if spec.kind == "submodels":
        return f"{spec.count_in(dims)} x {spec.mapped!r}"
    shape = spec.shape_in(dims)
    return f"[{spec.shape_str}] = [{' '.join(map(str, shape))}] {spec.dtype.name}"


def check_fields(
    cls: type, dims: Dims, values: Mapping[str, Any], statics: Mapping[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """Every field of a `cls` built with these dims and static values, against its declaration.

    Returns:
        `(values to store, problems)`: an optional tensor that is absent is stored as None; a
        missing field, a value given for an absent one (or None for a present one) and every
        mismatch is a problem.
    """
    stored, problems = {}, []
    for name, spec in cls.__shapeml_fields__.items():
        value = values.get(name)
        if spec.kind in ("param", "buffer") and not spec.present(statics):
            stored[name] = None
            if value is not None:
                problems.append(
                    f"{name}: absent ({spec.absent_because(statics)}), but was given {_what(value)}"
                )
            continue
        if value is None:
            why = "None given" if name in values else "missing"
            problems.append(f"{name}: {why} ({describe_spec(spec, dims)})")
            continue
        stacked = spec.kind == "submodels" and spec.stacked_in(statics)
        stored[name], problem = check_value(cls.__name__, name, spec, value, dims, stacked, statics)
        if problem:
            problems.append(problem)
    return stored, problems


def _what(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype"):
        return f"[{' '.join(map(str, shape))}] {value.dtype}"
    return type(value).__name__


def check_value(
    owner: str,
    name: str,
    spec: FieldSpec,
    value: Any,
    dims: Dims,
    stacked: bool = False,
    parent: Mapping[str, Any] | None = None,
):
    """Returns (value to store, problem or None). Sub-models stored `stacked` may be given as a
    tuple of layers (checked, then stacked) or as one stacked model (checked as it is)."""
    if spec.kind == "submodel":
        return check_child(owner, name, spec, value, dims, parent)
    if spec.kind == "submodels":
        count = spec.count_in(dims)
        if stacked and isinstance(value, spec.model):
            value, problem = check_child(owner, name, spec, value, dims, parent)
            return value, problem or check_stacked(name, value, count)
        if not stacked and isinstance(value, spec.model):  # stacked layers, given unstacked
            value, problem = check_child(owner, name, spec, value, dims, parent)
            problem = problem or check_stacked(name, value, count)
            return (value, problem) if problem else (unstack(value, count), None)
        if not isinstance(value, (tuple, list)):
            return (
                value,
                f"{name}: expected a tuple of {spec.model.__name__}, got {type(value).__name__}",
            )
        if len(value) != count:
            return tuple(value), (
                f"{name}: expected {count} x {spec.model.__name__} ({spec.count}={count}), "
                f"got {len(value)}"
            )
        checked = [
            check_child(owner, f"{name}.{i}", spec, v, dims, parent) for i, v in enumerate(value)
        ]
        problems = [p for _, p in checked if p]
        layers = tuple(v for v, _ in checked)
        if stacked and not problems and count:
            first = jax.tree.structure(layers[0])
            odd = [i for i, v in enumerate(layers) if jax.tree.structure(v) != first]
            if odd:
                return layers, (
                    f"{name}: layer {odd[0]} differs from layer 0 in its options or optional "
                    "tensors, so the layers cannot be stacked"
                )
            return stack(layers), None
        return layers, ("; ".join(problems) or None)
    expected = spec.shape_in(dims)
    if spec.dtype.itemsize == 8:  # a 64-bit dtype: held as declared only with jax_enable_x64
        held_dtype(spec.dtype, f"`{owner}.{name}`")
    if not (hasattr(value, "shape") and hasattr(value, "dtype")):
        try:
            value = np.asarray(value)
        except (ValueError, TypeError) as e:  # a ragged list, an object numpy cannot hold
            return value, f"{name}: {shorten(value)} is not an array ({str(e).splitlines()[0]})"
    if isinstance(value, np.ndarray) and not isinstance(value, jax.Array):
        converted, why = cast_host_array(value, spec.dtype)
        if why and tuple(value.shape) == expected:
            return value, f"{name}: {why}"
        if converted is not None:
            value = jnp.asarray(converted)
    shape, dtype = tuple(value.shape), np.dtype(value.dtype)
    if shape != expected or dtype != spec.dtype:
        return value, (
            f"{name}: expected [{spec.shape_str}] = [{' '.join(map(str, expected))}] "
            f"{spec.dtype.name}, got [{' '.join(map(str, shape))}] {dtype.name}"
        )
    return value, None


def check_child(
    owner: str,
    name: str,
    spec: FieldSpec,
    value: Any,
    dims: Dims,
    parent: Mapping[str, Any] | None = None,
):
    model = spec.model
    if not isinstance(value, model):
        return value, f"{name}: expected a {model.__name__}, got {type(value).__name__}"
    expected = child_dims(spec, dims)
    # A subclass may declare dims of its own (a LoRA layer's rank): the declared ones must agree.
    if any(value.dims.get(k) != expected[k] for k in expected):
        diff = ", ".join(
            f"{k}: expected {expected[k]}, got {value.dims.get(k)}"
            for k in expected
            if value.dims.get(k) != expected[k]
        )
        return value, f"{name}: its dims differ from `{owner}`'s ({diff})"
    options = [
        f"{k}: expected {v!r}, got {getattr(value, k)!r}"
        for k, v in spec.mapped.options_in(parent or {})
        if getattr(value, k) != v or type(getattr(value, k)) is not type(v)
    ]
    if options:
        return value, f"{name}: its options differ from `{spec.mapped!r}` ({', '.join(options)})"
    return value, None
