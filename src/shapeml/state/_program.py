"""What a graph call runs: its inputs made canonical, and the programs one trace of the step makes.

A graph's step is one pure function, `(weights, states, *inputs) -> (outputs, states, checks)`,
traced once per input signature into a jaxpr. From that one trace come the compiled step (the
states donated, so XLA updates them in place, writes applied in body order) and its index checks.
A call runs the checks first and the step only if they all pass, so a bad index raises before
anything is written. A check of an index that is itself an input (`pos`) is a comparison on the
host; the others (`pos + 1`, an index read from a state) are the part of the jaxpr that computes
them, compiled on its own: on the host CPU when they need only the inputs, else on the device,
where the call then waits for that small program (and so for the steps before it that wrote the
state it reads) before it starts the step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _jax_internals as jxi
from .._compile_cache import Signature
from ._errors import GraphInputError
from ._index import Check, raise_index_error

__all__ = [
    "InputTooWideError",
    "Program",
    "canonical_inputs",
    "compile_program",
    "raise_too_wide",
    "signature",
    "too_wide",
]


def _int() -> np.dtype:
    """JAX's int dtype now: int64 with `jax_enable_x64`, else int32."""
    return np.dtype(jax.dtypes.canonicalize_dtype(np.int64))


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

    args = [*weights, *states, *key.abstract_leaves()]
    closed = jxi.make_closed_jaxpr(flat_step, *args)  # the body's one trace
    n_step = record["out"].num_leaves + ns
    has_checks = bool(record["computed"])
    # Every input stays, so the donated states keep their argument positions.
    step_jaxpr, _ = jxi.dce(closed, [True] * n_step + [False] * has_checks, keep_inputs=True)
    run_step = jxi.as_fun(step_jaxpr)
    step = jax.jit(lambda *a: run_step(*a), donate_argnums=tuple(range(nw, nw + ns)))
    computed = None
    if has_checks:
        computed = _compile_checks(closed, args, n_step, nw + ns, record["computed"])
    program = step.lower(*args).compile()
    n_out = record["out"].num_leaves
    return Program(program, record["out"], n_out, record["inputs"], computed)


def _first_failure(checks: list[Check]) -> jax.Array:
    """One small output for all checks: `[index of the first failing one or -1, its value]`."""
    oks = jnp.stack([c.ok for c in checks])  # each compared in its index's own dtype
    bad = jnp.argmin(oks)
    # Only the value reported in the error is cast to one dtype, after the comparisons.
    value = jnp.stack([jnp.asarray(c.index).astype(_int()) for c in checks])[bad]
    return jnp.stack([jnp.where(oks[bad], -1, bad).astype(_int()), value])


def _compile_checks(closed, args: list, n_step: int, first_input: int, entries) -> ComputedChecks:
    """Compiles the part of the step's jaxpr that computes the checks, and only its inputs."""
    pruned, used = jxi.dce(closed, [False] * n_step + [True])
    keep = tuple(i for i, u in enumerate(used) if u)
    on_host = all(i >= first_input for i in keep)
    if on_host:
        cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
        specs = [jax.ShapeDtypeStruct(args[i].shape, args[i].dtype, sharding=cpu) for i in keep]
    else:
        specs = [args[i] for i in keep]
    run = jxi.as_fun(pruned)
    compiled = jax.jit(lambda *a: run(*a)[0]).lower(*specs).compile()
    return ComputedChecks(compiled, keep, first_input, on_host, entries)


class InputTooWideError(Exception):
    """An integer input does not fit JAX's int dtype (`pos=2**31`); the graph raises the coded
    error (an index error, or `GraphInputError`) once it knows how the input is used."""


def too_wide(x) -> bool:
    """Whether `x` is an integer input with a value JAX's int dtype cannot hold."""
    if type(x) is int:
        bound = 1 << (8 * _int().itemsize - 1)
        return not -bound <= x < bound
    if isinstance(x, np.integer | np.ndarray) and np.asarray(x).dtype.kind in "iu" and np.size(x):
        arr = np.asarray(x)
        info = np.iinfo(jax.dtypes.canonicalize_dtype(arr.dtype))
        return int(arr.min()) < info.min or int(arr.max()) > info.max
    return False


