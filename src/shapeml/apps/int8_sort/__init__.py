"""The int8 sorting app: the corpus, the float model's training, its quantization into an
`shapeml.int8.Int8Model`, the shipped model, and the `shapeml int8` command.

Built on the library (`shapeml.int8`, `shapeml.zoo.transformer`, `shapeml.optim`); nothing in the
library imports it.
"""

from .shipped import TINY_FLOAT_PATH as TINY_FLOAT_PATH
from .shipped import TINY_MODEL_PATH as TINY_MODEL_PATH
from .shipped import tiny_model as tiny_model

__all__ = ["TINY_FLOAT_PATH", "TINY_MODEL_PATH", "tiny_model"]
