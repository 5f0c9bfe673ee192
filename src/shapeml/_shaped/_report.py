"""What `@sm.shaped` says when a check fails: which argument, its shape and dtype, the annotation
and the values its dims had, e.g. `x: float32[8 31] where float[b D] with D=32 was expected`.

Never an array's values: a value is described by its dtype and shape, or its type. The functions
that run inside a check are `@typing.no_type_check`: jaxtyping's import hook (pytest
`--jaxtyping-packages`) would give each its own memo of dims, hiding the dims bound so far.
"""

from __future__ import annotations

import re
import types
import typing
from typing import Any, Union

from jaxtyping import jaxtyped

from .._validate import shorten

__all__ = [
    "clash",
    "describe",
    "expected",
    "first_mismatch",
    "named_in_violation",
    "return_mismatch",
    "signature_text",
]

_NAME = re.compile(r"[A-Za-z_]\w*")


def describe(value: Any) -> str:
    """A value as the message shows it: `float32[8 31]` for an array, `tuple(float32[3], int)`
    for a short tuple or list, else its type's name."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if isinstance(shape, tuple) and dtype is not None:
        return f"{getattr(dtype, 'name', dtype)}[{' '.join(map(str, shape))}]"
    if value is None:
        return "None"
    if isinstance(value, (tuple, list)) and len(value) <= 8:
        return f"{type(value).__name__}({', '.join(describe(v) for v in value)})"
    return type(value).__name__


def _array_hints(hint: Any) -> list[Any]:
    """The jaxtyping array types `hint` is made of (one, or each of a union's)."""
    if isinstance(hint, type) and isinstance(getattr(hint, "dim_str", None), str):
        return [hint]
    if typing.get_origin(hint) in (Union, types.UnionType):
        return [h for a in typing.get_args(hint) for h in _array_hints(a)]
    return []


def _nested_arrays(hint: Any) -> list[Any]:
    """Every jaxtyping array type inside `hint` (in unions, tuples, lists, ...)."""
    if isinstance(hint, type) and isinstance(getattr(hint, "dim_str", None), str):
        return [hint]
    return [h for a in typing.get_args(hint) for h in _nested_arrays(a)]


@typing.no_type_check
def _bindings() -> tuple[dict[str, int], dict[str, tuple]]:
    """The dim values jaxtyping has bound so far in the current check (empty if unknown)."""
    try:
        from jaxtyping._storage import get_shape_memo

        single, variadic, *_ = get_shape_memo()
        return dict(single), {k: v[1] for k, v in variadic.items()}
    except Exception:  # jaxtyping keeps its bindings privately: the message goes without them
        return {}, {}


def annotation(hint: Any) -> str:
    """An annotation as messages show it: `float[b D]` for a jaxtyping array (or a union of
    them, as `@sm.shaped` widens it), `tuple[float[b], float[b]]`, `Spotter` for a class."""
    arrays = _array_hints(hint)
    if arrays and (len(arrays) == len(typing.get_args(hint)) or not typing.get_args(hint)):
        dtype = arrays[0].dtype.__name__
        return f"{'' if dtype == 'Shaped' else dtype.lower()}[{arrays[0].dim_str}]"
    if hint is None or hint is type(None):
        return "None"
    if hint is Ellipsis:
        return "..."
    args, origin = typing.get_args(hint), typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return " | ".join(dict.fromkeys(annotation(a) for a in args))
    if args and isinstance(origin, type):
        return f"{origin.__name__}[{', '.join(annotation(a) for a in args)}]"
    return hint if isinstance(hint, str) else getattr(hint, "__name__", None) or shorten(hint)


class _Shown:
    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def signature_text(sig) -> str:
    """`sig` as messages show it: `(m: Spotter, img: uint8[b 1 S S]) -> float[b C]`."""
    short = (str, int, float, bool, type(None))

    def param(p):
        default = p.default
        if default is not p.empty:
            default = _Shown(repr(default) if isinstance(default, short) else describe(default))
        shown = p.empty if p.annotation is p.empty else _Shown(annotation(p.annotation))
        return p.replace(annotation=shown, default=default)

    ret = sig.return_annotation
    return str(
        sig.replace(
            parameters=[param(p) for p in sig.parameters.values()],
            return_annotation=sig.empty if ret is sig.empty else _Shown(annotation(ret)),
        )
    )


@typing.no_type_check
def expected(hint: Any) -> str:
    """The annotation as the message shows it, with the values its dims are bound to now:
    `float[b D] with D=32`, or a type's name for other hints."""
    dim_strs = [a.dim_str for a in _nested_arrays(hint)]
    text = annotation(hint)
    if not dim_strs:
        return text
    single, variadic = _bindings()
    names = dict.fromkeys(_NAME.findall(" ".join(dim_strs).replace("...", " ")))
    bound = [f"{n}={single[n]}" for n in names if n in single and not n.startswith("~")]
    bound += [f"*{n}={list(variadic[n])}" for n in names if n in variadic]
    return text + (f" with {', '.join(bound)}" if bound else "")


def _pairs(shape: tuple, hint: Any) -> list[tuple[Any, int]]:
    """(dim of the annotation, size in `shape`) for each dim outside a variadic one."""
    dims, i = hint.dims, hint.index_variadic
    if i is None:
        return list(zip(dims, shape)) if len(shape) == len(dims) else []
    if len(shape) < len(dims) - 1:
        return []
    after = len(dims) - i - 1
    return list(zip(dims[:i], shape[:i])) + list(zip(dims[i + 1 :], shape[len(shape) - after :]))


@typing.no_type_check
def clash(value: Any, hint: Any) -> str | None:
    """The first named dim whose size in `value` differs from its bound value: `dimension D is
    7`, or None."""
    arrays, shape = _array_hints(hint), getattr(value, "shape", None)
    if not arrays or not isinstance(shape, tuple):
        return None
    single, _ = _bindings()
    for dim, size in _pairs(shape, arrays[0]):
        name = getattr(dim, "name", None)
        broadcast = getattr(dim, "broadcastable", False) and size == 1
        if isinstance(name, str) and name in single and single[name] != size and not broadcast:
            return f"dimension {name} is {size}"
    return None


@typing.no_type_check
def _ok(value: Any, hint: Any) -> bool:
    from beartype.door import is_bearable

    try:
        return is_bearable(value, hint)
    except Exception:  # a hint beartype cannot check alone (a forward reference): not the culprit
        return True


def _items(sig, bound: dict[str, Any]):
    """(name, value) for each argument as checked: `*args` and `**kwargs` item by item."""
    for name, value in bound.items():
        kind = sig.parameters[name].kind
        if kind is kind.VAR_POSITIONAL:
            yield from ((f"{name}[{i}]", v, name) for i, v in enumerate(value))
        elif kind is kind.VAR_KEYWORD:
            yield from ((f"{name}[{k!r}]", v, name) for k, v in value.items())
        else:
            yield name, value, name


@typing.no_type_check
def first_mismatch(sig, bound: dict, hints: dict, shown: dict, bind_models) -> str | None:
    """The first argument that does not fit its annotation, checked in order as beartype does
    (dims bound by the ones before it): `x: float32[8 31] where float[b D] with D=32 was
    expected`, or None if every argument fits. `hints` are checked, `shown` (as written) shown."""
    with jaxtyped("context"):
        bind_models()
        for label, value, name in _items(sig, bound):
            if name not in hints:
                continue
            text = expected(shown.get(name, hints[name]))  # the dims bound before this argument
            why = clash(value, hints[name])
            if not _ok(value, hints[name]):
                return f"{label}: {describe(value)} where {text} was expected" + (
                    f" ({why})" if why else ""
                )
    return None


@typing.no_type_check
def return_mismatch(value: Any, hint: Any, shown: Any) -> str | None:
    """The return value against its annotation, in the current check (dims bound by the
    arguments): `returned float32[8 5] where float[b C] with b=8, C=4 was expected`, or None."""
    if _ok(value, hint):
        return None
    why = clash(value, hint)
    return f"returned {describe(value)} where {expected(shown)} was expected" + (
        f" ({why})" if why else ""
    )


def named_in_violation(text: str, fn: Any, bound: dict, shown: dict) -> str | None:
    """When `first_mismatch` cannot tell (an annotation it cannot check alone), the argument of
    `fn` that beartype's message `text` names, as `x: float32[3] where float[b] was expected`;
    None when the message is about another function (a check inside `fn`)."""
    qual = re.escape(f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}()")
    m = re.search(rf"{qual} parameter (\w+)=", text)
    if m is None or m.group(1) not in bound:
        return None
    name = m.group(1)
    return f"{name}: {describe(bound[name])} where {annotation(shown.get(name))} was expected"
