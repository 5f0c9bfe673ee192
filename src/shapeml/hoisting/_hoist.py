"""`sm.hoist`: run the weight-only part of `f(model, *inputs)` once per set of weights.

The per-call path is: flatten the weights, check by identity that they are the arrays last seen,
flatten the inputs, one jitted call of the main program. Everything else (tracing, splitting,
preparing) happens on a miss.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from .. import _jax_internals as ji
from .._compile_cache import CompileCache, Signature, is_array
from .._traceback import api_boundary
from .._validate import instance, integer, shorten
from ._errors import HoistArgumentError, MutableWeightsError, NotTracedError
from ._inputs import TraceFailedError, input_error
from ._prepared import Prepared, Run, WeightsKey
from ._program import Program, ProgramKey, build, trace
from ._report import HoistReport


def check_options(
    f: Any,
    weights: Any = 0,
    max_prepared_bytes: Any = None,
    cut_broadcasts: Any = True,
    cache_size: Any = 1,
) -> tuple[tuple[int, ...], int | None, bool, int]:
    """The options of `hoist`, `bake` and `export`, checked before anything is traced or cached:
    `(weights as sorted argnums, max_prepared_bytes, cut_broadcasts, cache_size)`. Nothing is
    clamped: `cache_size=-5` or `max_prepared_bytes=-1` is refused, not read as 1 or 0.

    Raises:
        HoistArgumentError: (E1501) if `weights` is not a non-negative int or a tuple of them.
        ArgumentTypeError: (E0003) if `f` is not callable, or an option has the wrong type.
        ArgumentError: (E0002) if `cache_size < 1` or `max_prepared_bytes < 0`.
    """
    instance("f", f, Callable, "a function f(model, *inputs)")
    items = weights if isinstance(weights, tuple | list) else (weights,)
    bad = [
        i for i in items if isinstance(i, bool | np.bool_) or not isinstance(i, int | np.integer)
    ]
    if not items or bad or any(i < 0 for i in items):
        raise HoistArgumentError(
            f"`weights={shorten(weights)}` must name positional arguments of `f`",
            fix="pass a non-negative int, e.g. `weights=0`, or a tuple such as `(0, 2)`",
        )
    if max_prepared_bytes is not None:
        max_prepared_bytes = integer(
            "max_prepared_bytes",
            max_prepared_bytes,
            low=0,
            fix="pass a whole number of bytes >= 0, or None for no bound",
        )
    instance("cut_broadcasts", cut_broadcasts, bool, "True or False")
    cache_size = integer(
        "cache_size", cache_size, low=1, fix="pass how many sets of weights to keep, e.g. 1"
    )
    return tuple(sorted({int(i) for i in items})), max_prepared_bytes, cut_broadcasts, cache_size


@api_boundary
class Hoisted:
    """A function whose weight-only work runs once per set of weight arrays. See `hoist`."""

    @typing.no_type_check  # validates its arguments itself, with coded errors
    def __init__(
        self,
        f: Callable,
        weights: int | Sequence[int],
        max_prepared_bytes: int | None,
        cut_broadcasts: bool,
        cache_size: int,
    ):
        argnums, max_prepared_bytes, cut_broadcasts, cache_size = check_options(
            f, weights, max_prepared_bytes, cut_broadcasts, cache_size
        )
        functools.update_wrapper(self, f)
        self._f = f
        self._argnums = argnums
        self._single = argnums == (0,)
        self._max_bytes = max_prepared_bytes
        self._cut = cut_broadcasts
        # Programs by signature (never dropped: they hold no weights), and the prepared tensors of
        # the last `cache_size` sets of weights.
        self._programs: CompileCache[Program] = CompileCache(self._build)
        self._traced: list[ProgramKey] = []  # every signature traced, to explain one that fails
        self._prepared: CompileCache[Prepared] = CompileCache(Prepared, maxsize=cache_size)
        self._last: Prepared | None = None
        self._last_program: Program | None = None
        self._last_weight_bytes = 0
        self._prepare_runs = 0

    # --- the per-call path ----------------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        if self._single and args:
            w, ins = args[0], (args[1:], kwargs)
        else:
            w, ins = self._partition(args, kwargs)
        w_leaves, w_tree = jax.tree.flatten(w)
        last = self._last
        if last is not None and last.holds(w_leaves, w_tree):
            sig, in_leaves = Signature.of(ins)
            run = last.run_for(sig)
            if run is not None:
                return run(in_leaves)
        return self._miss(args, kwargs, w_leaves, w_tree, ins)

    def _partition(self, args: tuple, kwargs: dict) -> tuple[Any, Any]:
        if len(args) <= self._argnums[-1]:
            raise HoistArgumentError(
                f"`{getattr(self._f, '__name__', 'f')}` takes its weights as positional "
                f"argument(s) {list(self._argnums)}, but was called with {len(args)} positional "
                "argument(s)",
                fix="call it as `fast(model, *inputs)`, or set `weights=` in `sm.hoist`",
            )
        if self._single:
            return args[0], (args[1:], kwargs)
        w = tuple(args[i] for i in self._argnums)
        rest = tuple(a for i, a in enumerate(args) if i not in self._argnums)
        return w, (rest, kwargs)

    def _assembler(self, w_tree, in_tree, n_args: int) -> Callable:
        argnums = self._argnums

        def assemble(w_leaves, in_leaves):
            w = jax.tree.unflatten(w_tree, w_leaves)
            rest, kwargs = jax.tree.unflatten(in_tree, in_leaves)
            if argnums == (0,):
                return (w, *rest), kwargs
            args, it_w, it_r = [], iter(w), iter(rest)
            for i in range(n_args):
                args.append(next(it_w) if i in argnums else next(it_r))
            return tuple(args), kwargs

        return assemble

    # --- misses: tracing, splitting, preparing ----------------------------------------------------

    def _build(self, key: ProgramKey) -> Program:
        """Traces and splits `f` for the signatures in `key` (the program cache's builder)."""
        assemble = self._assembler(key.weights.treedef, key.inputs.treedef, key.n_args)
        try:
            closed, out_tree = trace(self._f, assemble, key)
        except (TypeError, ValueError) as e:
            if type(e) not in (TypeError, ValueError):  # the user's own (or JAX's named) errors
                raise
            raise TraceFailedError(e) from e  # JAX refused the shapes: `_program` explains it
        self._traced.append(key)
        return build(
            closed,
            out_tree,
            len(key.weights.dynamic()),
            max_prepared_bytes=self._max_bytes,
            cut_broadcasts=self._cut,
        )

    def _program(self, args: tuple, kwargs: dict) -> tuple[Program, list, list, Signature]:
        """The program for these arguments' structure and shapes (traced on first sight), the
        weight and input leaves, and the inputs' signature."""
        w, ins = self._partition(args, kwargs)
        w_sig, w_leaves = Signature.of(w)
        in_sig, in_leaves = Signature.of(ins)
        key = ProgramKey(w_sig, in_sig, len(args))
        try:
            prog = self._programs.get(key)
        except TraceFailedError as e:
            w_obj = args[self._argnums[0]] if len(self._argnums) == 1 else None
            raise input_error(self._f, self._argnums, key, self._traced, w_obj, e) from None
        return prog, w_leaves, in_leaves, in_sig

    def _miss(self, args, kwargs, w_leaves, w_tree, ins):
        if any(map(ji.is_tracer, w_leaves)):
            # Under an outer jit/grad the weights are abstract: there is nothing to cache, and the
            # outer transformation should see `f` itself.
            return self._f(*args, **kwargs)
        if any(isinstance(x, np.ndarray) for x in w_leaves):
            w = self._partition(args, kwargs)[0]
            path, x = next(
                (p, x)
                for p, x in jax.tree_util.tree_flatten_with_path(w)[0]
                if isinstance(x, np.ndarray)
            )
            raise MutableWeightsError(
                f"weight leaf {jax.tree_util.keystr(path)} is a mutable numpy array "
                f"(shape {x.shape}); the cache keys on array identity",
                fix="convert the weights once: `model = jax.tree.map(jnp.asarray, model)`",
            )
        prog, w_leaves, in_leaves, in_sig = self._program(args, kwargs)
        prepared = self._prepared.get(WeightsKey.of(w_leaves, w_tree))
        prepared.w_leaves = w_leaves  # equal statics, now the objects the fast path sees
        w_dyn = [x for x in w_leaves if is_array(x)]
        boundary = prepared.boundaries.get(prog.prepare_key)
        if boundary is None:
            boundary = prog.prepare(w_dyn)
            if any(map(ji.is_tracer, boundary)):
                return self._f(*args, **kwargs)  # staged by an outer trace: do not cache tracers
            prepared.boundaries[prog.prepare_key] = boundary
            self._prepare_runs += 1
        dyn = in_sig.dynamic()
        run = Run(
            prog.main,
            boundary,
            prog.per_call(w_dyn),
            None if len(dyn) == len(in_leaves) else dyn,
        )
        prepared.remember(in_sig, run)
        self._last = prepared
        self._last_program = prog
        self._last_weight_bytes = sum(ji.nbytes(jax.typeof(x)) for x in w_dyn)
        return run(in_leaves)

    # --- introspection ----------------------------------------------------------------------------

    def report(self) -> HoistReport:
        """What the last call's program hoisted: ops, bytes prepared, bytes of weights, counters.

        Raises:
            NotTracedError: (E1503) before the first call.
        """
        if self._last_program is None:
            raise NotTracedError(
                f"`{getattr(self._f, '__name__', 'f')}` has not been called yet, so nothing was "
                "split",
                fix="call it once first, or use `prepare_jaxpr(...)` / `main_jaxpr(...)`",
            )
        return HoistReport.of(
            self._last_program.split,
            self._last_weight_bytes,
            self._prepare_runs,
            self._programs.builds,
        )

    def prepare_jaxpr(self, *args, **kwargs) -> ji.ClosedJaxpr:
        """The prepare program for these arguments (arrays or `jax.ShapeDtypeStruct`s):
        weight leaves in, the tensors main reads out. Printable like `jax.make_jaxpr`'s result."""
        return self._program(args, kwargs)[0].split.prepare

    def main_jaxpr(self, *args, **kwargs) -> ji.ClosedJaxpr:
        """The per-call program: (boundary tensors, per-call weights, inputs) -> outputs."""
        return self._program(args, kwargs)[0].split.main

    def clear(self) -> None:
        """Drops every cached prepared tensor and the references to the weights they came from."""
        self._prepared.clear()
        self._last = None


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def hoist(
    f: Callable | None = None,
    *,
    weights: int | Sequence[int] = 0,
    max_prepared_bytes: int | None = None,
    cut_broadcasts: bool = True,
    cache_size: int = 1,
) -> Hoisted | Callable[[Callable], Hoisted]:
    """Splits `f(model, *inputs)` into weight-only work, run once per set of weights, and the rest.

    On the first call `f` is traced; every operation reachable only from the weights (and
    constants) goes to a *prepare* program, run once and cached against the identity of the
    weight arrays; the rest goes to a *main* program, compiled once and run on every call with the
    prepared tensors as arguments. New weight arrays re-run prepare only; main is not recompiled
    while shapes stay the same. Results equal `jax.jit(f)`'s.

    Never cached: random bits and anything derived from a PRNG key (keys in the weights count as
    per-call inputs), and side effects. Non-array leaves are static configuration, hashed into the
    cache key. Under an outer `jit`/`grad`/`vmap` over the weights, `f` is simply inlined.

    Args:
        f: the function, `f(model, *inputs, **kwargs)`; usable as a decorator without it.
        weights: the positional argument(s) of `f` holding the weights (pytrees of arrays).
        max_prepared_bytes: upper bound on the bytes of computed tensors the cache holds (beyond
            the weights); the largest are left to main until it fits. None: no bound.
        cut_broadcasts: cache a small tensor rather than its broadcast (the broadcast runs in
            main), so prepared bytes stay close to the weights' own.
        cache_size: how many sets of weights to keep prepared (least recently used is dropped).

    Returns:
        A `Hoisted` callable with the signature of `f`, plus `report()`, `prepare_jaxpr(...)`,
        `main_jaxpr(...)` and `clear()`.

    Raises:
        HoistArgumentError: (E1501) if `weights` is not a non-negative int or a tuple of them.
        ArgumentTypeError: (E0003) for a non-callable `f` or an option of the wrong type (a
            float, bool or string where an int is taken).
        ArgumentError: (E0002) for `cache_size < 1` or `max_prepared_bytes < 0`: refused, never
            clamped.

    Example:
        >>> fast = sm.hoist(forward)
        >>> y = fast(model, x)            # traces, prepares, runs main
        >>> y = fast(model, x2)           # main only
        >>> print(fast.report())
    """

    if f is None:  # used as a decorator: the options are checked now, not at decoration
        check_options(lambda: None, weights, max_prepared_bytes, cut_broadcasts, cache_size)

    def wrap(fn: Callable) -> Hoisted:
        return Hoisted(fn, weights, max_prepared_bytes, cut_broadcasts, cache_size)

    return wrap if f is None else wrap(f)
