"""Field initializers: `zeros`, `ones`, `full(v)`, `normal(mean, std)`, `uniform(lo, hi)`.

An initializer is a callable `(key, shape, dtype) -> array`; any such callable works as one. The
built-ins are small frozen dataclasses so they print as they were written (`normal(std=0.25)`).
`normal`'s `std` may be an expression of the declaring model's dims (`"0.02 / sqrt(2 * L)"`, GPT-2's
residual projections), evaluated when the model is built (`resolve_init`).
"""

from __future__ import annotations

import abc
import ast
import dataclasses
import math
import typing
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from .._errors import ArgumentError, ArgumentTypeError
from .._traceback import api_boundary
from .._validate import real, shorten

__all__ = [
    "Initializer",
    "draw_flat",
    "full",
    "normal",
    "ones",
    "resolve_init",
    "uniform",
    "zeros",
]


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
    std: float | str = 1.0  # a str is an expression of dims, resolved by `resolve_init`
    random = True
    floating_only = True

    def __call__(self, key, shape, dtype):
        if isinstance(self.std, str):
            raise ArgumentError(
                f"normal(std={self.std!r}) reads dims, so it draws only inside a model's "
                "declaration (the model's dims give its value)",
                fix="declare it on a field, sm.param(sm.normal(std=...)), or pass a number",
            )
        return self.mean + self.std * draw_flat(jax.random.normal, key, shape, dtype)

    def resolve(self, dims: Mapping[str, int], where: str) -> Initializer:
        if not isinstance(self.std, str):
            return self
        return _Normal(self.mean, std_of(self.std, dims, where))

    def __repr__(self) -> str:
        args = [f"mean={self.mean}"] if self.mean != 0 else []
        args += [f"std={self.std!r}"] if self.std != 1 else []
        return f"normal({', '.join(args)})"


def resolve_init(init, dims: Mapping[str, int], where: str):
    """`init` with every dims expression it holds evaluated in `dims` (the declaring model's)."""
    resolve = getattr(init, "resolve", None)
    return init if resolve is None else resolve(dims, where)


_OPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.Pow: lambda a, b: a**b,
}
_FUNCS = {"sqrt": math.sqrt, "log": math.log, "exp": math.exp}


def _float_ev(node: ast.expr, dims: Mapping[str, int]) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return float(node.value)
    if isinstance(node, ast.Name):
        if node.id not in dims:
            raise KeyError(node.id)
        return float(dims[node.id])
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _float_ev(node.operand, dims)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_float_ev(node.left, dims), _float_ev(node.right, dims))
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCS
        and len(node.args) == 1
        and not node.keywords
    ):
        return _FUNCS[node.func.id](_float_ev(node.args[0], dims))
    raise SyntaxError(ast.dump(node))


def std_of(expr: str, dims: Mapping[str, int], where: str) -> float:
    """The value of a std expression (numbers, dims, `+ - * / **`, `sqrt`, `log`, `exp`), in
    floating point, checked to be finite and >= 0."""
    fix = 'write numbers, the model\'s dims, + - * / ** and sqrt(), e.g. std="0.02 / sqrt(2 * L)"'
    try:
        value = _float_ev(ast.parse(expr.strip(), mode="eval").body, dims)
    except KeyError as e:
        raise ArgumentError(
            f"{where}: normal(std={expr!r}) reads the dim `{e.args[0]}`, which the model that "
            f"declares it does not have (dims: {', '.join(dims) or 'none'})",
            fix=f"use the declaring model's dims; {fix}",
        ) from None
    except (SyntaxError, ValueError, OverflowError, ZeroDivisionError, RecursionError):
        raise ArgumentError(
            f"{where}: normal(std={expr!r}) is not a computable std expression", fix=fix
        ) from None
    if not (math.isfinite(value) and value >= 0):
        raise ArgumentError(f"{where}: normal(std={expr!r}) is {value}, not >= 0", fix=fix)
    return value


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
def normal(mean: float | int = 0.0, std: float | int | str = 1.0) -> Initializer:
    """Draws from a normal distribution with this mean and standard deviation (floats only).

    `std` may be an expression of the dims of the model that declares the initializer (numbers,
    dims, `+ - * / **`, `sqrt`, `log`, `exp`), evaluated in floating point when the model is built:
    GPT-2 draws its residual projections with `std="0.02 / sqrt(2 * L)"`.

    Example:
        >>> w: Float[Array, "D D"] = sm.param(sm.normal(std=0.02))
        >>> blocks: tuple[Block, ...] = sm.submodels(
        ...     Block, "L", init={"proj.w": sm.normal(std="0.02 / sqrt(2 * L)")})
    """
    mean = real("mean", mean, fix="pass a finite number, e.g. sm.normal(mean=0.0, std=0.02)")
    if isinstance(std, str):
        try:
            ast.parse(std.strip(), mode="eval")
        except SyntaxError:
            raise ArgumentError(
                f"normal(std={std!r}) is not an expression",
                fix='write e.g. std="0.02 / sqrt(2 * L)" with L a dim of the declaring model',
            ) from None
        return _Normal(mean, std)
    std = real("std", std, low=0.0, fix="pass a finite number >= 0, e.g. sm.normal(std=0.02)")
    return _Normal(mean, std)


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def uniform(lo: float | int = 0.0, hi: float | int = 1.0) -> Initializer:
    """Draws uniformly from `[lo, hi)` (floats only)."""
    lo = real("lo", lo, fix="pass finite numbers lo <= hi, e.g. sm.uniform(-0.1, 0.1)")
    hi = real("hi", hi, low=lo, fix=f"pass hi >= lo = {lo}, e.g. sm.uniform({lo}, {lo + 1})")
    return _Uniform(lo, hi)
