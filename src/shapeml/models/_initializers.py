"""Field initializers: `zeros`, `ones`, `full(v)`, `normal(mean, std)`, `uniform(lo, hi)`.

An initializer is a callable `(key, shape, dtype) -> array`; any such callable works as one. The
built-ins are small frozen dataclasses so they print as they were written (`normal(std=0.25)`).
"""

from __future__ import annotations

import abc
import dataclasses
import math
import typing

import jax
import jax.numpy as jnp
import numpy as np

from .._errors import ArgumentTypeError
from .._traceback import api_boundary
from .._validate import real, shorten

__all__ = ["Initializer", "draw_flat", "full", "normal", "ones", "uniform", "zeros"]


class Initializer(abc.ABC):
    """Base of the built-in initializers; `random` says whether it draws from its key."""

    random: bool = False
    floating_only: bool = False

    @abc.abstractmethod
    def __call__(self, key: jax.Array, shape: tuple[int, ...], dtype) -> jax.Array:
        """An array of `shape` and `dtype`, drawn from `key` if the rule is random."""


def draw_flat(sample, key: jax.Array, shape: tuple[int, ...], dtype, **kwargs) -> jax.Array:
    """`sample(key, shape, dtype, **kwargs)` (a `jax.random` sampler) drawn as one flat vector and
    reshaped: the same values, since JAX's threefry numbers the elements in row-major order either
    way, and XLA:CPU compiles a 1-D draw about twice as fast as a 3-D one (`Model.init`'s time)."""
    return sample(key, (math.prod(shape),), dtype, **kwargs).reshape(shape)


@api_boundary
@dataclasses.dataclass(frozen=True, repr=False)
class _Full(Initializer):
    value: float | int | bool
    name: str = "full"

    def __call__(self, key, shape, dtype):
        return jnp.full(shape, self.value, dtype)

    def __repr__(self) -> str:
        return self.name if self.name != "full" else f"full({self.value!r})"


@dataclasses.dataclass(frozen=True, repr=False)
class _Normal(Initializer):
    mean: float = 0.0
    std: float = 1.0
    random = True
    floating_only = True

    def __call__(self, key, shape, dtype):
        return self.mean + self.std * draw_flat(jax.random.normal, key, shape, dtype)

    def __repr__(self) -> str:
        args = [f"mean={self.mean}"] if self.mean != 0 else []
        args += [f"std={self.std}"] if self.std != 1 else []
        return f"normal({', '.join(args)})"


@dataclasses.dataclass(frozen=True, repr=False)
class _Uniform(Initializer):
    lo: float = 0.0
    hi: float = 1.0
    random = True
    floating_only = True

    def __call__(self, key, shape, dtype):
        return draw_flat(jax.random.uniform, key, shape, dtype, minval=self.lo, maxval=self.hi)

    def __repr__(self) -> str:
        return f"uniform(lo={self.lo}, hi={self.hi})"


zeros = _Full(0, name="zeros")
"""Initializes every element to 0 (any dtype)."""

ones = _Full(1, name="ones")
"""Initializes every element to 1 (any dtype)."""


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def full(value: float | int | bool) -> Initializer:
    """Initializes every element to `value`."""
    if not isinstance(value, (int, float, bool, np.number)):
        raise ArgumentTypeError(
            f"full(value) takes a number, got {shorten(value)} ({type(value).__name__})",
            fix="pass a Python or numpy number, e.g. sm.full(0.5)",
        )
    return _Full(value)


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def normal(mean: float | int = 0.0, std: float | int = 1.0) -> Initializer:
    """Draws from a normal distribution with this mean and standard deviation (floats only)."""
    mean = real("mean", mean, fix="pass a finite number, e.g. sm.normal(mean=0.0, std=0.02)")
    std = real("std", std, low=0.0, fix="pass a finite number >= 0, e.g. sm.normal(std=0.02)")
    return _Normal(mean, std)


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def uniform(lo: float | int = 0.0, hi: float | int = 1.0) -> Initializer:
    """Draws uniformly from `[lo, hi)` (floats only)."""
    lo = real("lo", lo, fix="pass finite numbers lo <= hi, e.g. sm.uniform(-0.1, 0.1)")
    hi = real("hi", hi, low=lo, fix=f"pass hi >= lo = {lo}, e.g. sm.uniform({lo}, {lo + 1})")
    return _Uniform(lo, hi)
