"""shapeml.int8: a one-layer transformer that runs on integers only (int8 weights and activations,
int32 accumulators, fixed-point requant, exp-table softmax), with bit-exact reference, compiled and
tensor-parallel decode. The integer pipeline is specified in docs/int8.md.

`Int8Model` is an `sm.Model` (its tables are buffers; `sm.save` / `sm.load` work on it); the JSON
model file is its import/export format. The decode paths are pure functions of the model and a
`KVCache` (`reference_step`, `step`, `generate_loop`, `tp_step`, ...), which the model's methods
wrap. The shipped sorting model and its trainer live in `shapeml.apps.int8_sort`.
"""

from ._decode import generate_loop as generate_loop
from ._decode import project as project
from ._decode import step as step
from ._errors import Int8AccumulatorError as Int8AccumulatorError
from ._errors import Int8ExpTableError as Int8ExpTableError
from ._errors import Int8FileError as Int8FileError
from ._errors import Int8FormatError as Int8FormatError
from ._errors import Int8JsonError as Int8JsonError
from ._errors import Int8PositionError as Int8PositionError
from ._errors import Int8PromptError as Int8PromptError
from ._errors import Int8RequantError as Int8RequantError
from ._errors import Int8ScaleError as Int8ScaleError
from ._errors import Int8ShapeError as Int8ShapeError
from ._errors import Int8SizeError as Int8SizeError
from ._errors import Int8TensorParallelError as Int8TensorParallelError
from ._errors import Int8TokenError as Int8TokenError
from ._errors import Int8ValueError as Int8ValueError
from ._errors import Int8VocabularyError as Int8VocabularyError
from ._model import Int8Model as Int8Model
from ._numerics import REQUANT_POINTS as REQUANT_POINTS
from ._numerics import exp_table as exp_table
from ._numerics import requant as requant
from ._numerics import requant_jax as requant_jax
from ._numerics import requant_pair as requant_pair
from ._reference import reference_generate as reference_generate
from ._reference import reference_step as reference_step
from ._schema import FORMAT as FORMAT
from ._tokenizer import Tokenizer as Tokenizer
from ._tp import TensorPlacement as TensorPlacement
from ._tp import TpManifest as TpManifest
from ._tp import place as place
from ._tp import tp_generate as tp_generate
from ._tp import tp_step as tp_step

__all__ = [
    "FORMAT",
    "REQUANT_POINTS",
    "Int8AccumulatorError",
    "Int8ExpTableError",
    "Int8FileError",
    "Int8FormatError",
    "Int8JsonError",
    "Int8Model",
    "Int8PositionError",
    "Int8PromptError",
    "Int8RequantError",
    "Int8ScaleError",
    "Int8ShapeError",
    "Int8SizeError",
    "Int8TensorParallelError",
    "Int8TokenError",
    "Int8ValueError",
    "Int8VocabularyError",
    "TensorPlacement",
    "Tokenizer",
    "TpManifest",
    "exp_table",
    "generate_loop",
    "place",
    "project",
    "reference_generate",
    "reference_step",
    "requant",
    "requant_jax",
    "requant_pair",
    "step",
    "tp_generate",
    "tp_step",
]
