"""`Graph`: a compiled body that owns weights, uploaded once, and state, kept on the device.

A call flattens its inputs, finds (or traces and compiles, once per input signature) the program
`step(weights, state, inputs) -> (outputs, new state, index checks)`, checks the per-call indices
on the host, and runs it with the state's buffers donated, so XLA updates the state in place.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _jax_internals as jxi
from .._errors import similar
from . import _index
from ._decl import Decl, ParamDecl
from ._errors import (
    GraphBodyError,
    GraphDeclarationError,
    GraphInputError,
    StateNotFoundError,
    WeightWriteError,
)
from ._frame import Frame, active_frame
from ._handles import ParamHandle, StateHandle
from ._reference import normalize_inputs, run_reference
from ._store import Store

__all__ = ["Graph"]


@dataclasses.dataclass
class _Program:
    compiled: Any
    rules: list[_index.HostRule]
    checks: list[tuple[str, int, int]]  # (what, size, extent) of each in-program check


class Graph:
    """A compiled function that holds weights and device-resident state.

    Subclass it, declare weights with `param` and state with `state` in `__init__` (no
    `super().__init__()` needed), and write `body(self, *inputs, **per_call)`. Calling the graph
    compiles `body` once per input signature (shapes and dtypes) and runs it; every input,
    per-call scalars such as `pos` included, is a traced value, so new values never recompile.

    Inside `body`, `self.w` is the weight's value, `self.total` a view of the state:
    `self.total[pos]` reads a row, `self.total[pos] = new` writes one (checked for shape and dtype
    when traced, and bounds-checked, never clamped), `self.total = new` replaces it whole.

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
    """

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls)
        object.__setattr__(self, "_store", Store(cls.__name__))
        object.__setattr__(self, "_programs", {})
        object.__setattr__(self, "_compile_count", 0)
        return self

    def body(self, *inputs, **per_call):
        raise GraphBodyError(
            f"`{type(self).__name__}` does not define body(self, *inputs, **per_call)",
            fix="add a method `def body(self, x, *, pos): ...` to the subclass",
        )

    # attributes: declarations, handles, and in-body values ------------------------------------
    def __setattr__(self, name: str, value) -> None:
        store: Store = self._store
        frame = active_frame(self)
        if frame is not None and name in store.decls:
            if name in store.params:
                raise WeightWriteError(
                    f"`{type(self).__name__}.body` assigned to the weight `{name}`",
                    fix="keep a changing tensor in a state(...); bind new weights with "
                    "load_state_dict",
                )
            frame.assign(name, value)
            return
        if isinstance(value, Decl):
            store.declare(name, value)
            return
        if name in store.decls:
            raise GraphDeclarationError(
                f"`{type(self).__name__}.{name}` is a declared "
                f"{'weight' if name in store.params else 'state'} and cannot be reassigned "
                "outside body",
                fix="write state inside body, or use reset() / load_state_dict({...})",
            )
        object.__setattr__(self, name, value)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        store: Store = object.__getattribute__(self, "_store")
        if name not in store.decls:
            known = [*store.decls, *type(self).__dict__]
            raise StateNotFoundError(
                f"`{type(self).__name__}` has no attribute, weight or state `{name}`",
                fix=similar(name, known) or "declare it in __init__ with param(...) or state(...)",
            )
        frame = active_frame(self)
        if frame is not None:
            return frame.params[name] if name in store.params else frame.state(name)
        return ParamHandle(store, name) if name in store.params else StateHandle(store, name)

    # host access --------------------------------------------------------------------------------
    @property
    def compile_count(self) -> int:
        """How many times `body` was traced and compiled (once per new input signature)."""
        return self._compile_count

    def read(self, name: str):
        """A host numpy copy of the device state `name` (a pytree of them for a pytree state)."""
        return self._store.read(self._state_attr(name))

    def reset(self, *names: str) -> None:
        """Zeroes the named states (all by default), on the device and in the host mirror."""
        attrs = [self._state_attr(n) for n in names] or list(self._store.states)
        self._store.reset(attrs)

    def state_dict(self) -> dict[str, np.ndarray]:
        """Host copies of every bound weight and every state, keyed by dotted name."""
        return self._store.state_dict()

    def load_state_dict(self, entries: dict[str, Any]) -> None:
        """Binds weights (and, when given, states) by dotted name, all or nothing.

        Every declared weight must be present; states are optional. Each array must have the
        declared shape; a float weight takes any float or int array, cast to its dtype.

        Raises:
            LoadStateDictError: (E1405) listing every missing, unexpected (with near-miss names)
                and wrong-shape or wrong-kind entry; nothing is loaded then.
        """
        self._store.load(entries)

    def _state_attr(self, name: str) -> str:
        attr = self._store.attr_of(name)
        if attr not in self._store.states:
            raise StateNotFoundError(
                f"`{name}` is a weight of `{type(self).__name__}`, not a state",
                fix=f"read a weight with graph.{attr}.host",
            )
        return attr

    # running ------------------------------------------------------------------------------------
    def reference(self, *inputs, **per_call):
        """Runs `body` eagerly on the host, against the host mirror of the state (`.host`).

        Nothing is compiled: the body can be stepped through and can print. Inputs are cast to
        the dtypes the compiled path would see, and every value the body sees (inputs, weights,
        state reads) is an eager JAX array on the host CPU, so annotated functions accept it.
        Array states are mirrored in numpy (`graph.total.host`), separately from the device
        state (`graph.read("total")`), so the two paths can be run side by side and compared.
        Results come back as numpy.
        """
        return run_reference(self, self._store, type(self).body, inputs, per_call)

    def __call__(self, *inputs, **per_call):
        store: Store = self._store
        leaves, key = normalize_inputs(inputs, per_call)
        if any(jxi.is_tracer(x) for x in leaves):
            raise GraphInputError(
                f"`{type(self).__name__}` was called with traced inputs (inside jax.jit, grad or "
                "vmap); a Graph is itself a compiled program that owns device state",
                fix="call the graph from Python, or use the pure functions it wraps (e.g. "
                "transformer.step) inside your own jit",
            )
        weights = store.device_param_leaves()
        states = store.device_state_leaves()
        program = self._programs.get(key)
        if program is None:
            program = self._compile(weights, states, leaves, key[0])
            self._programs[key] = program
        for rule in program.rules:
            value = int(np.asarray(leaves[rule.leaf]))
            if value < 0 or value + rule.extent > rule.size:
                _index.raise_index_error(rule.what, rule.size, rule.extent, value, rule.arg)
        # Flat leaves, not pytrees: the fastest path through JAX's dispatch.
        results = program.compiled(*weights, *states, *leaves)
        out = results[0]
        store.set_device_state_leaves(results[1])
        if program.checks:
            oks, values = np.asarray(results[2]), results[3]
            if not oks.all():
                bad = int(np.argmin(oks))
                what, size, extent = program.checks[bad]
                _index.raise_index_error(what, size, extent, int(np.asarray(values)[bad]))
        return out

    def _compile(self, weights, states, leaves, treedef) -> _Program:
        store: Store = self._store
        store.sealed = True
        record: dict[str, Any] = {}
        nw, ns = len(weights), len(states)

        def step(*flat):
            object.__setattr__(self, "_compile_count", self._compile_count + 1)
            weight_leaves, state_leaves = flat[:nw], flat[nw : nw + ns]
            args, kwargs = jax.tree_util.tree_unflatten(treedef, flat[nw + ns :])
            direct = _index.direct_inputs((args, kwargs))
            sink = _index.Sink(direct)
            out, new = self._run_traced(sink, weight_leaves, state_leaves, args, kwargs)
            record["rules"] = sink.rules
            record["checks"] = [(c.what, c.size, c.extent) for c in sink.checks]
            if not sink.checks:
                return out, new
            # Run the body again with every write gated on all of this call's checks passing;
            # XLA keeps only the index arithmetic of the first run.
            oks = jnp.stack([c.ok for c in sink.checks])
            values = jnp.stack([c.value for c in sink.checks])
            gated = _index.Sink(direct, ok_all=jnp.all(oks))
            out, new = self._run_traced(gated, weight_leaves, state_leaves, args, kwargs)
            return out, new, oks, values

        jitted = jax.jit(step, donate_argnums=tuple(range(nw, nw + ns)))
        compiled = jitted.trace(*weights, *states, *leaves).lower().compile()
        return _Program(compiled, record["rules"], record["checks"])

    def _run_traced(self, sink, weight_leaves, state_leaves, args, kwargs):
        store: Store = self._store
        params, at = {}, 0
        for attr, decl in store.params.items():
            n = len(decl.shapes)
            params[attr] = _build(decl, weight_leaves[at : at + n])
            at += n
        states, at = {}, 0
        for attr, decl in store.states.items():
            n = len(decl.shapes)
            states[attr] = _build(decl, state_leaves[at : at + n])
            at += n
        frame = Frame(self, "trace", params, states, store.states)
        _index.push_sink(sink)
        try:
            with frame:
                out = type(self).body(self, *args, **kwargs)
        finally:
            _index.pop_sink()
        new = []
        for attr, decl in store.states.items():
            leaves = decl.split(frame.states[attr])
            if decl.sharding is not None:
                leaves = [jax.lax.with_sharding_constraint(x, decl.sharding) for x in leaves]
            new += [jnp.asarray(x) for x in leaves]
        return out, new

    def __repr__(self) -> str:
        store: Store = self._store
        parts = [
            f"{'param' if isinstance(d, ParamDecl) else 'state'} {d.name}"
            for d in store.decls.values()
        ]
        return f"{type(self).__name__}({', '.join(parts)})"


def _build(decl: Decl, leaves):
    return leaves[0] if decl.is_array else decl.build(leaves)
