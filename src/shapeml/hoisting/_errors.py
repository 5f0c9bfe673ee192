"""Errors of the hoisting subsystem (codes E1501..E1599)."""

from __future__ import annotations

from .._errors import ShapemlError

__all__ = [
    "ArtifactCorruptError",
    "ArtifactMismatchError",
    "ExportError",
    "ExportedInputError",
    "HoistArgumentError",
    "HoistInputError",
    "MutableWeightsError",
    "NotTracedError",
    "UnhashableStaticError",
]


class HoistArgumentError(
    ShapemlError,
    TypeError,
    code="E1501",
    title="hoisted function called without its weights argument",
    explanation="""
`sm.hoist(f, weights=...)` names which positional argument(s) of `f` hold the weights (the model).
The hoisted function was called with fewer positional arguments than that, or `weights=` is not
a non-negative int or a tuple of them.

    fast = sm.hoist(forward)            # forward(model, x): weights are argument 0
    fast(model, x)                      # ok
    fast(x)                             # E1501: argument 0 is the input, not the model
""",
):
    pass


class MutableWeightsError(
    ShapemlError,
    TypeError,
    code="E1502",
    title="weights hold a mutable numpy array",
    explanation="""
The hoisting cache is keyed on the identity of the weight arrays. JAX arrays are immutable, so
"same object" means "same values"; a numpy array can be changed in place after the prepared
tensors were computed, and the cache would silently return stale results. Convert the weights to
JAX arrays once, before the first call:

    model = jax.tree.map(jnp.asarray, model)
""",
):
    pass


class NotTracedError(
    ShapemlError,
    RuntimeError,
    code="E1503",
    title="no hoisted program yet",
    explanation="""
`report()` describes the program built on the first call, so it needs one call first. To inspect
the split without running it, use `prepare_jaxpr(model, *inputs)` and `main_jaxpr(model, *inputs)`,
which accept arrays or `jax.ShapeDtypeStruct`s.
""",
):
    pass


class UnhashableStaticError(
    ShapemlError,
    TypeError,
    code="E1504",
    title="a non-array argument leaf is not hashable",
    explanation="""
Leaves of the arguments that are not arrays (Python numbers, strings, callables) are treated as
static configuration, like `equinox.filter_jit` does: they are part of the key `jax.jit` compiles
a program by, so they must be hashable. Pass data as arrays, and configuration as hashable values
(tuples, not lists).
""",
):
    pass


class ExportError(
    ShapemlError,
    ValueError,
    code="E1505",
    title="cannot export this function",
    explanation="""
`sm.export` serializes the main program with `jax.export` and writes the prepared weights beside
it. It needs example inputs whose leaves are arrays (or `jax.ShapeDtypeStruct`s) in standard
containers (tuples, lists, dicts), a weights pytree without PRNG keys (pass a key as an input
instead), and `quantize=None` or `"int8"`.
""",
):
    pass


class ArtifactCorruptError(
    ShapemlError,
    ValueError,
    code="E1506",
    title="exported artifact is corrupt or not an export",
    explanation="""
`sm.load_exported` read the file as safetensors, but not as a shapeml artifact: it was not written
by `sm.export`, its metadata is damaged, or a checksum of the program or of the tensors does not
match what was written (the file changed after writing). Re-export the model with `sm.export`.
A missing file is `E1304` and one that is not valid safetensors (truncated, another format) is
`E1302`, as for every file shapeml reads.
""",
):
    pass


class ArtifactMismatchError(
    ShapemlError,
    ValueError,
    code="E1507",
    title="exported artifact does not match its program",
    explanation="""
The file was read, but its parts disagree: a tensor the program needs is missing, or has another
shape or dtype than the program expects, or the file was written by an unsupported format
version. This happens when tensors from one export are mixed with the program of another.
Re-export the model with `sm.export`.
""",
):
    pass


class ExportedInputError(
    ShapemlError,
    TypeError,
    code="E1508",
    title="exported program called with the wrong inputs",
    explanation="""
A function loaded with `sm.load_exported` takes exactly the inputs it was exported with: the
same number of arrays, each of the same rank and dtype, with the same sizes except along the
symbolic batch axis `b`, which must be at least 1 and the same for every input. Nothing is cast or
reshaped for you. The message names the input, what it expects (`loaded.in_avals`) and what it got.

    loaded = sm.load_exported("model.safetensors")
    loaded.in_avals                          # (ShapedArray(float32[b,3]),)
    loaded(jnp.ones((5, 3)))                 # ok: b = 5
    loaded(jnp.ones((5, 3), jnp.int32))      # E1508: dtype int32, expected float32
    loaded(jnp.asarray(x, jnp.float32))      # cast it yourself
""",
):
    pass


class HoistInputError(
    ShapemlError,
    TypeError,
    ValueError,
    code="E1509",
    title="hoisted function called with inputs of the wrong shape",
    explanation="""
A function made by `sm.hoist` (or `sm.bake`) is traced once per structure, shapes and dtypes of
its inputs. A call whose inputs have a new shape is traced again, which is how a new batch size
works; but when `f` cannot be traced for the new shapes (JAX refuses an operation, e.g.
`dot_general requires contracting dimensions to have the same shape`), the call is refused before
anything runs, with this error. It names the input, the shape it was given, and the shape earlier
calls with the same weights were traced for: an axis that had the same size on every earlier call
(the `4` of `float32[*, 4]`) is one `f` needs; an axis shown as `*` changed between calls (a batch
axis). JAX's own reason follows.

    fast = sm.hoist(forward)             # forward(model, x) = x @ model.w, w: [4 3]
    fast(model, jnp.ones((2, 4)))         # traced for x: float32[2,4]
    fast(model, jnp.ones((8, 4)))         # a new batch size: traced again, fine
    fast(model, jnp.ones((2, 5)))         # E1509: `x` is float32[2,5]; traced for float32[*,4]

A function annotated with shapes (`@sm.shaped`) reports the dim by name instead (E1001).
""",
):
    pass
