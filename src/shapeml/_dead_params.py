"""Dead-param analysis: which params can a loss's value depend on?

The loss is traced once as a JVP on abstract inputs; dead-code elimination of that program, from
the tangent output back to the tangent inputs, says which params' tangents reach the value. A
param read only through `stop_gradient` has a zero tangent, so it counts as never read. JAX's DCE
follows nested jaxprs (pjit, scan, cond, while, custom_jvp/vjp) and keeps every input of a
primitive it cannot see into, so the analysis errs towards "read": it never warns falsely.
"""

from __future__ import annotations

import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable

import equinox as eqx
import jax

from . import _jax_internals as jxi
from ._errors import ShapemlError, ShapemlWarning

__all__ = ["DeadParamWarning", "NoParamsReadError", "check_reads"]


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


# Per loss function (weakly held: a lambda and what it captures are not kept alive), the analyses
# of the signatures seen so far.
class LossShapeError(
    ShapemlError,
    TypeError,
    code="E1106",
    title="loss is not a scalar",
    explanation="""
`value_and_grad(loss, m, ...)` differentiates a scalar: the loss returned an array with a shape.
Reduce it to one number (`jnp.mean(...)` over the batch), or return `(scalar, aux)` with
`has_aux=True` to carry other values along.
""",
):
    pass


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_PER_FUNCTION = 64


def _abstract(x):
    if eqx.is_array(x):
        return jax.ShapeDtypeStruct(x.shape, x.dtype)
    return x


def check_reads(f: Callable, loss_of_params: Callable, params, m, args, kwargs, has_aux: bool):
    """Warns W1101 for each unread param and raises E1101 when none is read (cached per signature)."""
    names = _param_names(m)
    dynamic, static = eqx.partition((args, kwargs), eqx.is_array)
    leaves, treedef = jax.tree.flatten((params, dynamic))
    key = (treedef, tuple((x.shape, str(x.dtype)) for x in leaves), _static_key(static))
    try:
        seen = _CACHE.setdefault(f, OrderedDict())
    except TypeError:  # not weakly referenceable (e.g. a functools.partial): analyse every trace
        seen = OrderedDict()
    if key in seen:
        seen.move_to_end(key)
        unread = seen[key]
    else:
        unread = _unread(loss_of_params, params, dynamic, static, has_aux, names)
        seen[key] = unread
        if len(seen) > _PER_FUNCTION:
            seen.popitem(last=False)
    loss_name = getattr(f, "__qualname__", repr(f))
    model_name = type(m).__name__
    if names and len(unread) == len(names):
        raise NoParamsReadError(
            f"`{loss_name}` reads none of `{model_name}`'s params ({', '.join(names)}), so every "
            "gradient would be zero",
            fix="make the loss compute its value from the model it is given",
        )
    for name in unread:
        warnings.warn(
            DeadParamWarning(
                f"`{loss_name}` never reads the param `{name}` of `{model_name}`, so its "
                "gradient is always zero",
                fix="use it in the forward, remove it, or make it an sm.buffer if it isn't trained",
            ),
            stacklevel=4,
        )


def _static_key(static):
    leaves, treedef = jax.tree.flatten(static)
    keys = []
    for leaf in leaves:
        try:
            hash(leaf)
            keys.append(leaf)
        except TypeError:
            keys.append(id(leaf))
    return treedef, tuple(keys)


def _param_names(m) -> list[str]:
    from .models._introspect import params

    return list(params(m))


def _unread(loss_of_params, params, dynamic, static, has_aux, names) -> list[str]:
    def tangent_of_loss(p, t, dyn):
        a, kw = eqx.combine(dyn, static)

        def value(p):
            out = loss_of_params(p, *a, **kw)
            return out[0] if has_aux else out

        return jax.jvp(value, (p,), (t,))[1]

    abstract_params = jax.tree.map(_abstract, params)
    closed = jxi.make_closed_jaxpr(
        tangent_of_loss, abstract_params, abstract_params, jax.tree.map(_abstract, dynamic)
    )
    out_shape = closed.out_avals[0].shape
    if out_shape != ():
        raise LossShapeError(
            f"the loss returns an array of shape {out_shape}; value_and_grad needs a scalar",
            fix="reduce it, e.g. return jnp.mean(per_example_losses)",
        )
    used = jxi.used_inputs(closed)
    n = len(jax.tree.leaves(params))
    tangent_used = used[n : 2 * n]
    return [name for name, u in zip(names, tangent_used) if not u]
