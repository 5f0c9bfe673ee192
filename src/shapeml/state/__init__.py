"""Weights and device-resident state: a compiled `Graph` that owns both, and the `KVCache`.

A graph uploads its weights (`param`) once and keeps its states (`state`, together one `sm.Model`,
`graph.states`) on the device across calls, updated in place by one pure compiled step (the one
shell every stateful step uses); per-call indices are traced (no recompiles) and bounds-checked before the
step runs (never clamped); `Graph.reference` runs the same body eagerly on the host.
"""

from .._step import StepInputError as GraphInputError
from ._body import StateView as StateView
from ._decl import param as param
from ._decl import state as state
from ._errors import GraphBodyError as GraphBodyError
from ._errors import GraphDeclarationError as GraphDeclarationError
from ._errors import LoadStateDictError as LoadStateDictError
from ._errors import StateNotFoundError as StateNotFoundError
from ._errors import UnboundParamError as UnboundParamError
from ._errors import WeightWriteError as WeightWriteError
from ._graph import Graph as Graph
from ._handles import ParamHandle as ParamHandle
from ._handles import StateHandle as StateHandle
from ._index import IndexChecks as IndexChecks
from ._index import StateIndexError as StateIndexError
from ._index import StateIndexTypeError as StateIndexTypeError
from ._index import check_index as check_index
from ._index import span as span
from ._kvcache import KVCache as KVCache
from ._state_errors import StateAllocationError as StateAllocationError
from ._state_errors import StateWriteError as StateWriteError

__all__ = [
    "Graph",
    "GraphBodyError",
    "GraphDeclarationError",
    "GraphInputError",
    "IndexChecks",
    "KVCache",
    "LoadStateDictError",
    "ParamHandle",
    "StateAllocationError",
    "StateHandle",
    "StateIndexError",
    "StateIndexTypeError",
    "StateNotFoundError",
    "StateView",
    "StateWriteError",
    "UnboundParamError",
    "WeightWriteError",
    "check_index",
    "param",
    "span",
    "state",
]
