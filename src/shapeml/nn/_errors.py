"""The coded errors of `shapeml.nn` (E1801-E1849): layer declarations, options and inputs."""

from __future__ import annotations

from .._errors import ShapemlError

__all__ = ["LayerDimsError", "LayerInputError", "LayerOptionError"]


class LayerDimsError(
    ShapemlError,
    ValueError,
    code="E1801",
    title="layer dims do not fit together",
    explanation="""
A layer's dims were mapped in a way that cannot work, or a layer was built with dims that do not
fit together. A layer's dims take the parent's values by name; the declaration maps a layer dim
to a parent dim (or an expression of parent dims, or a number) of another name:

    up: nn.Linear = sm.submodel(nn.Linear, In="D", Out="4 * D")   # In = D, Out = 4 * D

A dim maps to a name, an expression or a whole number; a derived dim (attention's `Dh`) cannot be
mapped (map the dims it is computed from); and a layer dim may not be mapped to a name that is
another of the layer's own dims, itself mapped (`In="Out", Out="D"`): map both to parent names
instead. Attention needs its width divisible by its heads (`D % H == 0`), and rotary positions an
even head width (`Dh = D // H`):

    attn: nn.MultiHeadAttention = sm.submodel(nn.MultiHeadAttention)   # parent: D=64, H=4
""",
):
    pass


class LayerOptionError(
    ShapemlError,
    ValueError,
    code="E1802",
    title="invalid layer option",
    explanation="""
A layer's declaration (`sm.submodel(nn.X, ...)`, `nn.X.of(...)`), `init` or constructor was given
an option it does not take, or a value out of its range: a dropout rate outside [0, 1), a stride
below 1, a negative padding, a pooling window below 1, a bias that is not True or False, an
unknown activation or position scheme. Options are keyword arguments next to the dim mappings:

    sm.submodel(nn.Conv2d, Ci="C", Co="C2", stride=2, padding=1)
    nn.Dropout(rate=0.1)
    nn.MultiHeadAttention.init(seed=0, causal=True, positions="rotary")

The message names the option, the value and the range it must be in.
""",
):
    pass


class LayerInputError(
    ShapemlError,
    ValueError,
    code="E1803",
    title="layer input does not fit the layer",
    explanation="""
A layer was called on an input it cannot process although the input's named dims match: a
convolution or pooling window larger than the (padded) image, a sequence longer than the
attention's context `T` (its position table or its cache), a token id outside the vocabulary, or
a decode step whose cache has another number of heads or head width.

    y = conv(x)          # x: [b Ci h w] with h + 2 * padding >= K
    y = attn(x)          # x: [b t D] with t <= T
""",
):
    pass
