"""`Graph`: a thin shell that owns weights (uploaded once) and states (kept on the device) around
one pure step, `(weights, states, *inputs) -> (outputs, states, index checks)`.

The step is traced once per input signature and compiled with the states' buffers donated, so XLA
updates them in place; its index checks run first (`_program`); `shapeml._compile_cache` keys the
programs. The states are one `sm.Model` (`graph.states`), saved with `sm.save`. `reference` runs
the same step eagerly on the host.
"""

from __future__ import annotations

import inspect
import typing
from typing import Any

import jax
import numpy as np

from .._compile_cache import CompileCache, Signature
from .._errors import similar
from ..models import Model
from ..models._introspect import dotted_name
from ._decl import Decl, ParamDecl, StateDecl, check_field_names
from ._errors import (
    GraphBodyError,
    GraphDeclarationError,
    GraphInputError,
    StateNotFoundError,
    WeightWriteError,
)
from ._handles import ParamHandle, StateHandle
from ._index import IndexChecks, raise_index_error
from ._program import (
    InputTooWideError,
    Program,
    canonical_inputs,
    compile_program,
    raise_too_wide,
    signature,
    too_wide,
)
from ._step import Step, bind_caches
from ._storage import Storage

__all__ = ["Graph"]


class Graph:
    """A compiled function that holds weights and device-resident state.

    Subclass it, declare weights with `param` and state with `state` in `__init__` (no
    `super().__init__()` needed), and write `body(self, *inputs, **per_call)`. Calling the graph
    compiles `body` once per input signature (shapes and dtypes) and runs it; every input,
    per-call scalars such as `pos` included, is a traced value, so new values never recompile.

    Inside `body`, `self.w` is the weight's value, `self.total` a view of the state:
    `self.total[pos]` reads a row, `self.total[pos] = new` writes one (checked for shape and dtype
    when traced, and bounds-checked, never clamped), `self.total = new` replaces it whole. While
    `body` runs, `self._step` is that run's `Step`: the values and checks `self.<name>` refers to.

    Example:
        >>> class Accumulate(Graph):
        ...     def __init__(self, rows, width):
        ...         self.total = state((rows, width), name="total")
        ...     def body(self, x, *, pos):
        ...         new = x + self.total[pos]
        ...         self.total[pos] = new
        ...         return new
        >>> acc = Accumulate(16, 4)
        >>> acc(np.ones(4, np.float32), pos=3)            # doctest: +SKIP
        >>> acc.read("total")[3]                          # a host copy of the device state
        >>> sm.save("acc.safetensors", acc.states)        # the states as an sm.Model
    """

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls)
        object.__setattr__(self, "_storage", Storage(cls.__name__))
        object.__setattr__(self, "_step", None)  # the Step of the body running now, if any
        object.__setattr__(self, "_programs", CompileCache(self._compile))
        return self

    def body(self, *inputs, **per_call):
        raise GraphBodyError(
            f"`{type(self).__name__}` does not define body(self, *inputs, **per_call)",
            fix="add a method `def body(self, x, *, pos): ...` to the subclass",
        )

    # attributes: declarations, handles, and in-body values ------------------------------------
    def __setattr__(self, name: str, value) -> None:
        decls = self._storage.decls
        if self._step is not None and name in decls:
            if isinstance(decls[name], ParamDecl):
                raise WeightWriteError(
                    f"`{type(self).__name__}.body` assigned to the weight `{name}`",
                    fix="keep a changing tensor in a state(...); bind new weights with "
                    "load_state_dict",
                )
            self._step.assign(name, value)
            return
        if isinstance(value, Decl):
            self._declare(name, value)
            return
        if name in decls:
            kind = "weight" if isinstance(decls[name], ParamDecl) else "state"
            raise GraphDeclarationError(
                f"`{type(self).__name__}.{name}` is a declared {kind} and cannot be reassigned "
                "outside body",
                fix="write state inside body, or use reset() / load_state_dict({...})",
            )
        object.__setattr__(self, name, value)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        storage: Storage = object.__getattribute__(self, "_storage")
        if name not in storage.decls:
            raise StateNotFoundError(
                f"`{type(self).__name__}` has no attribute, weight or state `{name}`",
                fix=similar(name, [*storage.decls, *type(self).__dict__])
                or "declare it in __init__ with param(...) or state(...)",
            )
        step = object.__getattribute__(self, "_step")
        if step is not None:
            return step.get(name)
        is_param = isinstance(storage.decls[name], ParamDecl)
        return (ParamHandle if is_param else StateHandle)(storage, name)

    def _declare(self, attr: str, decl: Decl) -> None:
        where = f"`{type(self).__name__}.{attr}`"
        if self._storage.sealed:
            raise GraphDeclarationError(
                f"{where} was declared after the graph was first called",
                fix="declare every param and state in __init__, before the first call",
            )
        if hasattr(type(self), attr):  # `self.<attr>` would find the class's, not the declaration
            owner = "Graph" if hasattr(Graph, attr) else type(self).__name__
            raise GraphDeclarationError(
                f"{where} would hide the {owner} attribute `{attr}`",
                fix=f"give the declaration another attribute name than `{attr}`",
            )
        decl.name = decl.name or attr
        if isinstance(decl, StateDecl):
            check_field_names(type(self).__name__, decl)
        self._storage.declare(attr, decl)

    # host access --------------------------------------------------------------------------------
    @property
    def compile_count(self) -> int:
        """How many times `body` was traced and compiled (once per new input signature)."""
        return self._programs.builds

    @property
    def states(self) -> Model:
        """A snapshot of every state as one `sm.Model` (class `<Graph>State`), a buffer per state
        named like `state_dict()`: `sm.save(path, graph.states)` saves them, and
        `graph.load_states(sm.load(path, like=graph.states))` brings them back."""
        return self._storage.state_model(copy=True)

    def load_states(self, states: Any) -> None:
        """Sets every state from an `sm.Model` like `graph.states` (e.g. from `sm.load`).

        `states` is annotated `Any` so that anything else (a dict meant for `load_state_dict`)
        gets the coded error below, with its fix, rather than a bare type-checker error.

        Raises:
            LoadStateDictError: (E1405) listing every missing, unexpected or wrong-shape buffer;
                nothing is loaded then.
        """
        self._storage.load_states(states)

    @typing.no_type_check  # validates its arguments itself, with coded errors
    def read(self, name: str):
        """A host numpy copy of the device state `name` (a pytree of them for a pytree state)."""
        return self._storage.read(self._storage.state_attr(name))

    @typing.no_type_check  # validates its arguments itself, with coded errors
    def reset(self, *names: str) -> None:
        """Zeroes the named states (all by default), on the device and in the host mirror."""
        self._storage.reset([self._storage.state_attr(n) for n in names])

    def state_dict(self) -> dict[str, np.ndarray]:
        """Host copies of every bound weight and every state, keyed by dotted name."""
        return self._storage.state_dict()

    @typing.no_type_check  # validates its argument itself (E1405 for anything but a dict)
    def load_state_dict(self, entries: dict[str, Any]) -> None:
        """Binds weights (and, when given, states) by dotted name, all or nothing.

        Every declared weight must be present; states are optional. Each array must have the
        declared shape; a float weight takes any float or int array, cast to its dtype.

        Raises:
            LoadStateDictError: (E1405) listing every missing, unexpected (with near-miss names)
                and wrong-shape or wrong-kind entry; nothing is loaded then.
        """
        self._storage.load(entries, require="weights")

    # running ------------------------------------------------------------------------------------
    def _pure_step(self, weights: dict[str, Any], states: Model, inputs, *, traced: bool):
        """The one pure function behind a call: `(weights, states, (args, kwargs)) ->
        (outputs, states, checks)`, `checks` being this run's `IndexChecks` for the caller to act
        on. Traced once per input signature by `__call__`; run eagerly by `reference`. No
        `KVCache` leaves it still bound to `checks`: they are this run's alone."""
        if self._step is not None:
            raise GraphBodyError(
                f"`{type(self).__name__}.body` ran the graph again from inside itself",
                fix="call helper functions from body, not the graph",
            )
        storage: Storage = self._storage
        by_name = {dotted_name(p): x for p, x in jax.tree_util.tree_flatten_with_path(states)[0]}
        values = {attr: storage.build_state(attr, by_name) for attr in storage.state_decls}
        checks = IndexChecks(_named_leaves(inputs))
        run = Step(storage.decls, weights, values, checks)
        args, per_call = inputs
        _check_call(type(self), args, per_call)
        object.__setattr__(self, "_step", run)
        try:
            out = type(self).body(self, *args, **per_call)
        finally:
            object.__setattr__(self, "_step", None)
        new = storage.state_like(states, run.states, constrain=traced)  # leaves only, by name
        return bind_caches(out, None), new, checks

    def reference(self, *inputs, **per_call):
        """Runs `body` eagerly on the host, against the host mirror of the state (`.host`).

        Nothing is compiled: the body can be stepped through and can print. Inputs are cast to
        the dtypes the compiled path would see, and every value the body sees (inputs, weights,
        state reads) is an eager JAX array on the host CPU, so annotated functions accept it.
        The mirror (`graph.total.host`) is separate from the device state
        (`graph.read("total")`), so the two paths can be run side by side and compared; it is
        changed only when the body returns. Results come back as numpy.
        """
        cpu = jax.devices("cpu")[0]
        try:
            canonical = canonical_inputs(type(self).__name__, inputs, per_call)
        except InputTooWideError:
            self._too_wide(inputs, per_call)
        args, kwargs = jax.device_put(canonical, cpu)
        storage: Storage = self._storage
        with jax.default_device(cpu):
            host = storage.host_weights(), storage.host_model()
            out, new, _ = self._pure_step(*host, (args, kwargs), traced=False)
        storage.set_host_model(new)
        return jax.tree.map(np.asarray, out)

    def __call__(self, *inputs, **per_call):
        try:
            key, leaves = signature(type(self).__name__, inputs, per_call)
        except InputTooWideError:
            self._too_wide(inputs, per_call)
        program: Program = self._programs.get(key)
        storage: Storage = self._storage
        # Flat leaves, not pytrees: the fastest path through JAX's dispatch.
        out, states = program.run(storage.weight_leaves(), storage.state_leaves(), leaves)
        storage.set_state_leaves(states)
        return out

    def _too_wide(self, inputs: tuple, per_call: dict) -> None:
        """Raises for an int input too wide for JAX's int dtype (`pos=2**31`): the index error
        (E1401) when the step checks that input as an index, else `GraphInputError` (E1410).
        The body is traced (not compiled, not run) with a zero in its place to find out."""
        named = _named_leaves((inputs, per_call))
        wide = [i for i, (_, x) in enumerate(named) if too_wide(x)]
        stand_in = canonical_inputs(type(self).__name__, inputs, per_call, placeholder=True)
        found = []

        def probe(weights, states, given):
            out, new, checks = self._pure_step(weights, states, given, traced=False)
            found.extend(c for c in checks.entries if c.input in wide)
            return out, new

        storage: Storage = self._storage
        jax.eval_shape(probe, storage.device_weights(), storage.state_model(copy=False), stand_in)
        for check in found:
            value = int(named[check.input][1])
            raise_index_error(check.what, check.size, check.extent, value, check.source)
        raise_too_wide(type(self).__name__, *named[wide[0]])

    def _compile(self, key: Signature) -> Program:
        storage: Storage = self._storage
        storage.sealed = True
        weights, weight_def = jax.tree.flatten(storage.device_weights())
        states, state_def = storage.state_leaves(), storage.state_def()
        nw, ns = len(weights), len(states)

        def trees(flat):
            return (
                jax.tree.unflatten(weight_def, flat[:nw]),
                jax.tree.unflatten(state_def, flat[nw : nw + ns]),
                jax.tree.unflatten(key.treedef, flat[nw + ns :]),
            )

        pure = lambda w, s, inputs: self._pure_step(w, s, inputs, traced=True)  # noqa: E731
        return compile_program(pure, weights, states, key, unflatten=trees)

    def __repr__(self) -> str:
        parts = [
            f"{'param' if isinstance(d, ParamDecl) else 'state'} {d.name}"
            for d in self._storage.decls.values()
        ]
        return f"{type(self).__name__}({', '.join(parts)})"


def _check_call(cls: type, args: tuple, per_call: dict) -> None:
    """Raises `GraphInputError` (E1410) when the call does not fit `body`'s signature (a missing
    `pos=`, an unknown keyword), before the body runs: its own TypeErrors stay its own."""
    try:
        sig = inspect.signature(cls.body)
    except (TypeError, ValueError):  # a body without a signature: nothing to check against
        return
    try:
        sig.bind(None, *args, **per_call)
    except TypeError as e:
        raise GraphInputError(
            f"`{cls.__name__}` was called with {len(args)} input(s) and keywords "
            f"{sorted(per_call)}, which do not fit `body{sig}`: {e}",
            fix=f"call the graph as `body{sig}` takes them, without `self`",
        ) from None


def _named_leaves(inputs) -> list[tuple[str, Any]]:
    """`(name, leaf)` for `(args, kwargs)`: the keyword (`pos`), or `input N`, plus any path."""
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(inputs)[0]:
        head, first, rest = path[0].idx, path[1], path[2:]
        label = f"input {first.idx}" if head == 0 else str(first.key)
        out.append((label + "".join(str(k) for k in rest), leaf))
    return out
