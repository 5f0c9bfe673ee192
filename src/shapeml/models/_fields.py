"""Field declarations of a model: `param`, `buffer`, `submodel`, `submodels`.

Each returns a dataclass field carrying a `FieldSpec`; the model's class creation reads the field's
jaxtyping annotation (`Float[Array, "P*P D"]`) for its shape in dims and its dtype.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from .._errors import ShapemlError, similar
from ._dims import Dims, evaluate, names_in

__all__ = [
    "FieldDeclarationError",
    "FieldSpec",
    "buffer",
    "param",
    "static",
    "submodel",
    "submodels",
]

_KEY = "shapeml"


class FieldDeclarationError(
    ShapemlError,
    TypeError,
    code="E0905",
    title="invalid field declaration",
    explanation="""
A model field is declared in a way shapeml cannot use. Each field of an `sm.Model` is one of:

    w: Float[Array, "D C"] = sm.param(sm.normal(std=0.18))     # trained
    center: Float[Array, "1 S S"] = sm.buffer(sm.zeros)        # saved, never trained
    blocks: tuple[Block, ...] = sm.submodels(Block, "L")       # L sub-models
    head: Head = sm.submodel(Head)                             # one sub-model

The annotation of a param or buffer is a jaxtyping array type whose shape uses only whole numbers,
the model's dims and expressions of them (`P*P`): no `...`, `*batch` or `_`. Params are floating
point (integer and bool tensors can be buffers). Random initializers need a floating dtype.
""",
):
    pass


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """What a field declares. `shape` and `dtype` are filled in from the annotation."""

    kind: str  # "param", "buffer", "submodel" or "submodels"
    init: Callable | None = None
    dtype: Any = None
    model: type | None = None
    count: int | str | None = None
    shape: tuple[int | str, ...] = ()
    decay: bool = True  # weight decay applies to this param (norm scales and biases opt out)

    @property
    def shape_str(self) -> str:
        return " ".join(str(s) for s in self.shape)

    def shape_in(self, dims: Mapping[str, int], where: str = "") -> tuple[int, ...]:
        """The shape in numbers for these dim values."""
        return tuple(evaluate(tok, dims, where or "field shape") for tok in self.shape)

    def count_in(self, dims: Mapping[str, int]) -> int:
        return evaluate(self.count, dims, "submodels count")


def _declare(spec: FieldSpec):
    return dataclasses.field(metadata={_KEY: spec})


def param(init: Callable, *, dtype: Any = None, decay: bool = True):
    """Declares a trained tensor, initialized by `init` (e.g. `sm.normal(std=0.25)`).

    Its shape and dtype come from the annotation; `dtype=` picks one the annotation allows
    (default: float32 where allowed). `decay=False` exempts it from weight decay (norm scales,
    biases): optimizers with decay build their mask from these declarations.
    """
    if not isinstance(decay, bool):
        raise FieldDeclarationError(
            f"sm.param(decay={decay!r}): decay must be True or False",
            fix="write sm.param(init, decay=False) for a field weight decay must not touch",
        )
    return _declare(FieldSpec("param", init=init, dtype=dtype, decay=decay))


def buffer(init: Callable, *, dtype: Any = None):
    """Declares a tensor saved with the model but never trained (running statistics, masks)."""
    return _declare(FieldSpec("buffer", init=init, dtype=dtype))


def submodel(model: type):
    """Declares one sub-model; it takes the parent's value for every dim it shares by name."""
    return _declare(FieldSpec("submodel", model=model))


@typing.no_type_check  # validates its arguments itself, with coded errors
def submodels(model: type, count: int | str):
    """Declares a tuple of `count` sub-models (a number or a dim name, e.g. `"L"`)."""
    if not isinstance(count, str) and (
        type(count) is not int or not 0 <= count <= 2**62  # bools, floats, negatives
    ):
        raise FieldDeclarationError(
            f"sm.submodels(..., count={count!r}): count must be a whole number >= 0 or a dim name",
            fix='write e.g. sm.submodels(Block, "L") with L a dim, or sm.submodels(Block, 2)',
        )
    return _declare(FieldSpec("submodels", model=model, count=count))


def static(default: Any = dataclasses.MISSING):
    """Declares static configuration: a value that is not a tensor (a vocabulary, a flag).

    It is part of the model's structure (`jax.jit` treats it as configuration), set by keyword in
    the constructor, `replace` and `init` (or taken from `default`), and saved by `sm.save`. It must
    be hashable and JSON-serializable: numbers, strings, bools, None and tuples of them.

    Example:
        >>> class Vocab(sm.Model):
        ...     dims = sm.Dims(V=3)
        ...     tokens: tuple[str, ...] = sm.static(default=("a", "b", "c"))
    """
    return dataclasses.field(default=default, metadata={"static": True})


