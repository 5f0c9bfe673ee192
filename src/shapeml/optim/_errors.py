"""The optimizer's errors (E12xx): a model, gradient or optimizer that does not belong together."""

from __future__ import annotations

from .._errors import ShapemlError

__all__ = [
    "GradShapeError",
    "MaskError",
    "ModelShapeError",
    "OptimizerCheckpointError",
    "OptimizerKindError",
    "OptimizerMismatchError",
    "OptionConflictError",
]


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


class OptimizerCheckpointError(
    ShapemlError,
    ValueError,
    code="E1205",
    title="the checkpoint's optimizer description is unreadable",
    explanation="""
`sm.load_checkpoint` rebuilds the optimizer from the description `sm.save_checkpoint` wrote into the
file's metadata (`shapeml.optimizer`: its kind, settings, schedule, transforms and options). That
description is missing a part, is not valid JSON, names an unknown optimizer or setting, or holds a
value the optimizer refuses (a negative learning rate, `b1=1.5`). The message names the file and the
part. Nothing was loaded.

Re-save the checkpoint with `sm.save_checkpoint(path, m, opt)`, or build the optimizer as in
training and pass it as a template: `sm.load_checkpoint(path, Cls, like=opt)`.
""",
):
    pass


class MaskError(
    ShapemlError,
    ValueError,
    code="E1206",
    title="a mask pattern matches no param",
    explanation="""
`optim.mask("blocks.*.norm*")` selects params by dotted name (`blocks.0.norm_scale`) with shell-style
globs (`*`, `?`, `[...]`). A pattern that matches no param of the model is almost always a typo, so
it is refused when the optimizer is built, with the params' names and the nearest one. Print
`sm.params(m).keys()` to see the names, and fix the pattern.
""",
):
    pass


class OptionConflictError(
    ShapemlError,
    ValueError,
    code="E1207",
    title="optimizer options conflict",
    explanation="""
An option asked for (`accumulate=N`, `ema=DECAY`, `skip_nonfinite=`) differs from what the optimizer
was built with, e.g. `train(..., accumulate=4)` with an optimizer built with `accumulate=2`, or
`optim.averaged(m, opt)` for an optimizer that keeps no average. Build the optimizer with the options
it should have (`optim.adamw(m, lr=..., accumulate=4, ema=0.999)`) or leave the option at its
default where it is passed again.
""",
):
    pass
