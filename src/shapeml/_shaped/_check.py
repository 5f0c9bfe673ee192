"""`@sm.shaped`: jaxtyping + beartype checks on a function, with its models' dims bound.

`def forward(m: Spotter, img: UInt8[Array, "b 1 S S"])` checks `S` against `m.dims.S`; on a method,
`self`'s dims are bound (`def __call__(self, x: Float[Array, "*b In"])` in a layer). Checks run
when the function runs in Python: once per trace under `jax.jit`, so never per compiled step.
An array annotation also takes numpy arrays (and a scalar one Python scalars, `_array_like`); a
failed check names the argument, its shape and the dims expected (`_shape_report`).
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import TypeVar

import numpy as np
from beartype import beartype
from beartype.roar import BeartypeCallHintViolation, BeartypeException
from jaxtyping import Shaped, jaxtyped

from .._errors import ArgumentTypeError, ShapemlError
from .._traceback import api_boundary
from .._validate import shorten
from ..models import Model
from ..models._checks import dims_str
from ._array_like import widen, widened_function
from ._explicit import on_explicit_mesh, run_on_auto_axes
from ._report import first_mismatch, named_in_violation, return_mismatch, signature_text

__all__ = ["ShapeCheckError", "ShapedAnnotationError", "ShapedCallError", "shaped"]

F = TypeVar("F", bound=Callable)


class ShapeCheckError(
    ShapemlError,
    TypeError,
    code="E1001",
    title="shape check failed",
    explanation="""
A function decorated with `@sm.shaped` was called with (or returned) an array whose shape or dtype
does not match its annotation. The dims of its model arguments (every argument that is an
`sm.Model`, `self` included) are bound first, so in

    @sm.shaped
    def forward(m: Spotter, img: UInt8[Array, "b 1 S S"]) -> Float[Array, "b C"]: ...

`S` must equal `m.dims.S` and `C` must equal `m.dims.C`; `b` is bound by the first argument that
uses it. A layer's method is checked in the layer's own dims (`Linear.__call__`: `x [*b In]`).
Numpy arrays are checked like jax arrays, and a scalar annotation also takes a Python or numpy
scalar: only a wrong shape or dtype kind is an error. The message names the argument (or the
return value), its dtype and shape, and the annotation with the values its dims had:

    x: float32[8 31] where float[b D] with D=32 was expected (dimension D is 31)

Two model arguments that share a dim name must agree on its value.
""",
):
    pass


class ShapedCallError(
    ShapemlError,
    TypeError,
    code="E1003",
    title="arguments do not match the function's signature",
    explanation="""
A function decorated with `@sm.shaped` was called with arguments its signature does not take: one
too many or too few, an unknown keyword, or the same argument given twice. The message shows the
signature and what the call passed; the function did not run.

    @sm.shaped
    def forward(m: Spotter, img: UInt8[Array, "b 1 S S"]) -> Float[Array, "b C"]: ...

    forward(m, img, y)        # E1003: takes 2 positional arguments but 3 were given
    forward(m, image=img)     # E1003: missing `img`, unexpected keyword `image`
""",
):
    pass


class ShapedAnnotationError(
    ShapemlError,
    TypeError,
    code="E1004",
    title="annotation cannot be checked",
    explanation="""
