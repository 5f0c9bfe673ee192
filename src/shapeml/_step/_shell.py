"""The one shell for stateful compiled steps: a pure step and the values it carries between calls.

Everything in shapeml that keeps values on the device between compiled calls is this shell around
one pure function `step(model, carry, *inputs) -> (outputs, carry)`: a `TrainStep` (its carry is
the model and its optimizer), a `state.Graph` (its states) and the cached decoder (its KV cache).
The step is one `jax.jit` program with the carry donated, so XLA updates it in place; the model is
uploaded once and never donated. `jax.jit` caches it: a new input signature traces it again, and a
shell of an equal step (a new `TrainStep` of the same loss and options) runs the program an earlier
one compiled. Checks in the step (`_checks.coded_check`, e.g. `state.check_index`) run inside that
program, through `checkify` (`_program.py`): the step runs only when they all pass, so a bad index
writes nothing, and the shell reads one flag per call and raises the coded error. A bounds check of
an index that is itself an input (`graph(x, pos=7)`) is recorded while tracing and run by the shell
on the concrete input before it dispatches (`_checks.host_check`): a program left without checks
returns no flag, and its calls never wait on the device. A step is traced for Auto mesh axes
whatever its values' mesh kind, and a carry spread over several CPU devices runs one step at a
time (`_devices.py` says why).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._errors import ShapemlError
from ._checks import coded_failure
from ._devices import auto_view, is_auto, paced
from ._inputs import (
    StepInputError,
    TooWideError,
    canonical_leaf,
    canonical_leaves,
    flat_signature,
    named_leaves,
    saturated,
    too_wide,
)
from ._program import CarryChangedError, Program, changes, host_key, kept

__all__ = ["CarryChangedError", "Shell", "StepInputError"]


def _owned(x: Any, sharding: Any) -> jax.Array:
    """A copy the shell owns, placed on `sharding`: its buffer is donated to every call, so the
    caller's stays valid. (On CPU, `device_put` of a numpy array may alias it: the copy is a real
    one.)"""
    return jax.jit(jnp.copy, out_shardings=sharding)(jnp.asarray(x))


class Shell:
    """A compiled pure step `step(model, carry, *inputs) -> (outputs, carry)` with its carry.

    Args:
        step: the pure function. `model` is read-only (uploaded once); `carry` is returned updated
            with the same structure, shapes and dtypes; `outputs` is any pytree of arrays. Shells
            of equal steps (a hashable step equal to another, such as a `TrainStep`'s loss and
            options) share what `jax.jit` traced and compiled for the same layout.
        model: any pytree of arrays (an `sm.Model`, a dict of them, or None).
        carry: any pytree of arrays (an `sm.Model`, a tuple of a model and its optimizer, ...),
            copied (the shell donates its own buffers to each call), keeping each leaf's placement.
        name: how errors name the step.
        copy: False when the caller hands over a carry it will not use again (device arrays that
            own their memory): the shell takes those buffers as they are.
        takes: the user's function the inputs are passed to, after the argument the step passes
            itself (a graph's `body`, a loss): each new input signature is checked against it
            when it is traced (`StepInputError`, E1410).
        keep: hold the compiled program for later shells of an equal step after this one is gone
            (`_program.kept`): for a step that is a value, not a method of an object that holds
            the carry.

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
        keep: bool = False,
    ):
        self.name = name
        leaves, self._model_def = jax.tree.flatten(model)
        # Values on a mesh with Explicit axes are kept on its Auto view (the same buffers): the
        # step's code is written for Auto axes. `carry` gives them back with their own types.
        self._explicit = not all(map(is_auto, leaves + jax.tree.leaves(carry)))
        self._model = [_auto(x) for x in leaves] if self._explicit else leaves
        leaves, self._carry_def = jax.tree.flatten(carry)
        self._typed = [getattr(x, "sharding", None) for x in leaves] if self._explicit else None
        if copy:
            leaves = [_owned(x, auto_view(jnp.asarray(x).sharding)) for x in leaves]
        self._carry = [_auto(x) for x in leaves] if self._explicit else leaves
        self._paced = paced(self._carry)  # one step at a time (`_devices.py`)
        program = Program(step, takes, name, self._model_def, self._carry_def)
        if keep:
            program = kept(program)
        # The carry keeps its placement from call to call (None: the outputs go where XLA likes).
        shardings = (None, [x.sharding for x in self._carry], None, None)
        self._host_checks = program.host_checks
        # `flat_signature -> (inputs' structure, keyword order, host checks)`: a flat call's fast
        # path, one entry per signature this shell was called with (as `jax.jit` keeps a program)
        self._fast: dict[tuple, tuple] = {}
        self._signatures: set[tuple] = set()  # the `host_key`s of the programs this shell runs
        self._jitted = jax.jit(program, static_argnums=0, donate_argnums=2, out_shardings=shardings)
        checks = Program(step, takes, name, self._model_def, self._carry_def, only_checks=True)
        self._checks = jax.jit(checks, static_argnums=0)

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
        leaves = self._carry
        if self._typed is not None:  # back to the types it came with (the same buffers)
            leaves = [x if s is None else jax.device_put(x, s) for x, s in zip(leaves, self._typed)]
        return jax.tree.unflatten(self._carry_def, leaves)

    @carry.setter
    def carry(self, carry: Any) -> None:
        """A new carry of the same structure, shapes and dtypes, placed as the old one."""
        leaves = self._same(self._carry, self._carry_def, carry, "carry")
        self._carry = [_owned(x, old.sharding) for x, old in zip(leaves, self._carry)]

    def _same(self, old: Sequence, treedef, new: Any, what: str) -> list:
        leaves, new_def = jax.tree.flatten(new)
        changed = changes(old, treedef, leaves, new_def)
        if changed:
            raise CarryChangedError(
                f"`{self.name}` was given a new {what} that differs from its old one: {changed}",
                fix=f"pass a {what} of the same structure, shapes and dtypes",
            )
        return leaves

    @property
    def compile_count(self) -> int:
        """How many programs this shell runs: one per input signature (structure, shapes and
        dtypes), whether it compiled it or a shell of an equal step did."""
        return len(self._signatures)

    # running ------------------------------------------------------------------------------------
    def __call__(self, *inputs, **kwargs):
        """Runs the step, the carry donated: its checks first, on the host for an index that is an
        input, else inside the program (a failed one raises and changes nothing). Returns the
        outputs."""
        return self.run(inputs, kwargs)

    def run(self, inputs: tuple, kwargs: dict):
        """`shell(*inputs, **kwargs)`, for a caller that holds them packed already."""
        sig = flat_signature(inputs, kwargs)
        fast = self._fast.get(sig)
        if fast is not None:  # a flat call seen before: its structure and host checks are known
            in_def, order, int_, host = fast
            try:
                leaves = [
                    np.asarray(x, int_) if type(x) is int else x
                    for x in (*inputs, *[kwargs[k] for k in order])
                ]
            except OverflowError:  # an int too wide for JAX's: the full path says which error
                fast = None
        if fast is None:
            in_def, leaves, host = self._full(inputs, kwargs, sig)
        for check in host:  # before dispatch: a failed one raises and the carry stays as it is
            check.verify(leaves)
        if self._paced:  # the previous step has finished before this one is queued
            jax.block_until_ready(self._carry)
        try:
            out, self._carry, failed, err = self._jitted(in_def, self._model, self._carry, leaves)
        except ShapemlError as e:  # raised while tracing the step (E1410, E1414, ...)
            _drop_jax_note(e)
            raise
        if failed is not None and failed:  # the program's own checks: one bool read
            _raise(err)
        return out

    def _full(self, inputs: tuple, kwargs: dict, sig: tuple) -> tuple[Any, list, tuple]:
        """The inputs' structure, their canonical leaves and the host checks of their signature
        (tracing the step for a new one); remembered for the fast path when the call is flat and
        its leaves are canonical as they came, but for Python ints (`sig`)."""
        in_def, leaves = self._inputs(inputs, kwargs)
        key = host_key(in_def, leaves)
        host = self._host_checks.get(key)
        if host is None:  # a new input signature: traced now, which records its host checks
            host = self._trace(in_def, leaves)
        self._signatures.add(key)
        if host is None:  # not recorded where this shell can see: checked by the checks program
            self._check(in_def, leaves)
            return in_def, leaves, ()
        order = sorted(kwargs)  # the order in which a dict's leaves are flattened
        flat = [*inputs, *[kwargs[k] for k in order]]
        # `sig` has no None: each input is a numpy array or an int, a leaf; the arrays unchanged
        if (
            None not in sig
            and not self._explicit
            and all(x is y for x, y in zip(flat, leaves, strict=True) if type(x) is not int)
        ):
            self._fast[sig] = (in_def, order, _int_dtype(leaves, flat), host)
        return in_def, leaves, host

    def _trace(self, in_def, leaves: list) -> tuple | None:
        """Traces the step for a new input signature (the call after runs this trace, through
        `jax.jit`'s cache) and returns the host checks it recorded (None if none is found)."""
        try:
            self._jitted.trace(in_def, self._model, self._carry, leaves)
        except ShapemlError as e:  # raised while tracing the step (E1410, E1414, ...)
            _drop_jax_note(e)
            raise
        return self._host_checks.get(host_key(in_def, leaves))

    def compiled(self, *inputs, **kwargs) -> Any:
        """The compiled step for these inputs (compiling it if needed, running nothing): a
        `jax.stages.Compiled`, whose `memory_analysis()`, `cost_analysis()` and `as_text()` show
        what XLA runs."""
        in_def, leaves = self._inputs(inputs, kwargs)
        try:
            return self._jitted.lower(in_def, self._model, self._carry, leaves).compile()
        except ShapemlError as e:
            _drop_jax_note(e)
            raise

    def check(self, *inputs, **kwargs) -> None:
        """Runs only the step's checks for these inputs: raises what a call would raise, and
        runs nothing else."""
        self._check(*self._inputs(inputs, kwargs))

    def _check(self, in_def, leaves: list) -> None:
        try:
            failed, err = self._checks(in_def, self._model, self._carry, leaves)
        except ShapemlError as e:
            _drop_jax_note(e)
            raise
        if failed is not None and failed:
            _raise(err)

    def _inputs(self, inputs: tuple, kwargs: dict) -> tuple[Any, list]:
        """The inputs' structure and their leaves made canonical (`_inputs.canonical`)."""
        leaves, in_def = jax.tree_util.tree_flatten((inputs, kwargs))
        try:
            leaves = canonical_leaves(leaves, self.name, StepInputError)
        except TooWideError:
            self._too_wide(inputs, kwargs)
        if self._explicit:
            leaves = [_auto(x) for x in leaves]
        return in_def, leaves

    def _too_wide(self, inputs: tuple, kwargs: dict) -> None:
        """Raises for an int input too wide for JAX's int dtype (`pos=2**31`): the coded error of a
        check that fails for it (E1401 when the step uses it as an index: its checks run on the
        input clipped into range, which fails them the same way), else `StepInputError` (E1410)."""
        named = named_leaves((inputs, kwargs))
        leaves, in_def = jax.tree.flatten((inputs, kwargs))
        leaves = [canonical_leaf(x, self.name, StepInputError, lenient=True) for x in leaves]
        try:
            self._check(in_def, [_auto(x) for x in leaves] if self._explicit else leaves)
        except ShapemlError as e:
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


