"""Gradient transforms: `clip_norm(1.0)`, an optax transformation that also applies to a `Grad`.

`transforms=[...]` of the built-in optimizers takes these, any optax `GradientTransformation`, or a
plain function `Grad[M] -> Grad[M]`; `as_optax` turns each into the optax transformation that goes
first in the optimizer's `optax.chain`.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any

import optax

from .._errors import ArgumentTypeError
from .._grad import Grad
from .._traceback import api_boundary
from .._validate import real, shorten

__all__ = ["as_optax", "clip_norm"]


@dataclasses.dataclass(frozen=True)
class _ClipNorm:
    """`optax.clip_by_global_norm(max_norm)`, comparable by value, callable on a `Grad`."""

    max_norm: float

    @property
    def tx(self) -> optax.GradientTransformation:
        return optax.clip_by_global_norm(self.max_norm)

    def init(self, params):
        return self.tx.init(params)

    def update(self, updates, state, params=None):
        return self.tx.update(updates, state, params)

    def __call__(self, g: Grad) -> Grad:
        clipped, _ = self.tx.update(g.tree, optax.EmptyState())
        return type(g)(clipped)

    def config(self) -> dict[str, Any]:
        return {"kind": "clip_norm", "max_norm": self.max_norm}

    def __repr__(self):
        return f"clip_norm({self.max_norm})"


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def clip_norm(max_norm: float | int) -> _ClipNorm:
    """Scales a gradient down to global L2 norm `max_norm` when it is above it.

    It is `optax.clip_by_global_norm(max_norm)`: put it in an optimizer's `transforms=[...]` or in
    your own `optax.chain`, or apply it to a `Grad` directly.

    Example:
        >>> opt = optim.adamw(m, lr=3e-3, transforms=[optim.clip_norm(1.0)])
        >>> g = optim.clip_norm(1.0)(g)                      # a Grad[M] -> Grad[M]

    Raises:
        ArgumentError: (E0002) unless `max_norm` is a finite number > 0.
    """
    return _ClipNorm(real("clip_norm(max_norm)", max_norm, low=0.0, low_open=True))


def _grad_function(fn: Callable) -> optax.GradientTransformation:
    """A stateless optax transformation applying a `Grad[M] -> Grad[M]` function."""

    def update(updates, state, params=None):
        out = fn(Grad[type(updates)](updates))
        if not isinstance(out, Grad):
            raise ArgumentTypeError(
                f"the gradient transform {shorten(fn)} returned {type(out).__name__}, not a Grad",
                fix="return a Grad of the same model, e.g. `lambda g: g * 0.5`",
            )
        return out.tree, state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def as_optax(t: Any) -> Any:
    """The optax transformation of one entry of `transforms=[...]`."""
    if isinstance(t, _ClipNorm):
        return t.tx
    if isinstance(t, optax.GradientTransformation):
        return t
    if callable(t):
        return _grad_function(t)
    raise ArgumentTypeError(
        f"a transform is optim.clip_norm(...), an optax GradientTransformation or a function "
        f"Grad -> Grad, got {shorten(t)}",
        fix="pass e.g. transforms=[optim.clip_norm(1.0)]",
    )
