"""`Grad[M]`, the typed gradient of a model, and `value_and_grad` / `grad` / `norm`.

A `Grad[M]` holds exactly M's params, laid out like M (buffers are absent), so `g.tw1` and
`g.blocks[0].w1` read like the model. It is an immutable pytree: `jax.jit`, `jax.vmap` and
`jax.lax.scan` carry it as they carry the model.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Callable
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from . import _jax_internals as jxi
from ._dead_params import check_reads, scalar_loss
from ._errors import ArgumentTypeError, ShapemlError, similar
from ._traceback import api_boundary
from ._validate import instance, shorten
from .models import Model
from .models._introspect import param_mask
from .models._model import UnknownFieldError

__all__ = [
    "Grad",
    "GradMismatchError",
    "UnknownParamError",
    "grad",
    "norm",
    "split_params",
    "value_and_grad",
]


class GradMismatchError(
    ShapemlError,
    TypeError,
    code="E1104",
    title="gradients of different models",
    explanation="""
Two gradients were combined (`g + h`, `g * h`) that belong to different model classes, or whose
params differ in shape (models built with other dims). Gradients combine only with a gradient of the
same model and dims, or with a number:

    g_total = g_batch1 + g_batch2      # both Grad[Spotter]
    g_half = g * 0.5
""",
):
    pass


class BufferGradError(
    ShapemlError,
    AttributeError,
    code="E1105",
    title="buffers have no gradient",
    explanation="""
Code read a buffer's field on a gradient (`g.center`). Buffers are saved with the model but never
trained, so `Grad[M]` holds params only. Make the field a `sm.param` if it should be trained.
""",
):
    pass


class UnknownParamError(
    ShapemlError,
    KeyError,
    code="E0908",
    title="no param by that dotted name",
    explanation="""
