"""Checks of the values a model is built from: each field against its declaration."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._cast import cast_host_array
from .._errors import ArgumentTypeError
from .._validate import integer, shorten
from ._dims import Dims, DimsError
from ._fields import FieldSpec

__all__ = ["check_value", "child_dims", "describe_spec", "dims_str", "key_of"]

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


def child_dims(model: type, parent: Dims) -> Dims:
    """A sub-model's dims: its own declaration, with every free dim it shares with the parent
    taken from the parent.

    Raises:
        DimsError: (E0903) when a derived dim of the child disagrees with the parent's.
    """
    decl = model.dims
    dims = decl.resolve(**{n: parent[n] for n in decl.free if n in parent})
    for n in decl.derived:
        if n in parent and dims[n] != parent[n]:
            raise DimsError(
                f"`{model.__name__}` derives {n} = {dims[n]} but its parent has {n} = {parent[n]}",
                fix=f"make the two declarations of `{n}` agree",
            )
    return dims


def dims_str(dims: Mapping[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in dims.items())


def describe_spec(spec: FieldSpec, dims: Mapping[str, int]) -> str:
    if spec.kind == "submodel":
        return spec.model.__name__
    if spec.kind == "submodels":
        return f"{spec.count_in(dims)} x {spec.model.__name__}"
    shape = spec.shape_in(dims)
    return f"[{spec.shape_str}] = [{' '.join(map(str, shape))}] {spec.dtype.name}"


def check_value(owner: str, name: str, spec: FieldSpec, value: Any, dims: Dims):
    """Returns (value to store, problem or None)."""
    if spec.kind == "submodel":
        return check_child(owner, name, spec.model, value, dims)
    if spec.kind == "submodels":
        if not isinstance(value, (tuple, list)):
            return (
                value,
                f"{name}: expected a tuple of {spec.model.__name__}, got {type(value).__name__}",
            )
        count = spec.count_in(dims)
        if len(value) != count:
            return tuple(value), (
                f"{name}: expected {count} x {spec.model.__name__} ({spec.count}={count}), "
                f"got {len(value)}"
            )
        checked = [
            check_child(owner, f"{name}.{i}", spec.model, v, dims) for i, v in enumerate(value)
        ]
        problems = [p for _, p in checked if p]
        return tuple(v for v, _ in checked), ("; ".join(problems) or None)
    expected = spec.shape_in(dims)
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


def check_child(owner: str, name: str, model: type, value: Any, dims: Dims):
    if not isinstance(value, model):
        return value, f"{name}: expected a {model.__name__}, got {type(value).__name__}"
    expected = child_dims(model, dims)
    if value.dims != expected:
        diff = ", ".join(
            f"{k}: expected {expected[k]}, got {value.dims[k]}"
            for k in expected
            if value.dims[k] != expected[k]
        )
        return value, f"{name}: its dims differ from `{owner}`'s ({diff})"
    return value, None
