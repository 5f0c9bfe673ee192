"""The errors of the model zoo (codes E2001..E2019), each with its long explanation."""

from __future__ import annotations

from .._errors import ShapemlError

__all__ = ["LabelError", "SpotterDimsError", "TransformerDimsError"]


class TransformerDimsError(
    ShapemlError,
    ValueError,
    code="E2001",
    title="transformer dims do not fit together",
    explanation="""
The transformer splits its width `D` into `H` attention heads of `D // H` each, so `H` must be at
least 1 and divide `D` exactly; otherwise every attention step would fail later, deep in a reshape.
The dims are checked when the model is built (`Transformer.init`, or the constructor), before any
weight is drawn or used.

    Transformer.init(seed=0, D=30, H=4)     # E2001: 30 is not a multiple of 4
    Transformer.init(seed=0, D=32, H=4)     # heads of 8
""",
):
    pass


class SpotterDimsError(
    ShapemlError,
    ValueError,
    code="E2002",
    title="spotter dims do not fit together",
    explanation="""
The Spotter cuts each `S x S` image into `(S // P) ** 2` patches of `P x P` pixels, so the patch
size `P` must divide the image size `S` exactly; otherwise the patches would not tile the image
and `forward` would fail in a reshape. The dims are checked when the model is built.

    Spotter.init(seed=0, S=15)              # E2002: 15 is not a multiple of P=4
    Spotter.init(seed=0, S=16, P=4)         # 16 patches of 4 x 4
""",
):
    pass


class LabelError(
    ShapemlError,
    IndexError,
    code="E2003",
    title="class label out of range",
    explanation="""
A class label or prediction given to the Spotter's losses and metrics is outside `0..C-1`, or
they were asked for a number of classes below 1. A gather with such a label reads NaN (or, in a
count, lands in another class's cell), so concrete labels are checked on the host and refused.
Labels traced inside your own `jit` cannot be checked there: the loss is then NaN, which training
reports.

    spotter.loss(m, images, jnp.array([0, 3, 4]))     # E2003 with C=4: 4 is not a class
""",
):
    pass
