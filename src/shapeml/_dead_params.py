"""Dead-param analysis: which params can a loss's value depend on?

The loss is traced once as a JVP on abstract inputs; dead-code elimination of that program, from
the tangent output back to the tangent inputs, says which params' tangents reach the value. A
param read only through `stop_gradient` has a zero tangent, so it counts as never read. JAX's DCE
follows nested jaxprs (pjit, scan, cond, while, custom_jvp/vjp) and keeps every input of a
primitive it cannot see into, so the analysis errs towards "read": it never warns falsely.

Each param is named by its path in the params pytree (`blocks.0.w1`, as `sm.params(m)` names it).
An analysis depends only on the `Signature` of the params, the model's other leaves and the loss's
arguments, so it is cached per loss function in a `CompileCache` keyed by that signature.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

from . import _jax_internals as jxi
from ._compile_cache import CompileCache, Signature, UnhashableStaticError, is_array
from ._errors import ShapemlError, ShapemlWarning
from .models._introspect import dotted_name

__all__ = ["DeadParamWarning", "LossShapeError", "NoParamsReadError", "check_reads"]


class DeadParamWarning(
    ShapemlWarning,
    code="W1101",
    title="param never read by the loss",
    explanation="""
`value_and_grad(loss, m, ...)` found a param that the loss never reads (or reads only through
`stop_gradient`), so its gradient is always zero and training never changes it. This is often a
forgotten layer: a forward that mixes channels but forgets to mix tokens leaves `tw1` and `tw2`
unread.

Use the param in the forward, remove it, or declare it with `sm.buffer` if it is not meant to be
trained. To silence the warning deliberately:
`warnings.filterwarnings("ignore", category=sm.DeadParamWarning)`.
""",
):
    pass


class NoParamsReadError(
    ShapemlError,
    ValueError,
    code="E1101",
    title="loss reads no param",
    explanation="""
`value_and_grad(loss, m, ...)` found that the loss does not depend on any param of the model, so
every gradient would be zero. Check that the loss calls the model's forward with the model it was
given (not a model captured from an outer scope), and that its value is not cut off from the params
by `stop_gradient`.
""",
):
    pass


class LossShapeError(
    ShapemlError,
    TypeError,
    code="E1106",
    title="loss is not a scalar",
    explanation="""
`value_and_grad(loss, m, ...)` differentiates a floating-point scalar: the loss returned an array
with a shape, an integer or complex value, or something that is not an array (None, a string).
Reduce it to one floating number (`jnp.mean(...)` over the batch), or return `(scalar, aux)` with
`has_aux=True` to carry other values along (and only then).
""",
):
    pass


# Per loss function (weakly held: a lambda and what it captures are not kept alive), the analyses
# of the signatures seen so far.
_CACHE: weakref.WeakKeyDictionary[Callable, CompileCache[Reads]] = weakref.WeakKeyDictionary()
_PER_FUNCTION = 64


class Reads(NamedTuple):
    """The outcome of one analysis: every param's dotted name, and those the loss never reads."""

    names: tuple[str, ...]
    unread: tuple[str, ...]


class _Key(NamedTuple):
    """What an analysis depends on: `(params, rest, args, kwargs)`'s signature, and `has_aux`."""

    trees: Signature
    has_aux: bool


def check_reads(f: Callable, params, m, args, kwargs, has_aux: bool):
    """Warns W1101 for each unread param and raises E1101 when none is read.

    Args:
        f: the loss, `f(m, *args, **kwargs)`; its analyses are cached per `f`.
        params: `m` with every leaf that is not a param replaced by None.
        m: the model.
        args, kwargs: the loss's other arguments (arrays are traced, other leaves static).
        has_aux: whether `f` returns `(value, aux)`.

    Arguments whose non-array leaves are unhashable cannot be keyed, so such a loss is analysed
    on every trace instead of once per signature.
    """
    is_param = jax.tree.map(lambda p: p is not None, params, is_leaf=lambda p: p is None)
    rest = eqx.filter(m, is_param, inverse=True)
    trees = (params, rest, args, kwargs)
    cache = _cache_for(f)
    try:
        sig = Signature.of(trees)[0]
    except UnhashableStaticError:
        sig = None
    if cache is None or sig is None:
        reads = _unread(f, trees, has_aux)
    else:
        reads = cache.get(_Key(sig, has_aux))
    _report(reads, getattr(f, "__qualname__", repr(f)), type(m).__name__)


