"""The inputs of a stateful step made canonical: numeric arrays of JAX's dtypes, never weak-typed,
so a new value never recompiles, and nothing that would change meaning on the way (an int too wide
for JAX's int dtype, a float that would become inf) passes silently; and checked against the user's
function they are passed to (`check_call`). Both raise `StepInputError` (E1410)."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import jax
import numpy as np

from .. import _jax_internals as jxi
from .._errors import ShapemlError

__all__ = [
    "StepInputError",
    "TooWideError",
    "canonical",
    "canonical_leaf",
    "canonical_leaves",
    "flat_signature",
    "check_call",
    "named_leaves",
    "saturated",
    "too_wide",
]


class StepInputError(
    ShapemlError,
    TypeError,
    code="E1410",
    title="stateful step input is not an array or does not fit the step",
    explanation="""
Every input of a stateful compiled step (a `state.Graph` call, a `TrainStep` batch, a
`CachedDecoder` call) must be an array, a Python number or a pytree of them: each becomes a traced
value of the compiled program, so a new value never recompiles. Configuration that changes the
program belongs in the constructor. An integer must fit JAX's int dtype (int32, or int64 with
`jax_enable_x64`), and a float the float dtype it becomes; one that does not is refused rather than
wrapped around or turned into inf (an integer the step uses as an index is an E1401 index error
instead). The step cannot be called from inside a traced function (`jax.jit`, `grad`, `vmap`): it
is itself a compiled program that keeps its carry on the device; call the pure function it wraps
in your own `jit` instead. The inputs must also fit the function they are passed to: a graph's
`body(self, ...)` or a loss's `(model, ...)`, after the argument the step passes itself.
""",
):
    pass


def _int() -> np.dtype:
    """JAX's int dtype now: int64 with `jax_enable_x64`, else int32."""
    return jax.dtypes.canonicalize_dtype(np.int64)


# Dtypes JAX keeps as they are with or without `jax_enable_x64`: an array of one needs no check.
_CANONICAL = frozenset(
    np.dtype(d)
    for d in ("bool", "int8", "int16", "int32", "uint8", "uint16", "uint32", "float16", "float32")
)


class TooWideError(Exception):
    """An integer input does not fit JAX's int dtype (`pos=2**31`); the shell raises the coded
    error (an index error, or an input error) once it knows how the input is used."""


def too_wide(x) -> bool:
    """Whether `x` is an integer input with a value JAX's int dtype cannot hold."""
    if type(x) is int:
        bound = 1 << (8 * _int().itemsize - 1)
        return not -bound <= x < bound
    if isinstance(x, np.integer | np.ndarray) and np.asarray(x).dtype.kind in "iu" and np.size(x):
        arr = np.asarray(x)
        info = np.iinfo(jax.dtypes.canonicalize_dtype(arr.dtype))
        return int(arr.min()) < info.min or int(arr.max()) > info.max
    return False


def saturated(x) -> np.ndarray:
    """A too-wide integer input clipped into JAX's int dtype: out of any range it indexes, so it
    fails the same index checks the real value would."""
    arr = np.asarray(x, dtype=object if type(x) is int else None)
    dtype = _int() if type(x) is int else np.dtype(jax.dtypes.canonicalize_dtype(arr.dtype))
    info = np.iinfo(dtype)
    return np.asarray(np.clip(arr, info.min, info.max), dtype)


