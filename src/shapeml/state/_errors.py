"""The graph's own errors (codes E1404..E1409), each with its long explanation. The index errors
(E1401, E1402) belong to the index checks (`_index.py`), the write and allocation errors (E1403,
E1412) to device-resident state (`_state_errors.py`, which `KVCache` shares) and the input error
(E1410) to the shell (`shapeml._step`)."""

from __future__ import annotations

from .._errors import ShapemlError

__all__ = [
    "GraphBodyError",
    "GraphDeclarationError",
    "LoadStateDictError",
    "StateNotFoundError",
    "UnboundParamError",
    "WeightWriteError",
]

_UNBOUND = """
A weight declared by shape (`param((D, F))`) has no value until `graph.load_state_dict({...})`
binds one; the graph cannot be called before that.

    g = MyGraph()
    g.load_state_dict({"w": w})    # then call g(...)
"""

_LOAD = """
`load_state_dict` (and `load_states`, for the model `graph.states`) checks every entry against
the graph's declarations before changing anything: each declared weight (for `load_states`, each
state) must be present, no key may be unknown, and each array must have the declared
shape and a dtype of the same kind (a float weight takes a float array, cast to the declared float
dtype). Every problem is listed at once, with the nearest declared name when a key looks like a
typo. On any problem nothing is loaded.
"""

_NOT_FOUND = """
The graph has no weight or state of this name. `graph.read(name)` takes a state's name (the
attribute it was assigned to, or its `name=`); `graph.state_dict()` lists every name.
"""

_DECL = """
A weight or state declaration was invalid: a shape that is not a tuple of non-negative ints, a
name declared twice, a state name that is not a Python identifier (states are saved as the
buffers of `graph.states`), an attribute that would hide one of `Graph`'s own (`states`, `read`),
a declaration after the graph's states were made (at its first call or first read: its states
model is fixed then), or a whole-state assignment outside `body`. Declare every `param` and `state` in
`__init__`; change state from `body`, or with `reset()` / `load_state_dict()`.
"""

_WEIGHT_WRITE = """
Weights are read-only inside `body`: they are uploaded once and shared by every call. Keep a
changing tensor in a `state(...)` instead, or bind new weights from outside with
`graph.load_state_dict({...})`.
"""

_BODY = """
A `Graph` subclass must define `body(self, *inputs, **per_call)`, the function compiled and run on
every call; its result must be a pytree of arrays, and it may not call the graph itself (call
helper functions instead).
"""


class UnboundParamError(
    ShapemlError,
    RuntimeError,
    code="E1404",
    title="weight declared by shape was never bound",
    explanation=_UNBOUND,
):
    pass


class LoadStateDictError(
    ShapemlError,
    ValueError,
    code="E1405",
    title="state dict does not match the graph",
    explanation=_LOAD,
):
    pass


class StateNotFoundError(
    ShapemlError,
    KeyError,
    AttributeError,
    code="E1406",
    title="no weight or state of this name",
    explanation=_NOT_FOUND,
):
    pass


class GraphDeclarationError(
    ShapemlError,
    TypeError,
    code="E1407",
    title="invalid weight or state declaration",
    explanation=_DECL,
):
    pass


class WeightWriteError(
    ShapemlError,
    AttributeError,
    code="E1408",
    title="weights are read-only inside body",
    explanation=_WEIGHT_WRITE,
):
    pass


class GraphBodyError(
    ShapemlError, TypeError, code="E1409", title="graph has no valid body", explanation=_BODY
):
    pass
