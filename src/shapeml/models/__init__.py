"""Models: the `Model` base, dims, field declarations, initializers and checkpoints (the core)."""

from ._checkpoint import CheckpointError as CheckpointError
from ._checkpoint import CheckpointFileError as CheckpointFileError
from ._checkpoint import save as save
from ._dims import Dims as Dims
from ._fields import buffer as buffer
from ._fields import param as param
from ._fields import static as static
from ._fields import submodel as submodel
from ._fields import submodels as submodels
from ._freeze import freeze as freeze
from ._initializers import full as full
from ._initializers import normal as normal
from ._initializers import ones as ones
from ._initializers import uniform as uniform
from ._initializers import zeros as zeros
from ._introspect import buffers as buffers
from ._introspect import count_params as count_params
from ._introspect import is_param as is_param
from ._introspect import params as params
from ._limits import DEFAULT_MAX_BYTES as DEFAULT_MAX_BYTES
from ._load import load as load
from ._mapped import Mapped as Mapped
from ._model import Model as Model
from ._partial import LoadReport as LoadReport
from ._partial import PartialLoadWarning as PartialLoadWarning

__all__ = [
    "CheckpointError",
    "CheckpointFileError",
    "DEFAULT_MAX_BYTES",
    "Dims",
    "LoadReport",
    "Mapped",
    "Model",
    "PartialLoadWarning",
    "buffer",
    "buffers",
    "count_params",
    "freeze",
    "full",
    "is_param",
    "load",
    "normal",
    "ones",
    "param",
    "params",
    "save",
    "static",
    "submodel",
    "submodels",
    "uniform",
    "zeros",
]
