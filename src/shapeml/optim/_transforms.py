"""Gradient transforms: plain functions `Grad[M] -> Grad[M]`, such as `clip_norm(1.0)`."""

from __future__ import annotations

import dataclasses

import optax

from .._errors import ArgumentError
from .._grad import Grad

__all__ = ["clip_norm"]


@dataclasses.dataclass(frozen=True)
class _ClipNorm:
    max_norm: float

    def __call__(self, g: Grad) -> Grad:
        clipped, _ = optax.clip_by_global_norm(self.max_norm).update(g.tree, optax.EmptyState())
        return type(g)(clipped)

    def config(self):
        return {"kind": "clip_norm", "max_norm": self.max_norm}

    def __repr__(self):
        return f"clip_norm({self.max_norm})"


def clip_norm(max_norm: float | int):
    """A transform that scales a gradient down to global norm `max_norm` when it is above it.

    Example:
        >>> m, opt = optim.update(m, opt, optim.clip_norm(1.0)(g))
    """
    if not max_norm > 0:
        raise ArgumentError(f"clip_norm(max_norm) needs max_norm > 0, got {max_norm}")
    return _ClipNorm(float(max_norm))