def raise_too_wide(graph: str, label: str, value) -> None:
    """Raises `GraphInputError` (E1410) for the input `label`, too wide for JAX's int dtype."""
    arr = np.asarray(value) if not isinstance(value, int) else None
    dtype = _int() if arr is None else np.dtype(jax.dtypes.canonicalize_dtype(arr.dtype))
    shown = f"{value}" if arr is None or arr.ndim == 0 else f"an array of {arr.min()}..{arr.max()}"
    info = np.iinfo(dtype)
    raise GraphInputError(
        f"`{graph}` got the input `{label}` = {shown}, which does not fit JAX's {dtype}"
        + ("" if dtype.itemsize == 8 else " (jax_enable_x64 is off)"),
        fix=f"pass values within {info.min}..{info.max}",
    )


def _canonical(x, graph: str, placeholder: bool):
    if type(x) is jxi.ArrayImpl or isinstance(x, jax.Array):
        if jxi.is_tracer(x):
            raise GraphInputError(
                f"`{graph}` was called with traced inputs (inside jax.jit, grad or vmap); a Graph "
                "is itself a compiled program that owns device state",
                fix="call the graph from Python, or use the pure functions it wraps (e.g. "
                "transformer.step) inside your own jit",
            )
        # A weak type (`jnp.asarray(3)`) would select another program than `np.int32(3)`.
        return jax.lax.convert_element_type(x, x.dtype) if x.weak_type else x
    if type(x) is int:  # the common per-call `pos=`: skip the generic path
        if too_wide(x):
            if placeholder:
                return np.zeros((), _int())
            raise InputTooWideError
        return np.asarray(x, _int())
    if isinstance(x, bool | int | float | complex | np.generic | np.ndarray):
        arr = np.asarray(x)
        if arr.dtype.kind not in "biufc":
            raise GraphInputError(
                f"a graph input has dtype {arr.dtype}", fix="pass numeric arrays or numbers"
            )
        dtype = jax.dtypes.canonicalize_dtype(arr.dtype)
        if arr.dtype == dtype:
            return arr
        if too_wide(arr):  # astype would wrap it around
            if placeholder:
                return np.zeros(arr.shape, dtype)
            raise InputTooWideError
        with np.errstate(over="ignore"):  # an overflow is refused below, with the value
            cast = arr.astype(dtype)
        if arr.dtype.kind in "fc" and arr.size:
            lost = np.isfinite(arr) & ~np.isfinite(cast)
            if lost.any():
                raise GraphInputError(
                    f"`{graph}` got a float input holding {arr[lost].flat[0]!r}, which does not "
                    f"fit JAX's {np.dtype(dtype).name} (jax_enable_x64 is off): it would become "
                    "inf",
                    fix=f"pass values within the range of {np.dtype(dtype).name}",
                )
        return cast
    raise GraphInputError(
        f"a graph input is a {type(x).__name__} ({x!r:.60}), not an array or a number",
        fix="pass arrays, numbers or pytrees of them; fixed configuration belongs in __init__",
    )


def canonical_inputs(graph: str, inputs: tuple, per_call: dict, *, placeholder: bool = False):
    """`(inputs, per_call)` with every leaf an array of JAX's canonical dtype, never weak-typed (a
    new value never recompiles).

    Raises:
        GraphInputError: (E1410) for a leaf that is not numeric, or a tracer.
        InputTooWideError: for an int too wide for JAX's int dtype; with `placeholder`, a zero of
            that dtype stands in for it instead.
    """
    return jax.tree.map(lambda x: _canonical(x, graph, placeholder), (inputs, per_call))


def signature(graph: str, inputs: tuple, per_call: dict) -> tuple[Signature, list]:
    """The signature that picks the compiled program, and the canonical input leaves."""
    return Signature.of(canonical_inputs(graph, inputs, per_call))