def _auto(x):
    """`x` on its mesh's Auto view when it is on a mesh with Explicit axes (no copy)."""
    if isinstance(x, jax.Array) and not is_auto(x):
        return jax.device_put(x, auto_view(x.sharding))
    return x


def _drop_jax_note(e: BaseException) -> None:
    """Removes the note JAX adds to an error raised while tracing (that it filtered its frames):
    a shapeml error raised by the step's trace reads as it was raised."""
    notes = [
        n for n in getattr(e, "__notes__", ()) if "JAX has removed its internal frames" not in n
    ]
    if hasattr(e, "__notes__"):
        e.__notes__ = notes


def _raise(err) -> None:
    """Raises the coded error a failed check stands for (or the user's own check's error)."""
    message = err.get()
    coded = None if message is None else coded_failure(message)
    if coded is None:
        err.throw()  # a check of the user's own: checkify's error, as it reports it
    raise coded


def _int_dtype(leaves: list, inputs: list):
    """The dtype the Python ints among `inputs` became in `leaves` (None if there are none)."""
    return next((y.dtype for x, y in zip(inputs, leaves, strict=True) if type(x) is int), None)


def _shown(value) -> str:
    arr = np.asarray(value, dtype=object if type(value) is int else None)
    return f"{value}" if arr.ndim == 0 else f"an array of {arr.min()}..{arr.max()}"
