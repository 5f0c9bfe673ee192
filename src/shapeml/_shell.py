"""The one shell for stateful compiled steps: a pure step and the values it carries between calls.

Everything in shapeml that keeps values on the device between compiled calls is this shell around
one pure function `step(model, carry, *inputs) -> (outputs, carry)`: a `TrainStep` (its carry is
the model and its optimizer), a `state.Graph` (its states) and the cached decoder (its KV cache).
The step is traced once per input signature (the one compile cache, `_compile_cache.py`) and
compiled with the carry donated, so XLA updates it in place; the model is uploaded once and never
donated. Index checks in the step (`_index.check_index`) run first, as a program of their own,
so a bad index raises before anything is written. A step is traced for Auto mesh axes whatever
its inputs' mesh kind, and a carry spread over several CPU devices runs one step at a time
(`_devices.py` says why).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from . import _jax_internals as jxi
from ._compile_cache import CompileCache, Signature, is_hashable, leaf_key
from ._devices import auto_view, paced
from ._errors import ShapemlError
from ._index import (
    StateIndexError,
    checked_before_step,
    coded_check_failure,
)
from ._inputs import (
    StepInputError,
    TooWideError,
    canonical,
    canonical_leaf,
    check_call,
    named_leaves,
    saturated,
    too_wide,
)

__all__ = ["CarryChangedError", "Shell", "StepInputError"]


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


def _abstract(x) -> Any:
    """What a leaf is compiled for: its shape, dtype and, for a device array, its placement
    (on its mesh's Auto view: the step's code is written for Auto axes)."""
    if isinstance(x, jax.Array):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=auto_view(x.sharding))
    return x if isinstance(x, jax.ShapeDtypeStruct) else jax.ShapeDtypeStruct(np.shape(x), x.dtype)


def _owned(x: jax.Array) -> jax.Array:
    """A copy the shell owns: its buffer is donated to every call, so the caller's stays valid.
    (On CPU, `device_put` of a numpy array may alias it: the copy is a real one.)"""
    x = jnp.asarray(x)
    return jax.jit(jnp.copy, out_shardings=x.sharding)(x)


@dataclasses.dataclass(frozen=True)
class _Checks:
    """A step's index checks compiled on their own, and which of the step's arguments they read."""

    compiled: Any
    args: tuple[int, ...]

    def run(self, flat: Sequence) -> Any:
        """The checks' error on the host, or None when every check passed (one flag read)."""
        failed, err = self.compiled(*[flat[i] for i in self.args])
        return jax.device_get(err) if bool(failed) else None


# Programs of shells that say what their step computes (`share=`): a new `TrainStep` of the same
# loss, options, layout and batch reuses the program an earlier one compiled, as `jax.jit` reuses
# one for the same function.
_SHARED = CompileCache(None, maxsize=16)


@dataclasses.dataclass(frozen=True)
class _Program:
    """The compiled step of one input signature, and its compiled checks (None: the step has
    none)."""

    step: Any
    checks: Any
    out_def: Any  # the structure of the outputs


