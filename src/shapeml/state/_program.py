"""What a graph call runs: its inputs made canonical, and the programs one trace of the step makes.

A graph's step is one pure function, `(weights, states, *inputs) -> (outputs, states, checks)`,
traced once per input signature into a jaxpr. From that one trace come the compiled step (the
states donated, so XLA updates them in place, writes applied in body order) and its index checks.
A call runs the checks first and the step only if they all pass, so a bad index raises before
anything is written. A check of an index that is itself an input (`pos`) is a comparison on the
host; the others (`pos + 1`, an index read from a state) are the part of the jaxpr that computes
them, compiled on its own, and run on the host CPU when they need only the inputs. Either way the
call never waits for a device step to finish.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _jax_internals as jxi
from .._compile_cache import Signature, leaf_key
from ._errors import GraphInputError
from ._index import Check, raise_index_error

__all__ = ["Program", "canonical_inputs", "compile_program", "signature"]

_INT = np.dtype(jax.dtypes.canonicalize_dtype(np.int64))


@dataclasses.dataclass(frozen=True)
class InputCheck:
    """`0 <= inputs[input] <= size - extent`, compared on the host before the step runs."""

    input: int
    size: int
    extent: int
    what: str
    source: str

    def run(self, inputs: Sequence) -> None:
        value = int(inputs[self.input])
        if value < 0 or value + self.extent > self.size:
            raise_index_error(self.what, self.size, self.extent, value, self.source)


@dataclasses.dataclass(frozen=True)
class ComputedChecks:
    """The compiled checks of computed indices: `[first failing check or -1, its value]`."""

    compiled: Any
    args: tuple[int, ...]  # which flat arguments (weights, states, inputs) it takes
    first_input: int  # where the per-call inputs start among the flat arguments
    on_host: bool  # it takes only per-call inputs, as host arrays, on the CPU
    entries: tuple[tuple[str, int, int, str], ...]  # (what, size, extent, source) per check

    def run(self, weights: Sequence, states: Sequence, inputs: Sequence) -> None:
        """Raises `StateIndexError` (E1401) for the first check that fails."""
        if self.on_host:
            args = [np.asarray(inputs[i - self.first_input]) for i in self.args]
        else:
            flat = (*weights, *states, *inputs)
            args = [flat[i] for i in self.args]
        bad, value = np.asarray(self.compiled(*args)).tolist()
        if bad >= 0:
            what, size, extent, source = self.entries[bad]
            raise_index_error(what, size, extent, value, source)


@dataclasses.dataclass(frozen=True)
class Program:
    """The compiled step of one input signature, and the checks that run before it."""

    step: Any
    out_def: Any  # the structure of the body's result
    n_out: int
    input_checks: tuple[InputCheck, ...]
    computed: ComputedChecks | None

    def run(self, weights: Sequence, states: Sequence, inputs: Sequence):
        """`(outputs, new state leaves)`; the state leaves passed in are donated."""
        for check in self.input_checks:
            check.run(inputs)
        if self.computed is not None:
            self.computed.run(weights, states, inputs)
        results = self.step(*weights, *states, *inputs)
        return jax.tree.unflatten(self.out_def, results[: self.n_out]), results[self.n_out :]


def compile_program(
    pure: Callable, weights: list, states: list, key: Signature, *, unflatten: Callable
) -> Program:
    """Traces `pure(weights_tree, states_tree, inputs) -> (out, new_states, IndexChecks)` once,
    as flat `weights`, `states` (arrays) and inputs described by `key`, and compiles it.

    `unflatten(flat)` rebuilds the pytrees from flat arguments: `(weights, states, inputs)`.
    """
    nw, ns = len(weights), len(states)
    record: dict[str, Any] = {}

    def flat_step(*flat):
        out, new, checks = pure(*unflatten(flat))
        out_leaves, record["out"] = jax.tree.flatten(out)
        record["inputs"] = tuple(
            dict.fromkeys(
                InputCheck(c.input, c.size, c.extent, c.what, c.source)
                for c in checks.entries
                if c.input >= 0
            )
        )
        computed = [c for c in checks.entries if c.input < 0]
        record["computed"] = tuple((c.what, c.size, c.extent, c.source) for c in computed)
        status = [_first_failure(computed)] if computed else []
        return [*out_leaves, *jax.tree.leaves(new), *status]

    specs = [jax.ShapeDtypeStruct(k.shape, k.dtype, weak_type=k.weak_type) for k in key.leaves]
    args = [*weights, *states, *specs]
    closed = jxi.make_closed_jaxpr(flat_step, *args)  # the body's one trace
    run = jxi.as_fun(closed)
    n_out = record["out"].num_leaves
    n_step = n_out + ns
    step = jax.jit(lambda *a: run(*a)[:n_step], donate_argnums=tuple(range(nw, nw + ns)))
    computed = None
    if record["computed"]:
        computed = _compile_checks(closed, run, args, n_step, nw + ns, record["computed"])
    program = step.lower(*args).compile()
    return Program(program, record["out"], n_out, record["inputs"], computed)


def _first_failure(checks: list[Check]) -> jax.Array:
    """One small output for all checks: `[index of the first failing one or -1, its value]`."""
    oks = jnp.stack([c.ok for c in checks])
    bad = jnp.argmin(oks).astype(jnp.int32)
    value = jnp.stack([c.value for c in checks])[bad]
    return jnp.stack([jnp.where(oks[bad], -1, bad), value])


def _compile_checks(
    closed, run, args: list, n_step: int, first_input: int, entries
) -> ComputedChecks:
    used = jxi.used_inputs(closed, [False] * n_step + [True])
    keep = tuple(i for i, u in enumerate(used) if u)
    on_host = all(i >= first_input for i in keep)

    def check(*kept):
        # The arguments the checks do not read are never computed on: XLA drops them.
        flat = [jnp.zeros(a.shape, a.dtype) for a in args]
        for i, x in zip(keep, kept, strict=True):
            flat[i] = x
        return run(*flat)[n_step]

    if on_host:
        cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
        specs = [jax.ShapeDtypeStruct(args[i].shape, args[i].dtype, sharding=cpu) for i in keep]
    else:
        specs = [args[i] for i in keep]
    compiled = jax.jit(check).lower(*specs).compile()
    return ComputedChecks(compiled, keep, first_input, on_host, entries)


def _canonical(x):
    if isinstance(x, jax.Array):
        return x
    if type(x) is int:  # the common per-call `pos=`: skip the generic path
        return np.asarray(x, _INT)
    if isinstance(x, bool | int | float | complex | np.generic | np.ndarray):
        arr = np.asarray(x)
        if arr.dtype.kind not in "biufc":
            raise GraphInputError(
                f"a graph input has dtype {arr.dtype}", fix="pass numeric arrays or numbers"
            )
        dtype = jax.dtypes.canonicalize_dtype(arr.dtype)
        return arr if arr.dtype == dtype else arr.astype(dtype)
    raise GraphInputError(
        f"a graph input is a {type(x).__name__} ({x!r:.60}), not an array or a number",
        fix="pass arrays, numbers or pytrees of them; fixed configuration belongs in __init__",
    )


def canonical_inputs(inputs: tuple, per_call: dict):
    """Every input leaf as an array of JAX's canonical dtype (a new value never recompiles)."""
    leaves, treedef = jax.tree_util.tree_flatten((inputs, per_call))
    return [_canonical(x) for x in leaves], treedef


def signature(graph: str, inputs: tuple, per_call: dict) -> tuple[list, Signature]:
    """The canonical input leaves and the signature that picks their compiled program."""
    leaves, treedef = canonical_inputs(inputs, per_call)
    keys = []
    for x in leaves:
        if jxi.is_tracer(x):
            raise GraphInputError(
                f"`{graph}` was called with traced inputs (inside jax.jit, grad or vmap); a Graph "
                "is itself a compiled program that owns device state",
                fix="call the graph from Python, or use the pure functions it wraps (e.g. "
                "transformer.step) inside your own jit",
            )
        keys.append(leaf_key(x))
    return leaves, Signature(treedef, tuple(keys))
