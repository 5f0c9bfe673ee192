"""The optimizer's errors (E12xx): a model, gradient or optimizer that does not belong together."""

from __future__ import annotations

from .._errors import ShapemlError

__all__ = ["GradShapeError", "ModelShapeError", "OptimizerKindError", "OptimizerMismatchError"]


class OptimizerMismatchError(
    ShapemlError,
    TypeError,
    code="E1201",
    title="optimizer is for another model",
    explanation="""
An optimizer was used with a model of another class than the one it was built for. Optimizer state
is typed by its model: `adamw(m, ...)` with `m: Spotter` is an `AdamW[Spotter]` and covers exactly
Spotter's params. Build the optimizer from the model it will update: `opt = optim.adamw(m, lr=...)`.
""",
):
    pass


class OptimizerKindError(
    ShapemlError,
    TypeError,
    code="E1202",
    title="wrong kind of optimizer",
    explanation="""
An optimizer of one kind was given where another was expected (an `SGD[Spotter]` where an
`AdamW[Spotter]` is expected, e.g. when resuming from a checkpoint saved with AdamW), or something
that is not a shapeml optimizer was passed to `update`. Build the optimizer the code expects, with
`optim.sgd(m, ...)` or `optim.adamw(m, ...)`.
""",
):
    pass


class GradShapeError(
    ShapemlError,
    ValueError,
    code="E1203",
    title="gradient does not match the optimizer",
    explanation="""
The gradient passed to `update` is not a gradient of the optimizer's model: another model's
`Grad`, a pytree instead of a `Grad`, or params of other shapes. The message names each param that
differs. Compute it with `sm.value_and_grad(loss, m, ...)` on the model being trained.
""",
):
    pass


class ModelShapeError(
    ShapemlError,
    ValueError,
    code="E1204",
    title="model changed shape since the optimizer was built",
    explanation="""
The model passed to `update` has params of other shapes (other dims) than the model the optimizer
was built for, so the optimizer state cannot apply to it. Build a new optimizer for the new model:
`opt = optim.adamw(m, lr=...)`.
""",
):
    pass
