"""`@sm.shaped`: jaxtyping + beartype checks on a function, with its models' dims bound.

`def forward(m: Spotter, img: UInt8[Array, "b 1 S S"])` checks `S` against `m.dims.S`. Checks run
when the function runs in Python: once per trace under `jax.jit`, so never per compiled step.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import TypeVar

import numpy as np
from beartype import beartype
from beartype.roar import BeartypeCallHintViolation
from jaxtyping import Shaped, jaxtyped

from ._errors import ShapemlError
from .models import Model

__all__ = ["ShapeCheckError", "shaped"]

F = TypeVar("F", bound=Callable)


class ShapeCheckError(
    ShapemlError,
    TypeError,
    code="E1001",
    title="shape check failed",
    explanation="""
A function decorated with `@sm.shaped` was called with (or returned) an array whose shape or dtype
does not match its annotation. The dims of its model arguments are bound first, so in

    @sm.shaped
    def forward(m: Spotter, img: UInt8[Array, "b 1 S S"]) -> Float[Array, "b C"]: ...

`S` must equal `m.dims.S` and `C` must equal `m.dims.C`; `b` is bound by the first argument that
uses it. The message names the argument or return value and the current value of every dim.
""",
):
    pass


def _stand_ins(models: list[Model]) -> list[tuple[np.ndarray, type]]:
    """For each model, a zero-copy array shaped like its dims and the annotation naming them."""
    out = []
    for m in models:
        names = [n for n in m.dims if n.isidentifier()]
        if names:
            stand_in = np.broadcast_to(np.zeros((), np.int8), tuple(m.dims[n] for n in names))
            out.append((stand_in, Shaped[np.ndarray, " ".join(names)]))
    return out


def shaped(fn: F) -> F:
    """Checks `fn`'s jaxtyping annotations on every Python-level call, model dims bound.

    Under `jax.jit` the check runs while tracing only, so compiled calls cost nothing extra.

    Example:
        >>> @sm.shaped
        ... def forward(m: Spotter, img: UInt8[Array, "b 1 S S"]) -> Float[Array, "b C"]: ...

    Raises:
        ShapeCheckError: (E1001) naming the argument and the dims' current values.
    """
    checked = beartype(fn)
    sig = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable string annotations: fall back to the raw ones
        hints = {n: p.annotation for n, p in sig.parameters.items()}
    model_params = [
        name
        for name in sig.parameters
        if isinstance(hints.get(name), type) and issubclass(hints[name], Model)
    ]

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        __tracebackhide__ = True
        models = []
        if model_params:
            bound = sig.bind_partial(*args, **kwargs).arguments
            models = [bound[n] for n in model_params if isinstance(bound.get(n), Model)]
        try:
            with jaxtyped("context"):
                # Binding must happen in this frame's memo: an isinstance check binds each dim.
                for stand_in, dims_type in _stand_ins(models):
                    if not isinstance(stand_in, dims_type):
                        raise ShapeCheckError(
                            f"the dims of the model arguments of `{fn.__qualname__}` disagree: "
                            + "; ".join(f"{type(m).__name__} {dict(m.dims)}" for m in models),
                            fix="pass models whose shared dims are equal",
                        )
                return checked(*args, **kwargs)
        except BeartypeCallHintViolation as e:
            raise ShapeCheckError(
                f"`{fn.__qualname__}`: {_first_paragraphs(str(e))}",
                fix="check the shapes passed in against the annotation (model dims: "
                + ("; ".join(f"{type(m).__name__} {dict(m.dims)}" for m in models) or "none")
                + ")",
            ) from e

    wrapper.__shaped__ = True
    return wrapper  # type: ignore[return-value]


def _first_paragraphs(msg: str, limit: int = 1200) -> str:
    msg = msg.strip()
    return msg if len(msg) <= limit else msg[:limit] + " ..."
