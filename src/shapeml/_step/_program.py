"""The function a shell's `jax.jit` compiles: the pure step on flat leaves, with its checks inside.

Equal for equal steps; the shells of equal steps that are values (a `TrainStep`'s loss and
options) run one kept object (`kept`), whose trace and compiled program `jax.jit` caches. The
step's checks (`_checks.coded_check`) are computed first, through `checkify`, and the step runs
only when they all pass. Bounds checks of an input as it came are recorded for the shell to run
on the host instead (`host_checks`).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from .. import _jax_internals as jxi
from .._errors import ShapemlError
from ._checks import StepTrace, tracing_step
from ._inputs import check_call

__all__ = ["CarryChangedError", "Program", "changes", "host_key", "kept"]


class CarryChangedError(
    ShapemlError,
    ValueError,
    code="E1414",
    title="a step changed the structure of what it carries",
    explanation="""
A stateful step must return its carry with the same structure, shapes and dtypes it was given: the
carry's buffers are donated and updated in place, and the next call is compiled for them. A loss
that returns an updated model (BatchNorm's running statistics) must return a model of the same
class and dims, each buffer in its declared dtype; a graph's body must write each state with its
declared shape and dtype. The message lists the entries that changed.
""",
):
    pass


class Program:
    """The function `jax.jit` compiles for a shell: the step on flat leaves, its checks inside.

    Equal to another for an equal step, name, layout and mode, so that the shells of equal steps
    (two `TrainStep`s of one loss and its options) can run one object (`kept`), and with it the
    trace and program `jax.jit` cached for it. With `only_checks`, it computes the checks' error
    alone (XLA drops the rest of the step).
    """

    def __init__(self, step, takes, name, model_def, carry_def, only_checks=False):
        self.step, self.takes, self.name = step, takes, name
        self.model_def, self.carry_def, self.only_checks = model_def, carry_def, only_checks
        key = (step, takes, name, model_def, carry_def, only_checks)
        try:
            self._hash = hash(key)
            self._key = key
        except TypeError:  # an unhashable step: this shell's own program
            self._hash, self._key = id(self), object()
        # The host checks each trace recorded, by `host_key`: metadata of a trace, not a compile
        # cache (`jax.jit` keeps the programs). Shared by equal programs, since `jax.jit` runs a
        # trace of one for the others without running Python.
        self.host_checks = _HOST_CHECKS.setdefault(self, {})

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return isinstance(other, Program) and self._key == other._key

    def __call__(self, in_def, model: list, carry: list, inputs: list):
        """Traced by `jax.jit`: `(outputs, new carry leaves, failed, error)`, with `failed` and
        `error` None for a step without checks. With `only_checks`, `(failed, error)`."""
        if self.takes is not None:  # once per trace: a new input signature
            check_call(self.name, self.takes, *jax.tree.unflatten(in_def, inputs))
        out_def = []
        trace = StepTrace(host=not self.only_checks)  # the checks program keeps every check

        def run(model, carry, inputs):
            trace.inputs = inputs
            args, kwargs = jax.tree.unflatten(in_def, inputs)
            out, new = self.step(
                jax.tree.unflatten(self.model_def, model),
                jax.tree.unflatten(self.carry_def, carry),
                *args,
                **kwargs,
            )
            new_leaves, new_def = jax.tree.flatten(new)
            changed = changes(carry, self.carry_def, new_leaves, new_def)
            if changed:
                raise CarryChangedError(
                    f"`{self.name}` returned a carry that differs from the one it was given: "
                    f"{changed}",
                    fix="return the carry with the structure, shapes and dtypes it came in with",
                )
            out_leaves, tree = jax.tree.flatten(out)
            out_def.append(tree)
            return out_leaves, new_leaves

        with tracing_step(trace):  # the checks are in this program: no eqx.error_if in the step
            closed = jax.make_jaxpr(run)(model, carry, inputs)
        if trace.host is not None:  # each check once (a row read, then written: one check)
            self.host_checks[host_key(in_def, inputs)] = tuple(dict.fromkeys(trace.host))
            # This trace may be the one later equal programs run (its first tracer has gone).
            _HOST_CHECKS.setdefault(self, self.host_checks)
        flat_args = [*model, *carry, *inputs]
        n_out = len(closed.out_avals) - len(carry)
        if not jxi.has_checks(closed.jaxpr):
            if self.only_checks:
                return None, None
            results = jxi.as_fun(closed)(*flat_args)
            return jax.tree.unflatten(out_def[0], results[:n_out]), results[n_out:], None, None
        # The checks alone (pruned to the arguments they read), then the step only if they pass.
        pruned, used = jxi.dce(closed, [False] * len(closed.out_avals))
        args = [x for x, u in zip(flat_args, used, strict=True) if u]
        err = checkify.checkify(jxi.as_fun(pruned), errors=checkify.user_checks)(*args)[0]
        flags = [x for x in jax.tree.leaves(err) if x.dtype == jnp.bool_]
        failed = jnp.any(jnp.stack(flags))
        if self.only_checks:
            return failed, err
        checked = checkify.checkify(jxi.as_fun(closed), errors=checkify.user_checks)

        def step(state):  # its checks passed: checkify drops them from the program
            return [jnp.bool_(False), *checked(*model, *state[1 + n_out :], *inputs)[1]]

        # Run at most once: a `while_loop`, not a `lax.cond`, because XLA updates a loop's state
        # in place, while a cond whose other branch passes the carry through copies all of it.
        # A failed check leaves zero outputs and the carry as it came.
        zeros = [jnp.zeros(a.shape, a.dtype) for a in closed.out_avals[:n_out]]
        state = [~failed, *zeros, *carry]
        results = jax.lax.while_loop(lambda state: state[0], step, state)[1:]
        return jax.tree.unflatten(out_def[0], results[:n_out]), results[n_out:], failed, err


# The latest programs of steps that are values (a `TrainStep`'s loss and options), held so that a
# new equal step runs the same object, and `jax.jit` its cached program, also after the last step
# that ran it is gone (`train(...)` called again makes a new step). The oldest goes first.
_KEPT: OrderedDict[Program, Program] = OrderedDict()
_KEEP = 16


def kept(program: Program) -> Program:
    """The kept program equal to `program` (else `program`, kept from now on): the one object
    `jax.jit` compiled for, held among the latest `_KEEP`. An unhashable step's is not kept."""
    if not isinstance(program._key, tuple):  # never equal to another: nothing to find again
        return program
    program = _KEPT.pop(program, program)
    _KEPT[program] = program
    while len(_KEPT) > _KEEP:
        _KEPT.popitem(last=False)
    return program


# Each program's host checks (`host_key -> tuple[HostCheck, ...]`), found by an equal program,
# while the program lives: weak, so a shell and its carry go with their program.
_HOST_CHECKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def host_key(in_def, leaves: Sequence) -> tuple:
    """What a trace's host checks are keyed by: what the shell passes `jax.jit` as its static
    argument (the inputs' structure) and the inputs' shapes and dtypes (a check's bounds may
    depend on them: `span(pos, x.shape[0])`)."""
    return in_def, *[(x.shape, x.dtype) for x in leaves]


def changes(old: Sequence, old_def, new: Sequence, new_def) -> str:
    """What differs between two flattened carries (structure, shapes, dtypes), or ""."""
    if old_def != new_def:
        return f"its structure {new_def} is not {old_def}"
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(
        jax.tree.unflatten(old_def, old))[0]]  # fmt: skip
    diffs = [
        f"{path or 'carry'}: {tuple(np.shape(b))} {jnp.result_type(b)} instead of "
        f"{tuple(np.shape(a))} {jnp.result_type(a)}"
        for path, a, b in zip(paths, old, new, strict=True)
        if np.shape(a) != np.shape(b) or jnp.result_type(a) != jnp.result_type(b)
    ]
    return "; ".join(diffs[:8]) + (f" (and {len(diffs) - 8} more)" if len(diffs) > 8 else "")