def canonical_leaf(x, name: str, error: type, lenient: bool = False):
    """One input leaf made canonical (see `canonical`)."""
    if type(x) is np.ndarray and x.dtype in _CANONICAL:  # the common cases, first
        return x
    if type(x) is int:
        try:
            return np.asarray(x, _int())
        except OverflowError:  # too wide for it: handled below
            pass
    if isinstance(x, jax.Array):
        if jxi.is_tracer(x):
            raise error(
                f"`{name}` was called with traced inputs (inside jax.jit, grad or vmap); it is "
                "itself a compiled program that keeps its state on the device",
                fix="call it from Python, or use the pure function it wraps (e.g. "
                "transformer.step) inside your own jit",
            )
        # A weak type (`jnp.asarray(3)`) would select another program than `np.int32(3)`.
        weak = getattr(x, "weak_type", False)  # a PRNG key array has none
        return jax.lax.convert_element_type(x, x.dtype) if weak else x
    if not isinstance(x, bool | int | float | complex | np.generic | np.ndarray):
        raise error(
            f"an input of `{name}` is a {type(x).__name__} ({x!r:.60}), not an array or a number",
            fix="pass arrays, numbers or pytrees of them; fixed configuration belongs in __init__",
        )
    if too_wide(x):  # a cast would wrap it around
        if lenient:
            return saturated(x)
        raise TooWideError
    arr = np.asarray(x, _int()) if type(x) is int else np.asarray(x)
    if arr.dtype.kind not in "biufc":
        raise error(
            f"an input of `{name}` has dtype {arr.dtype}", fix="pass numeric arrays or numbers"
        )
    dtype = jax.dtypes.canonicalize_dtype(arr.dtype)
    if arr.dtype == dtype:
        return arr
    with np.errstate(over="ignore"):  # an overflow is refused below, with the value
        cast = arr.astype(dtype)
    if arr.dtype.kind in "fc" and arr.size:
        lost = np.isfinite(arr) & ~np.isfinite(cast)
        if lost.any():
            raise error(
                f"`{name}` got a float input holding {arr[lost].flat[0]!r}, which does not "
                f"fit JAX's {np.dtype(dtype).name} (jax_enable_x64 is off): it would become inf",
                fix=f"pass values within the range of {np.dtype(dtype).name}",
            )
    return cast


def flat_signature(inputs: tuple, kwargs: dict) -> tuple:
    """What a call is keyed by on the shell's fast path: whether `jax_enable_x64` is on (it sets
    the dtype of a Python int), the count of positional inputs, the keywords in call order, and
    per input its `(shape, dtype)` for a numpy array, `int` for a Python int, `(shape, dtype,
    weak_type)` for a JAX array, else None (a call with a None there, or an array the shell must
    cast, is never put on the fast path)."""
    return (
        jax.config.jax_enable_x64,
        len(inputs),
        *kwargs,
        *[
            (x.shape, x.dtype)
            if type(x) is np.ndarray
            else int
            if type(x) is int
            else (x.shape, x.dtype, x.weak_type)
            if type(x) is jxi.ArrayImpl
            else None
            for x in (*inputs, *kwargs.values())
        ],
    )


def canonical_leaves(leaves: list, name: str, error: type) -> list:
    """`canonical_leaf` of each leaf, an array that is canonical already passed inline (this runs
    on every call of a step)."""
    return [
        x if type(x) is np.ndarray and x.dtype in _CANONICAL else canonical_leaf(x, name, error)
        for x in leaves
    ]


def canonical(name: str, inputs, error: type, *, lenient: bool = False):
    """`inputs` (a pytree) with every leaf an array of JAX's canonical dtype, never weak-typed.

    Raises:
        error: (the caller's coded input error) for a leaf that is not numeric, or a tracer.
        TooWideError: for an int too wide for JAX's int dtype; with `lenient`, it is clipped into it
            instead (see `saturated`).
    """
    return jax.tree.map(lambda x: canonical_leaf(x, name, error, lenient), inputs)


def named_leaves(inputs) -> list[tuple[str, object]]:
    """`(name, leaf)` for `(args, kwargs)`: the keyword (`pos`), or `input N`, plus any path."""
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(inputs)[0]:
        head, first, rest = path[0].idx, path[1], path[2:]
        label = f"input {first.idx}" if head == 0 else str(first.key)
        out.append((label + "".join(str(k) for k in rest), leaf))
    return out


def check_call(name: str, fn: Callable, args: tuple, kwargs: dict) -> None:
    """Raises `StepInputError` (E1410) when a step's inputs do not fit the user's function it
    passes them to, after its first argument (a graph's `body(self, ...)`, a loss's `(model,
    ...)`): a missing `pos=`, an input too many. The function's own TypeErrors stay its own."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a function without a signature: nothing to check against
        return
    try:
        sig.bind(None, *args, **kwargs)
    except TypeError as e:
        first = next(iter(sig.parameters), "")
        given = f"{len(args)} input(s)" + (f" and the keywords {sorted(kwargs)}" if kwargs else "")
        raise StepInputError(
            f"`{name}` was called with {given}, which do not fit "
            f"`{getattr(fn, '__name__', 'step')}{sig}`: {e}",
            fix=f"pass the inputs that follow `{first}` in that signature (`{name}` passes "
            f"`{first}` itself)",
        ) from None
