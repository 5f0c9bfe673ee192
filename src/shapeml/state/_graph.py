"""`Graph`: weights uploaded once and states kept on the device, around one pure step.

A graph is the one shell (`shapeml._step.Shell`) around `(weights, states, *inputs) -> (outputs,
states)`: its weights are the shell's model (a dict of the declared values), its states one
`sm.Model` (`graph.states`), the shell's carry, donated to each call. The body runs on a per-run
view of the graph, on which `self.<name>` is that run's value; the graph itself never changes
while a body runs. `reference` runs the same step eagerly on the host, against a host copy of the
states.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from .._errors import similar
from .._step._inputs import StepInputError as GraphInputError
from .._step._inputs import TooWideError, canonical, check_call
from .._traceback import api_boundary
from ._access import GraphAccess
from ._body import Run
from ._decl import Declared, check_names
from ._errors import (
    GraphBodyError,
    GraphDeclarationError,
    StateNotFoundError,
    WeightWriteError,
)
from ._index import coded_runtime_failure

__all__ = ["Graph"]


@api_boundary
class Graph(GraphAccess):
    """A compiled function that holds weights and device-resident state.

    Subclass it, declare weights with `param` and state with `state` in `__init__` (no
    `super().__init__()` needed), and write `body(self, *inputs, **per_call)`. Calling the graph
    compiles `body` once per input signature (shapes and dtypes) and runs it; every input,
    per-call scalars such as `pos` included, is a traced value, so new values never recompile.

    Inside `body`, `self.w` is the weight's value and `self.total` a view of the state:
    `self.total[pos]` reads a row, `self.total[pos] = new` writes one (checked for shape and dtype
    when traced, and bounds-checked before the step runs, never clamped), `self.total = new`
    replaces it whole.

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
        self.__dict__.update(_decls={}, _unbound=set(), _shell=None, _host=None, _run=None)
        return self

    def body(self, *inputs, **per_call):
        """The step, written by the subclass: reads and writes `self.<state>`, returns outputs."""
        raise GraphBodyError(
            f"`{type(self).__name__}` does not define body(self, *inputs, **per_call)",
            fix="add a method `def body(self, x, *, pos): ...` to the subclass",
        )

    # attributes: declarations, handles, and in-body values ------------------------------------
    def __setattr__(self, name: str, value) -> None:
        decls: dict[str, Declared] = self._decls
        run: Run | None = self._run
        if run is not None and name in decls:
            if decls[name].kind == "param":
                raise WeightWriteError(
                    f"`{type(self).__name__}.body` assigned to the weight `{name}`",
                    fix="keep a changing tensor in a state(...); bind new weights with "
                    "load_state_dict",
                )
            run.assign(name, value)
        elif isinstance(value, Declared):
            self._declare(name, value)
        elif run is not None:  # a plain attribute set in body: on this view and on the graph
            object.__setattr__(self, name, value)
            object.__setattr__(self.__dict__["_origin"], name, value)
        elif name in decls:
            raise GraphDeclarationError(
                f"`{type(self).__name__}.{name}` is a declared {decls[name].kind} and cannot be "
                "reassigned outside body",
                fix="write state inside body, or use reset() / load_state_dict({...})",
            )
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        decls = self.__dict__["_decls"]
        if name not in decls:
            raise StateNotFoundError(
                f"`{type(self).__name__}` has no attribute, weight or state `{name}`",
                fix=similar(name, [*decls, *type(self).__dict__])
                or "declare it in __init__ with param(...) or state(...)",
            )
        run = self.__dict__["_run"]
        return run.get(name) if run is not None else self._handle(name)

    def _declare(self, attr: str, decl: Declared) -> None:
        where = f"`{type(self).__name__}.{attr}`"
        if self._shell is not None:
            raise GraphDeclarationError(
                f"{where} was declared after the graph was first called (or its states first "
                "read): its states are made then",
                fix="declare every param and state in __init__, before the first call",
            )
        if hasattr(type(self), attr):  # `self.<attr>` would find the class's, not the declaration
            owner = "Graph" if hasattr(Graph, attr) else type(self).__name__
            raise GraphDeclarationError(
                f"{where} would hide the {owner} attribute `{attr}`",
                fix=f"give the declaration another attribute name than `{attr}`",
            )
        decl.name = decl.name or attr
        if decl.kind == "state":
            check_names(type(self).__name__, decl)
        for other_attr, other in self._decls.items():
            if other_attr != attr and other.name == decl.name:
                raise GraphDeclarationError(
                    f"`{type(self).__name__}` declares the name `{decl.name}` twice "
                    f"(attributes `{other_attr}` and `{attr}`)",
                    fix="give each state its own name=",
                )
        self._decls[attr] = decl
        if decl.kind == "param" and decl.value is None:
            self._unbound.add(attr)

    # running ------------------------------------------------------------------------------------
    @property
    def compile_count(self) -> int:
        """How many programs the graph runs: `body` compiled once per input signature."""
        return 0 if self._shell is None else self._shell.compile_count

    def _pure(self, weights: dict[str, Any], states, *args, **per_call):
        """The one pure step: `(weights, states, *inputs) -> (outputs, states)`."""
        run = Run(self._decls, weights, self._unpack(states))
        view = object.__new__(type(self))  # the body's `self`: this graph, with this run's values
        view.__dict__.update(self.__dict__, _run=run, _origin=self)
        out = type(self).body(view, *args, **per_call)
        return out, self._pack(states, run.states)

    def __call__(self, *inputs, **per_call):
        """Runs the compiled body (one compile per input signature): the step's index checks
        first, then the step, its states donated and updated in place. Returns its outputs.

        Raises:
            StateIndexError: (E1401) for an index outside a state; nothing is written then.
            GraphInputError: (E1410) for an input that is not an array or a number, does not
                fit JAX's dtypes, or does not fit `body`'s signature.
            UnboundParamError: (E1404) while a weight declared by shape has no value.
        """
        if self._run is not None:
            raise GraphBodyError(
                f"`{type(self).__name__}.body` ran the graph again from inside itself",
                fix="call helper functions from body, not the graph",
            )
        if self._unbound:
            self._weights()  # raises E1404: a weight declared by shape is unbound
        return (self._shell or self._shell_now()).run(inputs, per_call)

    def reference(self, *inputs, **per_call):
        """Runs `body` eagerly on the host, against the host mirror of the state (`.host`).

        Nothing is compiled: the body can be stepped through and can print. Inputs are cast to
        the dtypes the compiled path would see, and every value the body sees (inputs, weights,
        state reads) is an eager JAX array on the host CPU. The mirror (`graph.total.host`) is
        separate from the device state (`graph.read("total")`), so the two paths can be run side
        by side and compared; it is changed only when the body returns. Results come back as numpy.
        """
        cpu = jax.devices("cpu")[0]
        try:  # inputs made canonical as the compiled path's are
            args, kwargs = canonical(type(self).__name__, (inputs, per_call), GraphInputError)
        except TooWideError:  # a too-wide int: the compiled path's checks say which error it is
            self._shell_now().check(*inputs, **per_call)
            raise
        check_call(type(self).__name__, type(self).body, args, kwargs)  # the shell's check
        with jax.default_device(cpu):
            args, kwargs, weights = jax.device_put((args, kwargs, self._weights()), cpu)
            try:
                out, new = self._pure(weights, self._host_states(), *args, **kwargs)
            except Exception as e:  # eqx.error_if of an index traced in a scan, vmap, inner jit
                coded = coded_runtime_failure(e)
                if coded is None:
                    raise
                raise coded from None
        self.__dict__["_host"] = new
        return jax.tree.map(np.asarray, out)

    def __repr__(self) -> str:
        parts = [f"{d.kind} {d.name}" for d in self._decls.values()]
        return f"{type(self).__name__}({', '.join(parts)})"
