"""Hoisting: weight-only work of a forward computed once per set of weights, not every call."""

from ._bake import Baked as Baked
from ._bake import bake as bake
from ._errors import ArtifactCorruptError as ArtifactCorruptError
from ._errors import ArtifactMismatchError as ArtifactMismatchError
from ._errors import ExportedInputError as ExportedInputError
from ._errors import ExportError as ExportError
from ._errors import HoistArgumentError as HoistArgumentError
from ._errors import HoistInputError as HoistInputError
from ._errors import MutableWeightsError as MutableWeightsError
from ._errors import NotTracedError as NotTracedError
from ._errors import UnhashableStaticError as UnhashableStaticError
from ._export import export as export
from ._hoist import Hoisted as Hoisted
from ._hoist import hoist as hoist
from ._load import Exported as Exported
from ._load import load_exported as load_exported
from ._report import HoistReport as HoistReport
from ._split import Boundary as Boundary

__all__ = [
    "ArtifactCorruptError",
    "Baked",
    "ArtifactMismatchError",
    "Boundary",
    "ExportError",
    "Exported",
    "ExportedInputError",
    "HoistArgumentError",
    "HoistInputError",
    "HoistReport",
    "Hoisted",
    "MutableWeightsError",
    "NotTracedError",
    "UnhashableStaticError",
    "bake",
    "export",
    "hoist",
    "load_exported",
]
