"""Reading a field's annotation: its shape in dims and dtype (`Float[Array, "P*P D"]`), whether it
is optional (`... | None`), each checked against the model's dims and static fields."""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar

import jax.numpy as jnp
import numpy as np

from .._errors import similar
from ._dims import Dims, names_in
from ._fields import FieldDeclarationError, FieldSpec, spec_of
from ._mapped import reads

__all__ = ["complete_spec", "read_declarations"]


def _annotations_of(cls) -> dict[str, Any]:
    raw = cls.__dict__.get("__annotations__", {})
    module = sys.modules.get(cls.__module__)
    namespace = dict(vars(module)) if module else {}
    hints = {}
    for name, hint in raw.items():
        if isinstance(hint, str):
            try:
                hint = eval(hint, namespace, dict(vars(cls)))  # noqa: S307 - the class's own annotation
            except Exception as e:
                raise FieldDeclarationError(
                    f"`{cls.__name__}.{name}`: its annotation `{hint}` could not be evaluated ({e})",
                    fix="define the names it uses at module level, or drop "
                    "`from __future__ import annotations` from the model's module",
                ) from None
        hints[name] = hint
    return hints


def read_declarations(
    cls: type, decl: Dims, fields: dict[str, FieldSpec], statics: dict[str, Any]
) -> tuple[dict[str, FieldSpec], dict[str, Any]]:
    """The field table and static fields of a model class: its bases' (`fields`, `statics`) and
    its own declarations, each checked against `decl`, its dims.

    Raises:
        FieldDeclarationError: (E0905) naming the field and what is wrong with it.
    """
    fields, statics = dict(fields), dict(statics)
    for name, hint in _annotations_of(cls).items():
        value = cls.__dict__.get(name, dataclasses.MISSING)
        spec = spec_of(value) if isinstance(value, dataclasses.Field) else None
        if spec is None:
            if isinstance(value, dataclasses.Field) and value.metadata.get("static"):
                # static configuration: `sm.static()` or `eqx.field(static=True, ...)`
                statics[name] = value.default
                continue
            if typing.get_origin(hint) is ClassVar:
                continue
            raise FieldDeclarationError(
                f"`{cls.__name__}.{name}` has no declaration",
                fix=f"write `{name}: ... = sm.param(init)`, `sm.buffer(init)`, "
                "`sm.submodel(Cls)` or `sm.submodels(Cls, count)`",
            )
        fields[name] = complete_spec(cls.__name__, name, spec, hint, decl)
    _check_when(cls.__name__, fields, statics)
    return fields, statics


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
        if spec.count is not None:
            _check_names(owner, name, str(spec.count), dims)
        for n in sorted(reads(spec.mapped)):
            _check_names(owner, name, n, dims)
        return spec
    hint, optional = _unwrap_optional(hint)
    if optional and not spec.optional:
        raise FieldDeclarationError(
            f"{where} is annotated `{_hint_text(hint, True)}` but its declaration does not say "
            "when it is present",
            fix=f'declare it with when=: e.g. sm.{spec.kind}(..., when="bias"), "bias" a bool '
            f"static field; or drop `| None` if `{name}` is always present",
        )
    if spec.optional and not optional:
        raise FieldDeclarationError(
            f"{where} is declared with when={dict(spec.when)!r} but annotated "
            f"`{_hint_text(hint, False)}`, which does not allow None",
            fix=f"annotate it `{name}: {_hint_text(hint, True)}`",
        )
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


def _unwrap_optional(hint: Any) -> tuple[Any, bool]:
    """`(X, True)` for an annotation `X | None`, else `(hint, False)`."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            return rest[0], True
    return hint, False


def _hint_text(hint: Any, optional: bool) -> str:
    text = getattr(hint, "__name__", None) or str(hint)
    dim_str = getattr(hint, "dim_str", None)
    if dim_str is not None and "[" not in text:
        text = f'{text}[Array, "{dim_str}"]'
    return text + (" | None" if optional else "")


def _check_when(owner: str, fields: Mapping[str, FieldSpec], statics: Mapping[str, Any]) -> None:
    """Every `when=` (and `stacked=` switch) names static fields of the model (E0905 otherwise)."""
    for name, spec in fields.items():
        if isinstance(spec.stacked, str) and spec.stacked not in statics:
            raise FieldDeclarationError(
                f"`{owner}.{name}` is stacked when `{spec.stacked}` is set, but `{owner}` has no "
                f"static field `{spec.stacked}` (static fields: {', '.join(statics) or 'none'})",
                fix=similar(spec.stacked, statics, what="static field")
                or f"declare it: `{spec.stacked}: bool = sm.static(default=True)`",
            )
        for k, _ in spec.when:
            if k not in statics:
                raise FieldDeclarationError(
                    f"`{owner}.{name}` is present when `{k}` is set, but `{owner}` has no static "
                    f"field `{k}` (static fields: {', '.join(statics) or 'none'})",
                    fix=similar(k, statics, what="static field")
                    or f"declare it: `{k}: bool = sm.static(default=True)`",
                )


def _check_names(owner: str, name: str, expr: str, dims: Dims) -> None:
    for n in names_in(expr, f"`{owner}.{name}`"):
        if n not in dims:
            raise FieldDeclarationError(
                f"`{owner}.{name}` uses the dim `{n}`, which `{owner}` does not declare "
                f"(dims: {', '.join(dims) or 'none'})",
                fix=similar(n, dims, what="dim") or f"add `{n}=...` to `{owner}`'s sm.Dims",
            )
