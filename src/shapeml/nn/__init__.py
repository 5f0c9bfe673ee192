"""Layers as `sm.Model`s in named dims: each a typed value with a shape-checked forward.

Compose them with `sm.submodel` / `sm.submodels`, which map a layer's dims onto the parent's names
and set its options (`sm.submodel(nn.Linear, In="D", Out="F", bias=False)`); a layer on its own is
built by its `init`, whose signature lists every dim and option (`nn.Linear.init(seed=0, In=4,
Out=3, bias=False)`). `nn.scan` runs a stack of layers (compiled once when the field is stored
stacked), `nn.remat` trades memory for recompute by named policy, `nn.cross_entropy` is the fused
classification loss.
"""

from ._attention import MultiHeadAttention as MultiHeadAttention
from ._batchnorm import BatchNorm as BatchNorm
from ._batchnorm import take_buffers as take_buffers
from ._conv import Conv2d as Conv2d
from ._dropout import Dropout as Dropout
from ._embedding import Embedding as Embedding
from ._errors import LayerDimsError as LayerDimsError
from ._errors import LayerInputError as LayerInputError
from ._errors import LayerOptionError as LayerOptionError
from ._init import fan_in as fan_in
from ._layer import Layer as Layer
from ._linear import Linear as Linear
from ._loss import cross_entropy as cross_entropy
from ._mlp import MLP as MLP
from ._norms import LayerNorm as LayerNorm
from ._norms import RMSNorm as RMSNorm
from ._pool import AvgPool2d as AvgPool2d
from ._pool import MaxPool2d as MaxPool2d
from ._remat import remat as remat
from ._scan import scan as scan
from ._scan import unstack as unstack

__all__ = [
    "AvgPool2d",
    "BatchNorm",
    "Conv2d",
    "Dropout",
    "Embedding",
    "Layer",
    "LayerDimsError",
    "LayerInputError",
    "LayerNorm",
    "LayerOptionError",
    "Linear",
    "MLP",
    "MaxPool2d",
    "MultiHeadAttention",
    "RMSNorm",
    "cross_entropy",
    "fan_in",
    "remat",
    "scan",
    "take_buffers",
    "unstack",
]
