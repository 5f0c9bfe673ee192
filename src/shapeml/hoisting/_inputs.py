"""Explaining a hoisted call whose inputs `f` cannot be traced for (E1509): which input, the shape
it was given, and the shape earlier calls with the same weights were traced for.

Nothing here runs per call: it is reached only when tracing a new signature fails, so the fast
path (a program already traced for these shapes) is untouched.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax

from ._errors import HoistInputError
from ._static import Static

__all__ = ["Traced", "input_error"]


class Traced(NamedTuple):
    """A call `f` was traced for (or refused), as an explanation needs it: the weights' shapes and
    static part, the structure of the other arguments `(rest, kwargs)`, and each of their leaves
    (a `jax.ShapeDtypeStruct` for an array, else its value)."""

    weights: tuple
    inputs: Any
    leaves: tuple

    @classmethod
    def of(cls, weights: tuple[Sequence, Static], inputs: tuple[Sequence, Static]) -> Traced:
        (arrays, (treedef, statics)), it = inputs, iter(inputs[0])
        leaves = arrays if statics is None else [next(it) if s is None else s for s in statics]
        return cls((tuple(weights[0]), weights[1]), treedef, tuple(leaves))


def _parameter_names(f: Callable) -> tuple[list[str], str | None]:
    try:
        params = inspect.signature(f).parameters.values()
    except (TypeError, ValueError):  # a builtin or a callable without a signature
        return [], None
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    star = next((p.name for p in params if p.kind is p.VAR_POSITIONAL), None)
    return positional, star


def _leaf_names(f: Callable, argnums: Sequence[int], call: Traced) -> list[str]:
    """A name per leaf of the inputs `(positional inputs, kwargs)`: the parameter's name, then the
    path inside it (`batch['x']`), in flattening order."""
    positional, star = _parameter_names(f)
    n_args = len(call.inputs.children()[0].children()) + len(argnums)
    rest = [i for i in range(n_args) if i not in argnums]
    names = []
    paths = jax.tree_util.tree_flatten_with_path(jax.tree.unflatten(call.inputs, call.leaves))[0]
    for path, _ in paths:
        if getattr(path[0], "idx", None) == 0:  # a positional input
            pos = rest[path[1].idx]
            if pos < len(positional):
                base = positional[pos]
            elif star is not None:
                base = f"{star}[{pos - len(positional)}]"
            else:
                base = f"argument {pos}"
        else:
            base = str(getattr(path[1], "key", path[1]))
        names.append(f"`{base}{jax.tree_util.keystr(tuple(path[2:]))}`")
    return names


def _dtype(k: jax.ShapeDtypeStruct) -> str:
    return getattr(k.dtype, "name", str(k.dtype))  # numpy dtypes and PRNG key dtypes alike


def _aval(k: jax.ShapeDtypeStruct) -> str:
    return f"{_dtype(k)}[{','.join(map(str, k.shape))}]"


def _expected(seen: list[jax.ShapeDtypeStruct]) -> str | None:
    """The shape every earlier call agreed on, with `*` where they differed; None when their
    ranks differ (nothing to compare an axis with)."""
    if len({len(k.shape) for k in seen}) != 1:
        return None
    dtypes = {_dtype(k) for k in seen}
    axes = [
        str(sizes.pop()) if len(sizes := {k.shape[i] for k in seen}) == 1 else "*"
        for i in range(len(seen[0].shape))
    ]
    return f"{dtypes.pop() if len(dtypes) == 1 else '*'}[{','.join(axes)}]"


def _fits(k: jax.ShapeDtypeStruct, expected: str | None) -> bool:
    if expected is None:
        return True
    dtype, axes = expected[:-1].split("[")
    sizes = axes.split(",") if axes else []
    return (
        dtype in ("*", _dtype(k))
        and len(sizes) == len(k.shape)
        and all(s == "*" or int(s) == n for s, n in zip(sizes, k.shape, strict=True))
    )


def _weights_dims(weights: Any) -> str:
    dims = getattr(weights, "dims", None)
    if dims is None or not hasattr(dims, "values"):
        return ""
    try:
        return f" (the weights' dims: {', '.join(f'{k}={v}' for k, v in dims.items())})"
    except Exception:  # a `dims` attribute of some other kind: leave it out
        return ""


def input_error(
    f: Callable,
    argnums: Sequence[int],
    call: Traced,
    traced: Sequence[Traced],
    weights: Any,
    failure: Exception,
) -> HoistInputError:
    """The coded error for a call whose inputs `f` could not be traced for.

    Args:
        f: the hoisted function.
        argnums: the positions of its weights.
        call: the failed call.
        traced: the calls traced successfully before.
        weights: the call's weights (for their `dims`, when they are a model).
        failure: JAX's refusal (a plain `TypeError` or `ValueError`).
    """
    fname = getattr(f, "__name__", "f")
    names = _leaf_names(f, argnums, call)
    leaves = call.leaves
    text = str(failure).strip()
    reason = text.splitlines()[0][:300] if text else type(failure).__name__
    arrays = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.ShapeDtypeStruct)]
    same = [
        k
        for k in traced
        if k.weights == call.weights
        and k.inputs == call.inputs
        and all(isinstance(k.leaves[i], jax.ShapeDtypeStruct) for i in arrays)
    ]
    if not same:
        given = ", ".join(f"{names[i]}: {_aval(leaves[i])}" for i in arrays) or "no arrays"
        return HoistInputError(
            f"`{fname}` cannot be traced for these inputs ({given}) with these weights"
            f"{_weights_dims(weights)}; JAX: {reason}",
            fix=f"pass inputs whose shapes fit the weights (JAX's reason names the sizes that "
            f"disagree), or annotate `{fname}` with shapes (`@sm.shaped`) to have the dim named",
        )
    expected = {i: _expected([k.leaves[i] for k in same]) for i in arrays}
    bad = [i for i in arrays if not _fits(leaves[i], expected[i])]
    shown = bad or arrays  # nothing stands out (inputs that must agree with each other): all
    parts = [
        f"{names[i]} is {_aval(leaves[i])}" + (f", traced for {expected[i]}" if expected[i] else "")
        for i in shown
    ]
    first = shown[0]
    return HoistInputError(
        f"`{fname}` cannot be traced for these inputs: {'; '.join(parts)} (traced before for "
        f"{len(same)} input shape(s) with these weights; `*` marks an axis that changed between "
        f"them); JAX: {reason}",
        fix=f"pass {names[first]} with the shape {fname} was traced for"
        + (f", {expected[first]}" if expected[first] else "")
        + " (an axis shown as * may change)",
    )
