"""Dead-param analysis: which params can a loss's value depend on?

`value_and_grad` differentiates with `jax.vjp`, whose linearization of the loss is a program from
the params' tangents to the value's tangent. Dead-code elimination of that program says which
params' tangents reach the value. A param read only through `stop_gradient` has a zero tangent,
so it counts as never read. JAX's DCE follows nested jaxprs (pjit, scan, cond, while,
custom_jvp/vjp) and keeps every input of a primitive it cannot see into, so the analysis errs
towards "read": it never warns falsely.

The analysis rides on the trace differentiation makes anyway: no second trace and no cache, so
under `jax.jit` it runs once per trace of the loss, never per step. Each param is named by its
path in the params pytree (`blocks.0.w1`, as `sm.params(m)` names it).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp

from . import _jax_internals as jxi
from ._errors import ShapemlError, ShapemlWarning
from ._traceback import user_stacklevel
from .models._introspect import dotted_name

__all__ = ["DeadParamWarning", "LossShapeError", "NoParamsReadError", "check_reads", "scalar_loss"]


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


def check_reads(vjp_fn: Callable, params, loss_name: str, model_name: str) -> None:
    """Warns W1101 for each param the loss never reads and raises E1101 when it reads none.

    Args:
        vjp_fn: what `jax.vjp(loss_of_params, params)` returned: its linearization is analysed.
        params: the params pytree differentiated (the model with None for every non-param).
        loss_name, model_name: for the messages.
    """
    named = jax.tree_util.tree_flatten_with_path(params)[0]
    names = [dotted_name(path) for path, _ in named]
    read = jxi.vjp_reads(vjp_fn, len(names))
    _report(names, [n for n, r in zip(names, read, strict=True) if not r], loss_name, model_name)


def _report(names: list[str], unread: list[str], loss_name: str, model_name: str) -> None:
    if names and len(unread) == len(names):
        raise NoParamsReadError(
            f"`{loss_name}` reads none of `{model_name}`'s params ({', '.join(names)}), so "
            "every gradient would be zero",
            fix="make the loss compute its value from the model it is given",
        )
    for name in unread:
        warnings.warn(
            DeadParamWarning(
                f"`{loss_name}` never reads the param `{name}` of `{model_name}`, so its "
                "gradient is always zero",
                fix="use it in the forward, remove it, or make it an sm.buffer if it isn't trained",
            ),
            stacklevel=user_stacklevel(),
        )


def scalar_loss(out, has_aux: bool):
    """What the loss returned, checked: its value as a floating scalar array (and its aux, with
    `has_aux`, as `(value, aux)`), E1106 otherwise."""
    aux = None
    if has_aux:
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            what = "an array" if hasattr(out, "shape") else type(out).__name__
            raise LossShapeError(
                f"with has_aux=True the loss must return (value, aux), got {what}",
                fix="return (loss, aux), or call without has_aux=True",
            )
        out, aux = out
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
    if out.shape != ():
        raise LossShapeError(
            f"the loss returns an array of shape {out.shape}; value_and_grad needs a scalar",
            fix="reduce it, e.g. return jnp.mean(per_example_losses)",
        )
    return (out, aux) if has_aux else out