A gradient was indexed by a dotted name (`g["blocks.0.w1"]`) that names no param of its model:
a typo, a buffer (buffers have no gradient), or a sub-model rather than a tensor. The message
lists a similar name when one exists; `g.named()` maps every param's dotted name to its gradient.
""",
):
    pass


@typing.no_type_check  # validates its arguments itself, with coded errors
def split_params(m: Model) -> tuple[Model, Model]:
    """`(params, rest)`: two trees shaped like `m`, params in one and buffers in the other
    (None elsewhere); `eqx.combine(params, rest)` rebuilds `m`."""
    instance("m", m, Model, "an sm.Model")
    return eqx.partition(m, param_mask(m))


@api_boundary
class Grad(eqx.Module):
    """The gradient of a loss with respect to a model's params: `Grad[Spotter]`.

    Supports `+ - *` with a Grad of the same model or a number, `/` by a number, unary `-`,
    field access like the model (`g.tw1`), dotted names (`g["blocks.0.w1"]`, `g.named()`).
    """

    tree: Any
    model_class: ClassVar[type | None] = None

    @classmethod
    @functools.cache
    def for_model(cls, model_class: type) -> type[Grad]:
        if not (isinstance(model_class, type) and issubclass(model_class, Model)):
            raise ArgumentTypeError(f"Grad[...] takes an sm.Model class, got {model_class!r}")
        return type(
            f"Grad[{model_class.__name__}]",
            (Grad,),
            {"model_class": model_class, "__module__": __name__},
        )

    def __class_getitem__(cls, model_class: type) -> type[Grad]:
        return Grad.for_model(model_class)

    def __check_init__(self):
        if self.model_class is None:
            raise ArgumentTypeError(
                "build a gradient as sm.Grad[Model](tree), with the model's class"
            )
        if not isinstance(self.tree, self.model_class):
            raise ArgumentTypeError(
                f"{type(self).__name__} holds a tree shaped like a {self.model_class.__name__}, "
                f"got {type(self.tree).__name__}"
            )
        specs = self.model_class.__shapeml_fields__
        buffers = [
            k
            for k, spec in specs.items()
            if spec.kind == "buffer" and getattr(self.tree, k) is not None
        ]
        if buffers:
            raise ArgumentTypeError(
                f"{type(self).__name__} holds params only, but was given buffers {buffers}: "
                "build it from sm.value_and_grad, or set buffer fields to None"
            )

    def __reduce__(self):  # the typed class is made on demand, so pickle rebuilds it
        return (_rebuild, (self.model_class, self.tree))

    # -- reading ---------------------------------------------------------------------------
    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        specs = self.model_class.__shapeml_fields__
        if name in specs and specs[name].kind == "buffer":
            raise BufferGradError(
                f"`{name}` is a buffer of `{self.model_class.__name__}`, so it has no gradient",
                fix=f"declare `{name}` with sm.param(...) if it should be trained",
            )
        if name in specs:
            return getattr(self.tree, name)
        raise UnknownFieldError(
            f"`{type(self).__name__}` has no field `{name}` (params: {', '.join(self.named())})",
            fix=similar(name, specs),
        )

    def named(self) -> dict[str, jax.Array]:
        """The gradient of each param, by dotted name."""
        from .models._introspect import params

        return params(self._as_model())

    @typing.no_type_check  # validates its arguments itself, with coded errors
    def __getitem__(self, name: str) -> jax.Array:
        named = self.named()
        if not isinstance(name, str) or name not in named:
            hint = similar(name, named, what="param") if isinstance(name, str) else None
            raise UnknownParamError(
                f"no param {shorten(name)} in {type(self).__name__}",
                fix=hint or f"use one of its params' dotted names: {', '.join(list(named)[:8])}",
            )
        return named[name]

    def _as_model(self) -> Model:
        # Buffers read as None; the walk only needs params.
        return self.tree

    def __repr__(self) -> str:
        parts = [f"{k}: [{' '.join(map(str, v.shape))}]" for k, v in self.named().items()]
        return f"{type(self).__name__}({', '.join(parts)})"

    # -- arithmetic ------------------------------------------------------------------------
    def _combine(self, other, op: Callable, symbol: str):
        if isinstance(other, Grad):
            if type(other) is not type(self):
                raise GradMismatchError(
                    f"cannot combine {type(self).__name__} {symbol} {type(other).__name__}",
                    fix="combine gradients of the same model class",
                )
            mine, theirs = jax.tree.structure(self), jax.tree.structure(other)
            shapes = [x.shape for x in jax.tree.leaves(self)]
            other_shapes = [x.shape for x in jax.tree.leaves(other)]
            if mine != theirs or shapes != other_shapes:
                raise GradMismatchError(
                    f"cannot combine two {type(self).__name__} of different dims "
                    f"({self.tree.dims} vs {other.tree.dims})",
                    fix="combine gradients of models with equal dims",
                )
            return type(self)(jax.tree.map(op, self.tree, other.tree))
        if isinstance(other, (int, float, np.number)) or (
            isinstance(other, (jax.Array, np.ndarray)) and np.ndim(other) == 0
        ):
            return type(self)(jax.tree.map(lambda x: op(x, other), self.tree))
        return NotImplemented

    def __add__(self, other):
        return self._combine(other, jnp.add, "+")

    def __radd__(self, other):
        if isinstance(other, int) and other == 0:
            return self  # so sum([g1, g2, ...]) works
        return self._combine(other, lambda a, b: jnp.add(b, a), "+")

    def __sub__(self, other):
        return self._combine(other, jnp.subtract, "-")

    def __rsub__(self, other):
        return self._combine(other, lambda a, b: jnp.subtract(b, a), "-")

    def __mul__(self, other):
        return self._combine(other, jnp.multiply, "*")

    def __rmul__(self, other):
        return self._combine(other, lambda a, b: jnp.multiply(b, a), "*")

    def __truediv__(self, other):
        if isinstance(other, Grad):
            raise ArgumentTypeError("a Grad can be divided by a number only")
        return self._combine(other, jnp.divide, "/")

    def __neg__(self):
        return type(self)(jax.tree.map(jnp.negative, self.tree))


def _rebuild(model_class: type, tree) -> Grad:
    return Grad[model_class](tree)


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def norm(g: Grad) -> jax.Array:
    """The global L2 norm of a gradient: the norm of all its values together."""
    instance("g", g, Grad, "a gradient (sm.Grad[M], from sm.grad or sm.value_and_grad)")
    return _global_norm(jax.tree.leaves(g))


@jax.jit  # called eagerly (a quick look at a gradient): one program, not one per op and leaf
def _global_norm(leaves: list[jax.Array]) -> jax.Array:
    return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in leaves))


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def value_and_grad(f: Callable, m: Model, *args, has_aux: bool = False, **kwargs):
    """Calls `f(m, *args, **kwargs)` and returns `(value, g)`, g a `Grad[type(m)]`.

    Differentiates with respect to m's params only; buffers are held fixed. Once per trace it
    checks which params the loss reads: each param it never reads warns W1101, and a loss that
    reads none raises E1101. Under `jax.jit` that check happens while tracing, never per step.

    Args:
        f: the loss, a scalar function of the model first.
        m: the model.
        has_aux: `f` returns `(value, aux)`; then the result is `((value, aux), g)`.

    Example:
        >>> l, g = sm.value_and_grad(spotter.loss, m, img, y)
        >>> g.tw1.shape == m.tw1.shape
        True
    """
    if not callable(f):
        raise ArgumentTypeError(
            f"value_and_grad(f, m, ...) takes the loss function first, got {shorten(f)} "
            f"({type(f).__name__})",
            fix="call it as sm.value_and_grad(loss, m, *args)",
        )
    if not isinstance(m, Model):
        raise ArgumentTypeError(
            f"value_and_grad(f, m, ...) differentiates an sm.Model, got {type(m).__name__}; "
            "use jax.value_and_grad for other functions",
            fix="pass the model second: sm.value_and_grad(loss, m, *args)",
        )
    instance("has_aux", has_aux, bool, "True or False")
    params, rest = split_params(m)

    def loss_of_params(p):
        return scalar_loss(f(eqx.combine(p, rest), *args, **kwargs), has_aux)

    # `jax.value_and_grad` is this vjp; calling it here lets the dead-param check read the
    # linearization the one trace of the loss made.
    value, vjp_fn, *aux = jax.vjp(loss_of_params, params, has_aux=has_aux)
    check_reads(vjp_fn, params, getattr(f, "__qualname__", repr(f)), type(m).__name__)
    (tree,) = vjp_fn(jxi.one_cotangent(value))
    return ((value, aux[0]) if has_aux else value), Grad[type(m)](tree)


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def grad(f: Callable, m: Model, *args, has_aux: bool = False, **kwargs):
    """Like `value_and_grad`, returning the `Grad[M]` alone (or `(g, aux)` with `has_aux`)."""
    value, g = value_and_grad(f, m, *args, has_aux=has_aux, **kwargs)
    return (g, value[1]) if has_aux else g
