"""The one validation layer for public boundaries: check type, range and size first, convert after.

Every public entry (function, constructor, reader, CLI flag) passes its arguments through these
helpers before it acts, so a bad value gets a coded error naming the argument, the value (shortened)
and the fix, and never wraps, truncates or allocates on the way in:

    steps = integer("steps", steps, low=1)
    lr = real("learning_rate", lr, low=0.0, low_open=True)

Integers are checked on their exact value (`np.int64(2**32 + 2)` stays what it is, `3.7` and `"5"`
are refused rather than read as 3 and 5); reals must be finite unless `finite=False`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._errors import ArgumentError, ArgumentTypeError, DtypeUnavailableError, ShapemlError

__all__ = ["choice", "held_dtype", "instance", "integer", "numeric_dtype", "real", "shorten"]

_LIMIT = 80


def shorten(value: Any, limit: int = _LIMIT) -> str:
    """`repr(value)` cut to about `limit` characters, so a huge value never floods a message.

    Large arrays and containers are summarized without building their whole repr.
    """
    if isinstance(value, (str, bytes)) and len(value) > limit:
        return repr(value[: limit // 2]) + f"... ({len(value):,} characters)"
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype") and int(np.prod(shape, dtype=np.float64)) > 16:
        return f"{type(value).__name__}(shape={tuple(shape)}, dtype={value.dtype})"
    if isinstance(value, (list, tuple, dict, set)) and len(value) > 16:
        return f"{type(value).__name__} of {len(value):,} items"
    try:
        text = repr(value)
    except RecursionError:  # a container nested thousands deep
        return f"a {type(value).__name__} nested too deep to show"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _exact_int(value: Any) -> int | None:
    """The exact integer `value` holds, or None when it is not an integer (bools are not)."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if getattr(value, "shape", None) == () and np.issubdtype(
        getattr(value, "dtype", object), np.integer
    ):
        try:
            return int(value)  # a concrete 0-d integer array (numpy or JAX)
        except Exception:  # a tracer: its value is not known here
            return None
    return None


def integer(
    name: str,
    value: Any,
    *,
    low: int | None = None,
    high: int | None = None,
    fix: str | None = None,
) -> int:
    """`value` as a Python int, after checking it is an integer in `[low, high]`.

    Raises:
        ArgumentTypeError: (E0003) for a bool, float, string or anything not an integer.
        ArgumentError: (E0002) for an integer out of range.
    """
    n = _exact_int(value)
    if n is None:
        raise ArgumentTypeError(
            f"`{name}` must be an integer, got {shorten(value)} ({type(value).__name__})",
            fix=fix or f"pass a whole number for `{name}`" + _range_text(low, high),
        )
    if (low is not None and n < low) or (high is not None and n > high):
        raise ArgumentError(
            f"`{name}` is {n}; it must be{_range_text(low, high)}",
            fix=fix or f"pass `{name}`" + _range_text(low, high),
        )
    return n


def real(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    finite: bool = True,
    fix: str | None = None,
) -> float:
    """`value` as a Python float, after checking it is a real number in its range.

    `low_open`/`high_open` exclude the bound itself (a learning rate must be > 0: `low=0,
    low_open=True`). NaN is always refused; infinities unless `finite=False`.

    Raises:
        ArgumentTypeError: (E0003) for a bool, string, complex or non-scalar value.
        ArgumentError: (E0002) for NaN, an infinity or a value out of range.
    """
    ok_type = isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
    if not ok_type and getattr(value, "shape", None) == ():
        kind = np.dtype(getattr(value, "dtype", object)).kind
        ok_type = kind in "iuf"
    if not ok_type:
        raise ArgumentTypeError(
            f"`{name}` must be a real number, got {shorten(value)} ({type(value).__name__})",
            fix=fix or f"pass a number for `{name}`",
        )
    try:
        x = float(value)
    except Exception as e:  # a tracer or an object whose __float__ fails
        raise ArgumentTypeError(
            f"`{name}` must be a concrete number, got {shorten(value)} ({type(value).__name__})",
            fix=fix or f"pass a Python or numpy number for `{name}`, not a traced value",
        ) from e
    bad = math.isnan(x) or (finite and math.isinf(x))
    bad = bad or (low is not None and (x < low or (low_open and x == low)))
    bad = bad or (high is not None and (x > high or (high_open and x == high)))
    if bad:
        where = _range_text(low, high, low_open, high_open) or " a finite number"
        raise ArgumentError(
            f"`{name}` is {x!r}; it must be{where}",
            fix=fix or f"pass `{name}`{where}",
        )
    return x


def choice(name: str, value: Any, options: Iterable[Any], *, fix: str | None = None) -> Any:
    """`value` if it is one of `options` (compared by equality, bools never equal to ints)."""
    options = list(options)
    for o in options:
        if type(value) is type(o) and value == o:
            return value
    listed = ", ".join(repr(o) for o in options)
    raise ArgumentError(
        f"`{name}` is {shorten(value)}; it must be one of {listed}",
        fix=fix or f"pass one of {listed}",
    )


def instance(name: str, value: Any, types: type | tuple[type, ...], what: str) -> Any:
    """`value` if it is an instance of `types`; else a coded type error saying what is taken."""
    if not isinstance(value, types):
        raise ArgumentTypeError(
            f"`{name}` must be {what}, got {shorten(value)} ({type(value).__name__})",
            fix=f"pass {what} as `{name}`",
        )
    return value


def _range_text(low, high, low_open: bool = False, high_open: bool = False) -> str:
    if low is not None and high is not None:
        lo = "(" if low_open else "["
        hi = ")" if high_open else "]"
        return f" in {lo}{low}, {high}{hi}"
    if low is not None:
        return f" {'>' if low_open else '>='} {low}"
    if high is not None:
        return f" {'<' if high_open else '<='} {high}"
    return ""


def held_dtype(dtype: Any, where: str) -> np.dtype:
    """`dtype` as a numpy dtype, if JAX in this process holds it as it is.

    Raises:
        DtypeUnavailableError: (E0004) for a 64-bit dtype while `jax_enable_x64` is off (JAX would
            narrow it silently), naming `where` and the fix.
    """
    wanted = np.dtype(dtype)
    held = np.dtype(jax.dtypes.canonicalize_dtype(wanted))
    if held != wanted:
        raise DtypeUnavailableError(
            f"{where}: declared {wanted.name}, which JAX in this process holds as {held.name} "
            "(jax_enable_x64 is off)",
            fix='enable 64-bit mode first, jax.config.update("jax_enable_x64", True), or declare '
            f"{held.name}",
        )
    return wanted


def numeric_dtype(
    dtype: Any, where: str, error: type[ShapemlError] = ArgumentTypeError, *, bool_ok: bool = False
) -> np.dtype:
    """`dtype` as a numpy dtype, if it is numeric (or bool, with `bool_ok`).

    Raises:
        `error` (ArgumentTypeError, E0003, by default) naming `where`, for anything else.
    """
    try:
        wanted = np.dtype(dtype)
    except Exception:  # numpy raises several types for what is not a dtype
        wanted = None
    if wanted is None or not (
        jnp.issubdtype(wanted, jnp.number) or (bool_ok and wanted == np.bool_)
    ):
        raise error(
            f"{where} got the dtype {shorten(dtype)}, which is not a numeric dtype",
            fix="pass e.g. dtype=jnp.float32, jnp.int32 or jnp.bfloat16",
        )
    return wanted
