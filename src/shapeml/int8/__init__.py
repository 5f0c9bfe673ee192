"""shapeml.int8: a one-layer transformer that runs on integers only (int8 weights and activations,
int32 accumulators, fixed-point requant, exp-table softmax), with bit-exact reference, compiled and
tensor-parallel decode. The integer pipeline is specified in docs/int8.md.
"""

from ._errors import Int8AccumulatorError as Int8AccumulatorError
from ._errors import Int8ExpTableError as Int8ExpTableError
from ._errors import Int8FileError as Int8FileError
from ._errors import Int8PositionError as Int8PositionError
from ._errors import Int8PromptError as Int8PromptError
from ._errors import Int8RequantError as Int8RequantError
from ._errors import Int8ShapeError as Int8ShapeError
from ._errors import Int8SizeError as Int8SizeError
from ._errors import Int8TensorParallelError as Int8TensorParallelError
from ._errors import Int8TokenError as Int8TokenError
from ._errors import Int8ValueError as Int8ValueError
from ._model import Int8Model as Int8Model
from ._numerics import exp_table as exp_table
from ._numerics import requant as requant
from ._numerics import requant_jax as requant_jax
from ._numerics import requant_pair as requant_pair
from ._schema import FORMAT as FORMAT
from ._schema import REQUANT_POINTS as REQUANT_POINTS
from ._shipped import TINY_FLOAT_PATH as TINY_FLOAT_PATH
from ._shipped import TINY_MODEL_PATH as TINY_MODEL_PATH
from ._shipped import tiny_model as tiny_model
from ._tp import TensorPlacement as TensorPlacement
from ._tp import TpManifest as TpManifest

__all__ = [
    "FORMAT",
    "REQUANT_POINTS",
    "Int8AccumulatorError",
    "Int8ExpTableError",
    "Int8FileError",
    "Int8Model",
    "Int8PositionError",
    "Int8PromptError",
    "Int8RequantError",
    "Int8ShapeError",
    "Int8SizeError",
    "Int8TensorParallelError",
    "Int8TokenError",
    "Int8ValueError",
    "TINY_FLOAT_PATH",
    "TINY_MODEL_PATH",
    "TensorPlacement",
    "TpManifest",
    "exp_table",
    "requant",
    "requant_jax",
    "requant_pair",
    "tiny_model",
]