`@sm.shaped` could not check a function's annotations: the decorated object is not a plain
function, or an annotation names a type that cannot be found when the function is called (a
string annotation naming a class that is not importable from the function's module). Define
the names the annotations use at module level, or annotate with the types themselves.
""",
):
    pass


def _call_text(args: tuple, kwargs: dict) -> str:
    parts = [f"{len(args)} positional argument(s)"]
    if kwargs:
        parts.append("keywords " + ", ".join(f"`{k[:40]}`" for k in list(kwargs)[:8]))
    return " and ".join(parts)


def _stand_ins(models: list[Model]) -> list[tuple[np.ndarray, type]]:
    """For each model, a zero-copy array shaped like its dims and the annotation naming them."""
    out = []
    for m in models:
        names = [n for n in m.dims if n.isidentifier()]
        if names:
            stand_in = np.broadcast_to(np.zeros((), np.int8), tuple(m.dims[n] for n in names))
            out.append((stand_in, Shaped[np.ndarray, " ".join(names)]))
    return out


def _is_jaxtyping_wrapper(f) -> bool:
    code = getattr(f, "__code__", None)
    return code is not None and "jaxtyping" in code.co_filename and hasattr(f, "__wrapped__")


def _without_jaxtyping_hook(fn):
    """`fn` without the wrapper jaxtyping's import hook adds (pytest `--jaxtyping-packages`).

    That wrapper opens its own shape memo inside the one `shaped` binds the model's dims in, so
    a wrong dim would pass unchecked; `shaped` does that wrapper's checks itself.
    """
    return inspect.unwrap(fn, stop=lambda f: not _is_jaxtyping_wrapper(f))


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def shaped(fn: F) -> F:
    """Checks `fn`'s jaxtyping annotations on every Python-level call, model dims bound.

    The dims of every argument that is an `sm.Model` (annotated or not, `self` of a method
    included) are bound before the arguments are checked. An array annotation also takes a numpy
    array, and a scalar one (`Float[Array, ""]`) a Python or numpy scalar of its kind, passed on
    as given: only a wrong shape or dtype kind is an error. Under `jax.jit` the check runs while
    tracing only, so compiled calls cost nothing extra.

    Example:
        >>> @sm.shaped
        ... def forward(m: Spotter, img: UInt8[Array, "b 1 S S"]) -> Float[Array, "b C"]: ...
        >>> class Scale(sm.Model):
        ...     dims = sm.Dims(D=4)
        ...     w: Float[Array, " D"] = sm.param(sm.ones)
        ...     @sm.shaped
        ...     def __call__(self, x: Float[Array, "*b D"]) -> Float[Array, "*b D"]:
        ...         return x * self.w

    Raises:
        ShapeCheckError: (E1001) naming the argument, its dtype and shape, and the annotation
            with its dims' values (`x: float32[8 31] where float[b D] with D=32 was expected`).
        ShapedCallError: (E1003) for a call its signature does not take (checked first).
        ShapedAnnotationError: (E1004) for annotations that cannot be checked.
        ArgumentTypeError: (E0003) when `fn` is not callable.
    """
    if not callable(fn):
        raise ArgumentTypeError(
            f"@sm.shaped decorates a function, got {shorten(fn)} ({type(fn).__name__})",
            fix="put @sm.shaped on a def",
        )
    qual = getattr(fn, "__qualname__", None) or type(fn).__name__
    fn = _without_jaxtyping_hook(fn)
    try:
        checked = beartype(fn)  # also resolves string annotations in place
        sig = inspect.signature(fn)
    except (BeartypeException, ValueError, TypeError) as e:
        raise ShapedAnnotationError(
            f"@sm.shaped cannot check `{qual}`: {_first_paragraphs(str(e), 300)}",
            fix="decorate a plain Python function whose annotations are importable types",
        ) from None
    shown = dict(getattr(fn, "__annotations__", None) or {})
    shown_sig = signature_text(sig)
    hints = {k: widen(v) for k, v in shown.items()}
    returns = hints.get("return")
    if returns is not None and not isinstance(returns, str):  # checked below, to name it
        del hints["return"]
    copy = widened_function(fn, dict(hints))
    if copy is not fn:
        checked = beartype(copy)
    if copy is fn or "return" in hints:  # beartype checks the return (an unresolved name)
        returns = None

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            bound = sig.bind(*args, **kwargs).arguments
        except TypeError as e:  # checked before beartype or the function see the call
            raise ShapedCallError(
                f"`{qual}` was called with {_call_text(args, kwargs)}: {e}",
                fix=f"call it as its signature says: {qual.rsplit('.', 1)[-1]}{shown_sig}",
            ) from None
        models = [v for v in bound.values() if isinstance(v, Model)]
        mesh = on_explicit_mesh(list(bound.values()))
        if mesh is not None:  # e.g. a user's own jit on an Explicit mesh: run on its Auto axes
            inputs = [v for v in bound.values() if not isinstance(v, Model)]
            return run_on_auto_axes(wrapper, args, kwargs, inputs, mesh)
        try:
            with jaxtyped("context"):
                _bind_dims(models, qual)  # in this frame's memo: an isinstance check binds dims
                out = checked(*args, **kwargs)
                problem = (
                    None if returns is None else return_mismatch(out, returns, shown.get("return"))
                )
            if problem is not None:
                raise ShapeCheckError(
                    f"`{qual}` {problem}", fix="fix the function's body or its return annotation"
                )
            return out
        except BeartypeCallHintViolation as e:
            problem = first_mismatch(sig, bound, hints, shown, lambda: _bind_dims(models, qual))
            problem = problem or named_in_violation(str(e), fn, bound, shown)
            if problem is None:  # a check inside the function, not of its arguments
                raise
            raise ShapeCheckError(
                f"`{qual}`: {problem}",
                fix="pass arrays shaped as the annotation says"
                + (f" ({_dims_text(models)})" if models else ""),
            ) from e  # shown with SHAPEML_TRACEBACK_FILTERING=off; else the boundary cuts it
        except BeartypeException as e:  # e.g. a string annotation naming no importable type
            raise ShapedAnnotationError(
                f"`{qual}`: {_first_paragraphs(str(e), 300)}",
                fix="define the names its annotations use at module level",
            ) from None

    wrapper = api_boundary(wrapper)  # a checked call is an entry point: its errors show short
    wrapper.__shaped__ = True
    return wrapper  # type: ignore[return-value]


def _dims_text(models: list[Model]) -> str:
    return "; ".join(f"{type(m).__name__} dims: {dims_str(m.dims)}" for m in models)


@typing.no_type_check  # jaxtyping's import hook would bind the dims in a memo of its own
def _bind_dims(models: list[Model], qual: str) -> None:
    """Binds every model argument's dims in the current jaxtyping memo (E1001 if two disagree)."""
    for stand_in, dims_type in _stand_ins(models):
        if not isinstance(stand_in, dims_type):
            raise ShapeCheckError(
                f"the dims of the model arguments of `{qual}` disagree: {_dims_text(models)}",
                fix="pass models whose shared dims are equal",
            )


def _first_paragraphs(msg: str, limit: int = 1200) -> str:
    msg = msg.strip()
    return msg if len(msg) <= limit else msg[:limit] + " ..."
