"""Field declarations of a model: `param`, `buffer`, `submodel`, `submodels`.

Each returns a dataclass field carrying a `FieldSpec`; the model's class creation reads the field's
jaxtyping annotation (`Float[Array, "P*P D"]`) for its shape in dims and its dtype
(`_annotations.complete_spec`).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from typing import Any

from .._errors import ShapemlError
from .._traceback import api_boundary
from ._dims import evaluate
from ._mapped import Mapped

__all__ = [
    "FieldDeclarationError",
    "FieldSpec",
    "buffer",
    "param",
    "spec_of",
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
    up: nn.Linear = sm.submodel(nn.Linear, In="D", Out="F")    # its dims from the parent's
    b: Float[Array, " D"] | None = sm.param(sm.zeros, when="bias")   # only if `bias` is True

The annotation of a param or buffer is a jaxtyping array type whose shape uses only whole numbers,
the model's dims and expressions of them (`P*P`): no `...`, `*batch` or `_`. Params are floating
point (integer and bool tensors can be buffers). Random initializers need a floating dtype.

An optional tensor is annotated `... | None` and says when it is present with `when=`: the name of
a bool static field (`when="bias"`), or a mapping of static fields to the values that make it
present (`when={"positions": "learned"}`). A sub-model's dims are mapped onto names the parent
declares (a mapping that reads a dim the parent lacks is refused).
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
    mapped: Mapped | None = None  # a sub-model's class, dims mapping and options
    # (static field, value) pairs that must all hold for the tensor to be present; () = always
    when: tuple[tuple[str, Any], ...] = ()
    # submodels only: stored stacked (one sub-model whose every tensor has a leading axis of
    # `count`): True, False, or the name of a bool static field of the parent that decides
    stacked: bool | str = False

    @property
    def optional(self) -> bool:
        return bool(self.when)

    def present(self, statics: Mapping[str, Any]) -> bool:
        """Whether a model with these static values holds this tensor."""
        return not self._unmet(statics)

    def absent_because(self, statics: Mapping[str, Any]) -> str:
        """Why the tensor is absent, e.g. `bias=False`."""
        return ", ".join(f"{k}={statics.get(k)!r}" for k in self._unmet(statics))

    def _unmet(self, statics: Mapping[str, Any]) -> list[str]:
        # exact values: `bias=1` is not `bias=True`
        return [
            k
            for k, v in self.when
            if not (k in statics and type(statics[k]) is type(v) and statics[k] == v)
        ]

    @property
    def shape_str(self) -> str:
        return " ".join(str(s) for s in self.shape)

    def shape_in(self, dims: Mapping[str, int], where: str = "") -> tuple[int, ...]:
        """The shape in numbers for these dim values."""
        return tuple(evaluate(tok, dims, where or "field shape") for tok in self.shape)

    def count_in(self, dims: Mapping[str, int]) -> int:
        return evaluate(self.count, dims, "submodels count")

    def stacked_in(self, statics: Mapping[str, Any]) -> bool:
        """Whether a parent with these static values stores these sub-models stacked."""
        if isinstance(self.stacked, str):
            return statics.get(self.stacked) is True
        return self.stacked


def _declare(spec: FieldSpec):
    return dataclasses.field(metadata={_KEY: spec})


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def param(
    init: Callable, *, dtype: Any = None, decay: bool = True, when: str | Mapping | None = None
):
    """Declares a trained tensor, initialized by `init` (e.g. `sm.normal(std=0.25)`).

    Args:
        init: the initializer, `(key, shape, dtype) -> array`.
        dtype: one the annotation allows (default: float32 where allowed).
        decay: False exempts it from weight decay (norm scales, biases): optimizers with decay
            build their mask from these declarations.
        when: for an optional tensor (annotated `... | None`), when it is present: the name of a
            bool static field (`when="bias"`), or static fields and the values that make it
            present (`when={"positions": "learned"}`). Absent, the field is None and no
            name-based API (params, checkpoints, optimizers, sharding) lists it.

    Example:
        >>> b: Float[Array, " Out"] | None = sm.param(sm.zeros, decay=False, when="bias")
        >>> bias: bool = sm.static(default=True)
    """
    if not isinstance(decay, bool):
        raise FieldDeclarationError(
            f"sm.param(decay={decay!r}): decay must be True or False",
            fix="write sm.param(init, decay=False) for a field weight decay must not touch",
        )
    return _declare(FieldSpec("param", init=init, dtype=dtype, decay=decay, when=_when(when)))


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def buffer(init: Callable, *, dtype: Any = None, when: str | Mapping | None = None):
    """Declares a tensor saved with the model but never trained (running statistics, masks).

    `when=` makes it optional, as for `sm.param`.
    """
    return _declare(FieldSpec("buffer", init=init, dtype=dtype, when=_when(when)))


def _when(when: Any) -> tuple[tuple[str, Any], ...]:
    if when is None:
        return ()
    if isinstance(when, str) and when.isidentifier():
        return ((when, True),)
    if (
        isinstance(when, Mapping)
        and when
        and all(isinstance(k, str) and k.isidentifier() for k in when)
    ):
        try:
            hash(tuple(when.values()))
        except TypeError:
            pass
        else:
            return tuple(when.items())
    raise FieldDeclarationError(
        f"when={when!r} does not say when the tensor is present",
        fix='name a bool static field (when="bias"), or map static fields to the values that '
        'make it present (when={"positions": "learned"})',
    )


def _as_mapped(kind: str, model: Any, names_and_options: Mapping[str, Any]) -> Mapped:
    if isinstance(model, Mapped):
        if names_and_options:
            raise FieldDeclarationError(
                f"sm.{kind}({model!r}, ...) maps a value that is already mapped",
                fix=f"give every dim and option in one place: sm.{kind}(Cls, In=..., bias=...)",
            )
        return model
    if not (isinstance(model, type) and hasattr(model, "__shapeml_fields__")):
        # Every sm.Model class carries its field table; checking for it keeps this module free
        # of an import of `_model`, which imports this one.
        raise FieldDeclarationError(
            f"sm.{kind}({model!r}) takes an sm.Model class (or `Cls.of(...)`)",
            fix=f"pass the sub-model's class, e.g. sm.{kind}(Block"
            + (', "L")' if kind == "submodels" else ")"),
        )
    return model.of(**names_and_options) if names_and_options else Mapped(model)


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def submodel(model: type | Mapped, /, **dims_and_options: Any):
    """Declares one sub-model.

    It takes the parent's value for every free dim it shares by name; `dims_and_options` map
    its other dims onto the parent's (`In="D"`, an expression `Out="4 * D"`, or a number) and
    set its options (`bias=False`). `sm.submodel(nn.Linear.of(In="D"))` is the same.

    `init={dotted tensor name: initializer}` draws some of its tensors with other initializers
    than their classes declare (from the same per-field keys); a `sm.normal(std=...)` expression
    there reads the parent's dims.

    Example:
        >>> up: nn.Linear = sm.submodel(nn.Linear, In="D", Out="F", bias=False)
        >>> proj: nn.Linear = sm.submodel(nn.Linear, In="F", Out="D",
        ...                               init={"w": sm.normal(std="0.02 / sqrt(2 * L)")})
    """
    mapped = _as_mapped("submodel", model, dims_and_options)
    return _declare(FieldSpec("submodel", model=mapped.model, mapped=mapped))


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def submodels(
    model: type | Mapped,
    count: int | str,
    /,
    *,
    stacked: bool | str = False,
    **dims_and_options: Any,
):
    """Declares `count` sub-models (a number or a dim name, e.g. `"L"`), each mapped and
    configured by `dims_and_options` as for `sm.submodel`.

    By default they are a tuple. With `stacked=True` they are stored as one sub-model whose every
    tensor has a leading axis of `count` (layer `i` is `x[i]` of each tensor), which
    `nn.scan` runs with `jax.lax.scan`: the layer is compiled once, whatever the count, and the
    optimizer updates one tensor per field instead of `count`. `stacked="scan"` lets the parent's
    bool static field `scan` decide per instance (`GPT.init(seed=0, scan=False)`). Names,
    checkpoints and seeds are the same either way: `sm.params(m)` and `sm.save` list
    `blocks.0.w1`, `blocks.1.w1`, ..., layer `i` draws the values it draws unstacked, and a
    checkpoint saved from either storage loads into the other. The model is built from a tuple of
    sub-models (stacked on construction) or from one stacked sub-model. `init={...}` overrides
    initializers as for `sm.submodel`, for every layer alike (`"attn.o.w"`, no layer number).

    Example:
        >>> blocks: Block = sm.submodels(Block, "L", stacked=True)
        >>> x = nn.scan(lambda blk, x: blk(x), m.blocks, x)     # or `for blk in m.blocks` unstacked
    """
    if not isinstance(count, str) and (
        type(count) is not int or not 0 <= count <= 2**62  # bools, floats, negatives
    ):
        raise FieldDeclarationError(
            f"sm.submodels(..., count={count!r}): count must be a whole number >= 0 or a dim name",
            fix='write e.g. sm.submodels(Block, "L") with L a dim, or sm.submodels(Block, 2)',
        )
    if not (type(stacked) is bool or (isinstance(stacked, str) and stacked.isidentifier())):
        raise FieldDeclarationError(
            f"sm.submodels(..., stacked={stacked!r}): stacked is True, False or the name of a "
            "bool static field of the parent",
            fix='write stacked=True, or stacked="scan" with `scan: bool = sm.static(default=True)`',
        )
    mapped = _as_mapped("submodels", model, dims_and_options)
    spec = FieldSpec("submodels", model=mapped.model, count=count, mapped=mapped, stacked=stacked)
    return _declare(spec)


@api_boundary
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