def spec_of(field: dataclasses.Field) -> FieldSpec | None:
    return field.metadata.get(_KEY)


def _default_dtype(allowed) -> np.dtype:
    if not isinstance(allowed, (list, tuple)):
        return np.dtype("float32")  # `Shaped`: any dtype
    for name in ("float32", "int32", "uint32", "bool"):
        if name in allowed:
            return np.dtype(name)
    return np.dtype(jnp.dtype(allowed[-1]))


def complete_spec(owner: str, name: str, spec: FieldSpec, hint: Any, dims: Dims) -> FieldSpec:
    """Fills in a param/buffer spec's shape and dtype from its jaxtyping annotation, checking both.

    Raises:
        FieldDeclarationError: (E0905) naming the field and what is wrong with it.
    """
    where = f"`{owner}.{name}`"
    if spec.kind in ("submodel", "submodels"):
        # Every sm.Model class carries its field table; checking for it keeps this module free of
        # an import of `_model`, which imports this one.
        if not (isinstance(spec.model, type) and hasattr(spec.model, "__shapeml_fields__")):
            raise FieldDeclarationError(
                f"{where} is declared {spec.kind}({spec.model!r}), which is not an sm.Model class",
                fix=f"pass the sub-model's class, e.g. sm.{spec.kind}(Block"
                + (', "L")' if spec.kind == "submodels" else ")"),
            )
        if spec.count is not None:
            _check_names(owner, name, str(spec.count), dims)
        return spec
    dim_str = getattr(hint, "dim_str", None)
    if dim_str is None:
        raise FieldDeclarationError(
            f"{where} is a {spec.kind} but its annotation `{hint}` is not a jaxtyping array type",
            fix=f'annotate it like `{name}: Float[Array, "D C"] = sm.{spec.kind}(...)`',
        )
    tokens: list[int | str] = []
    for tok in dim_str.split():
        if tok.startswith(("*", "#", "_", "...")) or "?" in tok or tok == "...":
            raise FieldDeclarationError(
                f"{where} has shape `{dim_str}`; `{tok}` is not allowed in a field's shape",
                fix="a field's shape uses only numbers, dims and expressions of dims",
            )
        if tok.isdigit():
            tokens.append(int(tok))
        else:
            _check_names(owner, name, tok, dims)
            tokens.append(tok)
    allowed = getattr(hint, "dtypes", None)
    dtype = _default_dtype(allowed) if spec.dtype is None else np.dtype(jnp.dtype(spec.dtype))
    if isinstance(allowed, (list, tuple)) and dtype.name not in allowed:
        raise FieldDeclarationError(
            f"{where} is declared dtype {dtype.name}, which its annotation `{hint.__name__}` "
            f"does not allow",
            fix=f"use one of: {', '.join(allowed[-6:])}",
        )
    floating = jnp.issubdtype(dtype, jnp.floating)
    if spec.kind == "param" and not floating:
        raise FieldDeclarationError(
            f"{where} is a param of dtype {dtype.name}; only floating tensors can be trained",
            fix=f"declare it with sm.buffer(...) instead: `{name}: ... = sm.buffer(sm.zeros)`",
        )
    if not callable(spec.init):
        raise FieldDeclarationError(
            f"{where} has initializer {spec.init!r}, which is not callable",
            fix="use sm.zeros, sm.ones, sm.full(v), sm.normal(...), sm.uniform(...) or "
            "a function (key, shape, dtype) -> array",
        )
    if getattr(spec.init, "floating_only", False) and not floating:
        raise FieldDeclarationError(
            f"{where} has dtype {dtype.name} but initializer {spec.init!r} draws floats",
            fix="use sm.zeros, sm.ones or sm.full(v) for integer and bool tensors",
        )
    return dataclasses.replace(spec, shape=tuple(tokens), dtype=dtype)


def _check_names(owner: str, name: str, expr: str, dims: Dims) -> None:
    for n in names_in(expr, f"`{owner}.{name}`"):
        if n not in dims:
            raise FieldDeclarationError(
                f"`{owner}.{name}` uses the dim `{n}`, which `{owner}` does not declare "
                f"(dims: {', '.join(dims) or 'none'})",
                fix=similar(n, dims, what="dim") or f"add `{n}=...` to `{owner}`'s sm.Dims",
            )
