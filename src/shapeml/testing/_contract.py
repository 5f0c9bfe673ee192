"""`check_contract`: traces a function on abstract inputs built from its annotations.

The function runs under `jax.eval_shape`, so no numbers are computed: its `@sm.shaped` checks see
tracers whose shapes follow the annotations, with the model's dims and each listed size bound.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from .._errors import ArgumentTypeError, ShapemlError
from .._shaped import ShapeCheckError, shaped
from .._traceback import api_boundary
from .._validate import instance, integer, shorten
from ..models import Model

__all__ = ["ContractError", "check_contract"]


class ContractError(
    ShapemlError,
    AssertionError,
    code="E1002",
    title="shape contract broken",
    explanation="""
`shapeml.testing.check_contract` traced a function on abstract inputs built from its annotations
(the model's dims bound, each listed size tried in turn) and its shapes did not hold: an argument
built from the annotation was rejected by the function's body or its return annotation.

The message names the sizes tried (e.g. `b=3`) and the dim that broke. Fix the function or its
annotation; the check runs under `jax.eval_shape`, so it costs no compute.
""",
):
    pass


# pytest's report names a failed test's exception by its module: the public one users import.
ContractError.__module__ = "shapeml.testing"


def _abstract_model(m: Model | type[Model], dims: Mapping[str, int]) -> Model:
    """The shapes of model `m` (a class: of `Cls.init()`) at `dims`: each of its free dims that
    `dims` names is set, its derived dims follow (and must agree with `dims`), its options kept."""
    cls = m if isinstance(m, type) else type(m)
    own = {k: v for k, v in dims.items() if k in cls.dims.free}
    if isinstance(m, type) or any(m.dims[k] != v for k, v in own.items()):
        options = {} if isinstance(m, type) else {k: getattr(m, k) for k in cls.__shapeml_statics__}
        if not isinstance(m, type):
            own = {**{k: m.dims[k] for k in cls.dims.free}, **own}
        m = jax.eval_shape(lambda: cls.init(seed=0, **options, **own))
    else:
        m = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), m)
    clash = {k: v for k, v in dims.items() if k in m.dims and m.dims[k] != v}
    if clash:
        derived = cls.dims.derived
        raise ContractError(
            f"dims={dict(clash)} cannot hold for `{cls.__name__}`: "
            + ", ".join(f"{k} = {derived.get(k, k)} = {m.dims[k]}" for k in clash),
            fix="set the free dims a derived dim follows from: "
            + ", ".join(f"{k}={m.dims[k]}" for k in cls.dims.free),
        )
    return m


def _stand_in(name: str, hint: Any, bindings: Mapping[str, Any]) -> jax.ShapeDtypeStruct:
    dim_str = getattr(hint, "dim_str", None)
    if dim_str is None:
        raise ArgumentTypeError(
            f"cannot build argument `{name}`: its annotation {hint!r} is not a "
            "jaxtyping array type; pass the argument explicitly"
        )
    shape = []
    for tok in dim_str.split():
        tok = tok.lstrip("#")
        if tok.isdigit():
            shape.append(int(tok))
        elif tok in bindings:
            shape.append(bindings[tok])
        else:
            try:
                shape.append(eval(tok, {"__builtins__": {}}, dict(bindings)))  # noqa: S307 - dim expr
            except NameError:
                raise ContractError(
                    f"argument `{name}` has shape `{dim_str}`, and no size is given for `{tok}`",
                    fix=f"pass sizes={{'{tok}': [...]}} or dims={{'{tok}': n}}",
                ) from None
            except Exception as e:  # a token that is no expression of sizes (`a-`, `b/0`)
                raise ContractError(
                    f"argument `{name}` has shape `{dim_str}`; `{tok}` cannot be computed from "
                    f"the sizes ({type(e).__name__}: {e})",
                    fix="write its annotation's shape with dims, sizes and + - * //",
                ) from None
    dtypes = getattr(hint, "dtypes", None)
    if isinstance(dtypes, (list, tuple)):
        dtype = next((d for d in ("float32", "int32", "uint8", "bool") if d in dtypes), dtypes[-1])
    else:
        dtype = "float32"
    return jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype))


def _where(combo: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in combo.items())


def _checked_sizes(sizes: Any) -> dict[str, list[int | str]]:
    if sizes is None:
        return {"b": [1, 3]}
    instance("sizes", sizes, Mapping, "a mapping of dim name to sizes, e.g. {'b': [1, 7]}")
    out = {}
    for name, values in sizes.items():
        if not isinstance(name, str) or not isinstance(values, (list, tuple)) or not values:
            raise ArgumentTypeError(
                f"sizes[{shorten(name)}] is {shorten(values)}, not a non-empty list of sizes",
                fix="pass sizes={'b': [1, 7, 'b']}: whole numbers >= 0, or a name for symbolic",
            )
        out[name] = [
            v if isinstance(v, str) and v.isidentifier() else integer(f"sizes[{name!r}]", v, low=0)
            for v in values
        ]
    return out


def _checked_dims(dims: Any) -> dict[str, int]:
    if dims is None:
        return {}
    instance("dims", dims, Mapping, "a mapping of dim name to size, e.g. {'S': 16}")
    return {str(k): integer(f"dims[{k!r}]", v, low=0) for k, v in dims.items()}


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def check_contract(
    fn: Callable,
    *args: Any,
    sizes: Mapping[str, Sequence[int | str]] | None = None,
    dims: Mapping[str, int] | None = None,
) -> list[dict[str, Any]]:
    """Checks that `fn`'s annotated shapes hold for every listed size, without computing.

    Arguments given in `args` are used as they are, except models: a model class stands for
    `Cls.init()`'s shapes, and a model class or instance is resized to `dims` (each of its free
    dims that `dims` names is set, its derived dims follow, its options are kept). Every remaining
    parameter annotated with a jaxtyping array type is built from its annotation, with the
    models' dims, `dims`, and one value of each entry of `sizes` bound. A size given as a string
    (`"b"`) is symbolic: the contract must hold for every value of it.

    Args:
        fn: the function (`@sm.shaped` or not: it is checked as if it were).
        *args: its first arguments; the rest are built from their annotations.
        sizes: the values to try for each dim no model declares (default `{"b": [1, 3]}`).
        dims: a size for named dims: of the models (`{"D": 64}` checks them at D=64) and of
            the built arguments.

    Example:
        >>> check_contract(spotter.forward, Spotter, sizes={"b": [1, 7, "b"]})
        >>> check_contract(spotter.forward, Spotter, dims={"D": 64})  # the model at D=64

    Returns:
        One record per size combination: the sizes and the output's shapes.

    Raises:
        ContractError: (E1002) naming the sizes tried and the dim that broke, or a `dims` entry
            that contradicts a model's derived dim.
        ArgumentTypeError: (E0003), ArgumentError: (E0002) for a size that is no whole number
            >= 0.
    """
    sizes, dims = _checked_sizes(sizes), _checked_dims(dims)
    if not callable(fn):
        raise ArgumentTypeError(
            f"check_contract(fn, ...) takes a function, got {shorten(fn)} ({type(fn).__name__})",
            fix="pass the function whose annotations to check",
        )
    try:
        sig = inspect.signature(fn)
        hints = typing.get_type_hints(inspect.unwrap(fn))
    except Exception as e:  # unresolvable string annotations, a builtin without a signature
        raise ContractError(
            f"cannot read the annotations of `{getattr(fn, '__qualname__', shorten(fn))}`: "
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
            fix="define the names its annotations use at module level",
        ) from None
    params = list(sig.parameters)
    given = [
        _abstract_model(a, dims)
        if isinstance(a, Model) or (isinstance(a, type) and issubclass(a, Model))
        else a
        for a in args
    ]
    model_dims: dict[str, int] = {}
    for a in given:
        if isinstance(a, Model):
            model_dims.update(a.dims)
    checked = fn if getattr(fn, "__shaped__", False) else shaped(fn)
    names = list(sizes)
    combos = [{}]
    for n in names:
        combos = [{**c, n: v} for c in combos for v in sizes[n]]
    records = []
    for combo in combos:
        bindings = {**model_dims, **dims}
        for n, v in combo.items():
            bindings[n] = jax.export.symbolic_shape(v)[0] if isinstance(v, str) else v
        built = [_stand_in(p, hints.get(p), bindings) for p in params[len(given) :]]
        try:
            out = jax.eval_shape(checked, *given, *built)
        except ShapeCheckError as e:
            raise ContractError(
                f"the shape contract of `{fn.__qualname__}` breaks at {_where(combo)}:\n{e.message}",
                fix="fix the function or its annotation",
            ) from e
        except (TypeError, ValueError) as e:  # the body itself failed on these shapes
            raise ContractError(
                f"`{fn.__qualname__}` fails at {_where(combo)} on inputs shaped as its annotations "
                f"say: {type(e).__name__}: {str(e).splitlines()[0]}",
                fix="fix the function's body or its annotation",
            ) from e
        records.append({"sizes": combo, "out": jax.tree.map(lambda s: tuple(s.shape), out)})
    return records