class Shell:
    """A compiled pure step `step(model, carry, *inputs) -> (outputs, carry)` with its carry.

    Args:
        step: the pure function. `model` is read-only (uploaded once); `carry` is returned updated
            with the same structure, shapes and dtypes; `outputs` is any pytree of arrays.
        model: any pytree of arrays (an `sm.Model`, a dict of them, or None).
        carry: any pytree of arrays (an `sm.Model`, a tuple of a model and its optimizer, ...),
            copied (the shell donates its own buffers to each call), keeping each leaf's placement.
        name: how errors name the step.
        copy: False when the caller hands over a carry it will not use again (device arrays that
            own their memory): the shell takes those buffers as they are.
        takes: the user's function the inputs are passed to, after the argument the step passes
            itself (a graph's `body`, a loss): each new input signature is checked against it
            before tracing (`StepInputError`, E1410).
        share: a hashable description of what `step` computes (e.g. its loss and options). Shells
            with equal `share` whose model, carry and inputs have the same structure, shapes,
            dtypes and placements run one compiled program. None (or an unhashable value): this
            shell compiles its own.

    Example:
        >>> shell = Shell(lambda m, total, x: (total + x @ m.w, total + x @ m.w), m, zeros)
        >>> y = shell(x)          # one compile per input signature; shell.carry is updated
    """

    def __init__(
        self,
        step: Callable,
        model: Any,
        carry: Any,
        *,
        name: str = "step",
        copy: bool = True,
        takes: Callable | None = None,
        share: Hashable | None = None,
    ):
        self.name = name
        self._fn = step
        self._takes = takes
        self._share = share if is_hashable(share) else None
        self._model, self._model_def = jax.tree.flatten(model)
        leaves, self._carry_def = jax.tree.flatten(carry)
        self._carry = [_owned(x) for x in leaves] if copy else leaves
        self._paced = paced(self._carry)  # one step at a time (`_devices.py`)
        self._programs: CompileCache[_Program] = CompileCache(self._build)

    # the values ---------------------------------------------------------------------------------
    @property
    def model(self) -> Any:
        return jax.tree.unflatten(self._model_def, self._model)

    @model.setter
    def model(self, model: Any) -> None:
        """New model values of the same structure, shapes and dtypes (no recompile)."""
        leaves = self._same(self._model, self._model_def, model, "model")
        self._model = [jax.device_put(x, old.sharding) for x, old in zip(leaves, self._model)]

    @property
    def carry(self) -> Any:
        """The carry now (its buffers are donated by the next call: copy what you keep)."""
        return jax.tree.unflatten(self._carry_def, self._carry)

    @carry.setter
    def carry(self, carry: Any) -> None:
        """A new carry of the same structure, shapes and dtypes, placed as the old one."""
        leaves = self._same(self._carry, self._carry_def, carry, "carry")
        self._carry = [
            _owned(jax.device_put(x, old.sharding)) for x, old in zip(leaves, self._carry)
        ]

    def _same(self, old: Sequence, treedef, new: Any, what: str) -> list:
        leaves, new_def = jax.tree.flatten(new)
        changed = _changes(old, treedef, leaves, new_def)
        if changed:
            raise CarryChangedError(
                f"`{self.name}` was given a new {what} that differs from its old one: {changed}",
                fix=f"pass a {what} of the same structure, shapes and dtypes",
            )
        return leaves

    @property
    def compile_count(self) -> int:
        """How many input signatures this shell has programs for (compiled by it, or by a shell
        of the same `share`)."""
        return self._programs.builds

    # running ------------------------------------------------------------------------------------
    def __call__(self, *inputs, **kwargs):
        """Runs the step: its checks first (a failed one raises and changes nothing), then the
        step itself, the carry donated. Returns the outputs."""
        program, dynamic = self._program(inputs, kwargs)
        self._check(program, dynamic)
        if self._paced:  # the previous step has finished before this one is queued
            jax.block_until_ready(self._carry)
        out, self._carry = program.step(*self._model, *self._carry, *dynamic)
        return jax.tree.unflatten(program.out_def, out)

    def compiled(self, *inputs, **kwargs) -> Any:
        """The compiled step for these inputs (compiling it if needed, running nothing): a
        `jax.stages.Compiled`, whose `memory_analysis()`, `cost_analysis()` and `as_text()` show
        what XLA runs."""
        return self._program(inputs, kwargs)[0].step

    def check(self, *inputs, **kwargs) -> None:
        """Runs only the step's checks for these inputs (compiling it if needed): raises what a
        call would raise, and runs nothing else."""
        self._check(*self._program(inputs, kwargs))

    def _program(self, inputs: tuple, kwargs: dict) -> tuple[_Program, list]:
        leaves, treedef = jax.tree.flatten((inputs, kwargs))
        try:
            leaves = [canonical_leaf(x, self.name, StepInputError) for x in leaves]
        except TooWideError:
            self._too_wide(inputs, kwargs)
        key = Signature(treedef, tuple(map(leaf_key, leaves)))
        dynamic = [leaves[i] for i in key.dynamic()]
        self._inputs = dynamic  # a new program is compiled for these inputs' placement too
        return self._programs.get(key), dynamic

    def _too_wide(self, inputs: tuple, kwargs: dict) -> None:
        """Raises for an int input too wide for JAX's int dtype (`pos=2**31`): the index error
        (E1401) when the step checks it as an index (its checks run on the input clipped into
        range, which fails them the same way), else `StepInputError` (E1410)."""
        named = named_leaves((inputs, kwargs))
        clipped = canonical(self.name, (inputs, kwargs), StepInputError, lenient=True)
        key, leaves = Signature.of(clipped)
        self._inputs = dynamic = [leaves[i] for i in key.dynamic()]
        try:
            self._check(self._programs.get(key), dynamic)
        except StateIndexError as e:
            for _, value in named:
                if too_wide(value):  # name the real value, not the clipped one
                    e.message = e.message.replace(f" {saturated(value)} ", f" {value} ")
            raise e from None
        label, value = next((n, v) for n, v in named if too_wide(v))
        raise StepInputError(
            f"`{self.name}` got the input `{label}` = {_shown(value)}, which does not fit JAX's "
            f"{saturated(value).dtype}",
            fix="pass values within that dtype's range (or enable jax_enable_x64)",
        )

    def _check(self, program: _Program, dynamic: list) -> None:
        if program.checks is None:
            return
        err = program.checks.run([*self._model, *self._carry, *dynamic])
        message = None if err is None else err.get()
        if message is not None:
            coded = coded_check_failure(message)
            if coded is None:
                err.throw()  # a check of the user's own: checkify's error, as it reports it
            raise coded

    def _build(self, key: Signature) -> _Program:
        """The program for these inputs: compiled, or one a shell of the same `share` compiled for
        the same layout (model, carry and inputs by their abstract values and placements) and
        JAX settings (x64, matmul precision, ...)."""
        if self._takes is not None:  # once per signature, outside the trace
            check_call(self.name, self._takes, *key.rebuild(self._inputs))
        if self._share is None:
            return self._compile(key)
        layout = tuple(map(_abstract, [*self._model, *self._carry, *self._inputs]))
        shared = (self._share, self._model_def, self._carry_def, layout, key, jxi.trace_context())
        return _SHARED.get(shared, lambda _: self._compile(key))

    def _compile(self, key: Signature) -> _Program:
        nm, nc = len(self._model), len(self._carry)
        record: dict[str, Any] = {}

        def flat(*args):
            model = jax.tree.unflatten(self._model_def, args[:nm])
            carry = jax.tree.unflatten(self._carry_def, args[nm : nm + nc])
            inputs, kwargs = key.rebuild(args[nm + nc :])
            out, new = self._fn(model, carry, *inputs, **kwargs)
            new_leaves, new_def = jax.tree.flatten(new)
            changed = _changes(args[nm : nm + nc], self._carry_def, new_leaves, new_def)
            if changed:
                raise CarryChangedError(
                    f"`{self.name}` returned a carry that differs from the one it was given: "
                    f"{changed}",
                    fix="return the carry with the structure, shapes and dtypes it came in with",
                )
            out_leaves, record["out"] = jax.tree.flatten(out)
            return out_leaves, new_leaves

        args = [*map(_abstract, self._model), *map(_abstract, self._carry)]
        args += [_abstract(x) for x in self._inputs]
        # The carry keeps its placement from call to call (None: the outputs go where XLA likes).
        shardings = (None, [x.sharding for x in self._carry])
        traced = jax.jit(flat, donate_argnums=tuple(range(nm, nm + nc)), out_shardings=shardings)
        with checked_before_step():  # its checks run first: no eqx.error_if in the step
            traced = traced.trace(*args)
        if not jxi.has_checks(traced.jaxpr.jaxpr):
            return _Program(traced.lower().compile(), None, record["out"])
        # The checks and the step are both compiled from the one trace (the Python step runs
        # once), each through `checkify`: the checks pruned to what they need (not the step, and
        # only the arguments they read: a check of `pos` never waits for the carry); the step
        # with its checks dropped, so it has no effects and keeps JAX's fast call path.
        closed = traced.jaxpr
        pruned, used = jxi.dce(closed, [False] * len(closed.out_avals))
        checked = checkify.checkify(jxi.as_fun(pruned), errors=checkify.user_checks)
        used = tuple(i for i, u in enumerate(used) if u)

        def only_errors(*a):
            err = checked(*a)[0]
            failed = [x for x in jax.tree.leaves(err) if x.dtype == jnp.bool_]  # its flags
            return jnp.any(jnp.stack(failed)), err

        checks = _Checks(
            jax.jit(only_errors).trace(*[args[i] for i in used]).lower().compile(), used
        )
        full = checkify.checkify(jxi.as_fun(closed), errors=checkify.user_checks)
        n_out = len(traced.out_info[0])

        def unchecked(*a):
            results = full(*a)[1]
            return list(results[:n_out]), list(results[n_out:])

        step = jax.jit(unchecked, donate_argnums=tuple(range(nm, nm + nc)), out_shardings=shardings)
        step = step.trace(*args).lower().compile()
        return _Program(step, checks, record["out"])


def _shown(value) -> str:
    arr = np.asarray(value, dtype=object if type(value) is int else None)
    return f"{value}" if arr.ndim == 0 else f"an array of {arr.min()}..{arr.max()}"


def _changes(old: Sequence, old_def, new: Sequence, new_def) -> str:
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
