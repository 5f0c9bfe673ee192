"""Array-likes for `@sm.shaped`: a `Float[Array, "b D"]` argument also takes a numpy array of
that shape and dtype kind, and a scalar annotation (`Float[Array, ""]`) a Python or numpy scalar.

The annotations are widened, not the values converted: the function gets what it was passed, and
only a wrong shape or dtype kind is an error, as for a jax array.
"""

from __future__ import annotations

import types
import typing
from typing import Any, Union

import jax
import numpy as np

__all__ = ["widen", "widened_function"]


class _NumpyScalarType(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, np.generic)


class NumpyScalar(metaclass=_NumpyScalarType):
    """`np.float32(0.5)` and the like: shape `()` and a dtype that jaxtyping checks (jaxtyping
    takes `np.generic` itself as any dtype)."""


def _takes_scalars(hint: Any) -> bool:
    """Whether the annotation's shape can be `()`: no dims, or only a variadic one (`*b`)."""
    return len(hint.dims) == (0 if hint.index_variadic is None else 1)


def _widen_array(hint: Any) -> Any:
    like = [jax.Array, np.ndarray]
    if _takes_scalars(hint):
        like += [NumpyScalar, bool, int, float, complex]  # jaxtyping keeps the right kinds
    try:
        return hint.dtype[Union[tuple(like)], hint.dim_str]  # noqa: UP007 - built at run time
    except Exception:  # a dtype family no array-like can have (PRNG keys): as written
        return hint


def _is_jax_array_hint(hint: Any) -> bool:
    return (
        isinstance(hint, type)
        and getattr(hint, "array_type", None) is jax.Array
        and isinstance(getattr(hint, "dim_str", None), str)
        and hasattr(hint, "dtype")
    )


def widen(hint: Any) -> Any:
    """`hint` with every jaxtyping array type over `jax.Array` also taking array-likes, inside
    unions, `Optional`, tuples, lists and dicts too; any other hint is returned as it is."""
    if _is_jax_array_hint(hint):
        return _widen_array(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if not args:
        return hint
    new = tuple(widen(a) if not isinstance(a, (list, str)) else a for a in args)
    if new == args:
        return hint
    if origin is Union or origin is types.UnionType:
        return Union[new]  # noqa: UP007 - a tuple of hints built at run time
    if origin is typing.Annotated:
        return typing.Annotated[new]
    if isinstance(hint, types.GenericAlias):  # tuple[...], list[...], dict[...]
        return types.GenericAlias(origin, new)
    copy_with = getattr(hint, "copy_with", None)  # typing.Tuple[...] and the like
    return copy_with(new) if copy_with is not None else hint


def widened_function(fn: Any, hints: dict[str, Any]) -> Any:
    """A copy of plain function `fn` annotated with `hints` (the original keeps its annotations,
    which `help()` and the docs show); `fn` itself when it is not a plain function."""
    if not isinstance(fn, types.FunctionType):
        return fn
    copy = types.FunctionType(
        fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__qualname__ = fn.__qualname__
    copy.__module__ = fn.__module__
    copy.__annotations__ = hints
    return copy
