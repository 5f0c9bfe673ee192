"""shapeml: models whose every tensor has a declared, checked shape, on JAX.

This file only re-exports the public API; each name lives in the module its folder suggests.
Subpackages: `shapeml.models`, `shapeml.nn`, `shapeml.optim`, `shapeml.training`,
`shapeml.state`, `shapeml.sharding`, `shapeml.distributed`, `shapeml.hoisting`, `shapeml.int8`,
`shapeml.data`, `shapeml.testing`, `shapeml.lora`; complete models in `shapeml.zoo`.
"""

from . import data as data
from . import distributed as distributed
from . import hoisting as hoisting
from . import int8 as int8
from . import lora as lora
from . import models as models
from . import nn as nn
from . import optim as optim
from . import sharding as sharding
from . import state as state
from . import testing as testing
from . import training as training
from ._dead_params import DeadParamWarning as DeadParamWarning
from ._errors import ArgumentError as ArgumentError
from ._errors import ArgumentTypeError as ArgumentTypeError
from ._errors import ShapemlError as ShapemlError
from ._errors import ShapemlWarning as ShapemlWarning
from ._errors import explain as explain
from ._grad import Grad as Grad
from ._grad import grad as grad
from ._grad import norm as norm
from ._grad import value_and_grad as value_and_grad
from ._io import NonFiniteWarning as NonFiniteWarning
from ._shaped import ShapeCheckError as ShapeCheckError
from ._shaped import shaped as shaped
from ._version import __version__ as __version__
from .hoisting import Hoisted as Hoisted
from .hoisting import HoistReport as HoistReport
from .hoisting import bake as bake
from .hoisting import export as export
from .hoisting import hoist as hoist
from .hoisting import load_exported as load_exported
from .models import Dims as Dims
from .models import Model as Model
from .models import buffer as buffer
from .models import buffers as buffers
from .models import count_params as count_params
from .models import full as full
from .models import is_param as is_param
from .models import normal as normal
from .models import ones as ones
from .models import param as param
from .models import params as params
from .models import save as save
from .models import static as static
from .models import submodel as submodel
from .models import submodels as submodels
from .models import uniform as uniform
from .models import zeros as zeros
from .optim import load_checkpoint as load_checkpoint
from .optim import save_checkpoint as save_checkpoint
from .sharding import load as load  # models.load, plus placement on a mesh by rules
from .sharding import memory_report as memory_report
from .sharding import partition_specs as partition_specs
from .sharding import shard as shard
from .sharding import use_cpu_devices as use_cpu_devices
from .training import Precision as Precision

__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "bake",
    "buffer",
    "buffers",
    "count_params",
    "data",
    "DeadParamWarning",
    "Dims",
    "explain",
    "export",
    "full",
    "Grad",
    "grad",
    "hoist",
    "Hoisted",
    "hoisting",
    "HoistReport",
    "int8",
    "is_param",
    "lora",
    "load",
    "memory_report",
    "partition_specs",
    "shard",
    "sharding",
    "nn",
    "load_checkpoint",
    "load_exported",
    "Model",
    "models",
    "norm",
    "normal",
    "ones",
    "optim",
    "param",
    "Precision",
    "params",
    "save",
    "save_checkpoint",
    "shaped",
    "ShapeCheckError",
    "ShapemlError",
    "ShapemlWarning",
    "NonFiniteWarning",
    "static",
    "state",
    "submodel",
    "submodels",
    "testing",
    "training",
    "uniform",
    "use_cpu_devices",
    "value_and_grad",
    "zeros",
    "__version__",
]
