"""The errors of `shapeml.state` (codes E1401..E1499), each with its long explanation."""

from __future__ import annotations

from .._errors import ShapemlError

__all__ = [
    "GraphBodyError",
    "GraphDeclarationError",
    "GraphInputError",
    "LoadStateDictError",
    "StateIndexError",
    "StateAllocationError",
    "StateIndexTypeError",
    "StateNotFoundError",
    "StateWriteError",
    "UnboundParamError",
    "WeightWriteError",
]

_INDEX = """
A state was indexed outside its extent: a position `pos >= size`, or a negative one.

JAX clamps out-of-range indices in gathers and `dynamic_update_slice` without a word, so
`total[16]` on a 16-row state would silently read and overwrite row 15. shapeml checks every index,
the same way in every context: a concrete index raises at once; in a graph's body every index is
recorded, the graph runs those checks before the compiled step, and raises this error instead of
running it, so a bad index changes nothing; in your own `jit` or `vmap`,
`check_index` (and `KVCache`) fail the computation through `eqx.error_if`, with a JAX runtime
error whose message starts with `[E1401]`.

Negative indices are refused rather than counted from the end, because a negative position is
nearly always an off-by-one in a decode loop.

    graph(x, pos=16)          # total has 16 rows: raises E1401
    graph(x, pos=15)          # the last row
"""

_INDEX_TYPE = """
A state index must be an integer scalar (a Python int, a 0-d integer array, or a traced 0-d
integer), a slice with static integer bounds, or `shapeml.state.span(start, size)` for a slice of
static length that starts at a per-call position.

    self.total[pos]                    # one row
    self.cache[span(pos, 4)]           # four rows starting at pos
    self.total[0.5]                    # raises E1402: a float is not an index
"""

_WRITE = """
A write into a state must have exactly the shape and dtype of the part of the state it replaces;
nothing is broadcast or cast silently, because a silent cast (float64 into a float32 cache, or a
float into an int8 cache) is a bug that only shows much later. The check runs when the body is
traced, so it costs nothing per call.

    self.total[pos] = new                      # new: (width,), same dtype as total
    self.total[pos] = new.astype(jnp.float32)  # when new has another dtype
"""

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
a declaration after the graph was first called (its program is already compiled against the old
set), or a whole-state assignment outside `body`. Declare every `param` and `state` in
`__init__`; change state from `body`, or with `reset()` / `load_state_dict()`.
"""

_WEIGHT_WRITE = """
Weights are read-only inside `body`: they are uploaded once and shared by every call. Keep a
changing tensor in a `state(...)` instead, or bind new weights from outside with
`graph.load_state_dict({...})`.
"""

_BODY = """
A `Graph` subclass must define `body(self, *inputs, **per_call)`, the function compiled and run on
every call; its result must be a pytree of arrays, and it may not call the graph itself.

Every index into a state (or into a `KVCache` held in one) must be a value of the body itself, not
one traced inside a transformation nested in it (`lax.scan`, `vmap`, an inner `jit`): the graph
checks every index before its step runs, and such a value exists only inside that transformation.
An index the body already has (`pos`) may be used inside one. Unroll the loop instead:

    self.cache, _ = lax.scan(lambda c, l: (c.write(l, pos, k, v), None),
                             self.cache, jnp.arange(layers))      # E1409: l exists in the scan
    for l in range(layers):                                       # l is a Python int
        self.cache = self.cache.write(l, pos, k, v)
"""

_INPUT = """
Every input of a graph call must be an array, a Python number or a pytree of them: each becomes a
traced value of the compiled program (so a new value never recompiles). Configuration that changes
the program belongs in the graph's `__init__`. An integer must fit JAX's int dtype (int32, or int64
with `jax_enable_x64`); one that does not is refused rather than wrapped around (as an index the
graph checks, it is an E1401 index error instead).
"""


class StateIndexError(
    ShapemlError, IndexError, code="E1401", title="state index out of range", explanation=_INDEX
):
    pass


class StateIndexTypeError(
    ShapemlError, TypeError, code="E1402", title="not a valid state index", explanation=_INDEX_TYPE
):
    pass


class StateWriteError(
    ShapemlError,
    ValueError,
    code="E1403",
    title="state write of the wrong shape or dtype",
    explanation=_WRITE,
):
    pass


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


class GraphInputError(
    ShapemlError, TypeError, code="E1410", title="graph input is not an array", explanation=_INPUT
):
    pass


_ALLOC = """
A state (or a `KVCache`) was declared larger than the memory it is to be kept in: the host or the
device refused to allocate it. Nothing was allocated and nothing changed; the declaration named in
the message (its shape, dtype and size in bytes) is the one to shrink.

    self.cache = state((10**12, 16))     # 64 TB: E1412 on the first call
    self.cache = state((4096, 16))       # rows the call will actually index
"""


class StateAllocationError(
    ShapemlError,
    MemoryError,
    code="E1412",
    title="state too large to allocate",
    explanation=_ALLOC,
):
    pass