def _cache_for(f: Callable) -> CompileCache[Reads] | None:
    """`f`'s analyses; None when `f` cannot be weakly referenced (then every trace analyses)."""
    try:
        cache = _CACHE.get(f)
        if cache is None:
            ref = weakref.ref(f)  # the cache must not keep `f` (its key) alive

            def analyse(key: _Key) -> Reads:
                return _unread(ref(), key.trees.abstract(), key.has_aux)

            cache = _CACHE[f] = CompileCache(analyse, maxsize=_PER_FUNCTION)
    except TypeError:  # not weakly referenceable or not hashable
        return None
    return cache


def _report(reads: Reads, loss_name: str, model_name: str) -> None:
    if reads.names and len(reads.unread) == len(reads.names):
        raise NoParamsReadError(
            f"`{loss_name}` reads none of `{model_name}`'s params ({', '.join(reads.names)}), so "
            "every gradient would be zero",
            fix="make the loss compute its value from the model it is given",
        )
    for name in reads.unread:
        warnings.warn(
            DeadParamWarning(
                f"`{loss_name}` never reads the param `{name}` of `{model_name}`, so its "
                "gradient is always zero",
                fix="use it in the forward, remove it, or make it an sm.buffer if it isn't trained",
            ),
            stacklevel=5,
        )


def _scalar(out, has_aux: bool):
    """The loss's value out of what it returned, E1106 unless it is a floating scalar."""
    if has_aux:
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            what = "an array" if hasattr(out, "shape") else type(out).__name__
            raise LossShapeError(
                f"with has_aux=True the loss must return (value, aux), got {what}",
                fix="return (loss, aux), or call without has_aux=True",
            )
        out = out[0]
    if isinstance(out, (int, float)) and not isinstance(out, bool):
        out = jnp.asarray(out)
    if not (hasattr(out, "shape") and hasattr(out, "dtype")):
        raise LossShapeError(
            f"the loss returns a {type(out).__name__}, not an array",
            fix="return the loss as a JAX scalar, e.g. jnp.mean(per_example_losses)",
        )
    if not jnp.issubdtype(out.dtype, jnp.floating):
        raise LossShapeError(
            f"the loss returns dtype {out.dtype}; value_and_grad needs a floating scalar",
            fix="compute the loss in floating point (e.g. .astype(jnp.float32))",
        )
    return out


def _unread(f: Callable, trees, has_aux: bool) -> Reads:
    """Traces the loss's tangent on abstract values and reads, per param, whether DCE keeps it.

    `trees` is `(params, rest, args, kwargs)`; its array leaves may be concrete, traced or
    `jax.ShapeDtypeStruct`s (only their shapes and dtypes are used).
    """
    params, *others = trees
    named = jax.tree_util.tree_flatten_with_path(params)[0]
    dynamic, static = eqx.partition(others, is_array)

    def tangent_of_loss(p, t, dyn):
        rest, args, kwargs = eqx.combine(dyn, static)

        def value(p):
            return _scalar(f(eqx.combine(p, rest), *args, **kwargs), has_aux)

        return jax.jvp(value, (p,), (t,))[1]

    def abstract(tree):
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(
                x.shape, x.dtype, weak_type=bool(getattr(x, "weak_type", False))
            ),
            tree,
        )

    closed = jxi.make_closed_jaxpr(
        tangent_of_loss, abstract(params), abstract(params), abstract(dynamic)
    )
    out_shape = closed.out_avals[0].shape
    if out_shape != ():
        raise LossShapeError(
            f"the loss returns an array of shape {out_shape}; value_and_grad needs a scalar",
            fix="reduce it, e.g. return jnp.mean(per_example_losses)",
        )
    # The traced inputs are the params' leaves, then their tangents (same flattening, so the
    # i-th tangent is the i-th named param), then the other array leaves.
    n = len(named)
    tangent_used = jxi.used_inputs(closed)[n : 2 * n]
    names = tuple(dotted_name(path) for path, _ in named)
    return Reads(names, tuple(name for name, used in zip(names, tangent_used) if not used))
