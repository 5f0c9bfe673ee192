"""`sm.hoist`: run the weight-only part of `f(model, *inputs)` once per set of weights.

The per-call path is: flatten the weights, check by identity that they are the arrays last seen,
split the inputs into arrays and static leaves, one call of the jitted main program. Everything
else (tracing, splitting, preparing) happens on a miss, and `jax.jit`'s caches hold what it makes:
the split program per signature (the output of a function jax.jit traces) and main's compiled code
per tag and input signature.
"""

from __future__ import annotations

import collections
import functools
import typing
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from .. import _jax_internals as ji
from .._traceback import api_boundary
from .._validate import instance, integer, shorten
from ._errors import HoistArgumentError, MutableWeightsError, NotTracedError
from ._inputs import Traced, input_error
from ._prepared import Prepared, WeightsKey
from ._program import Program, Tag, build
from ._report import HoistReport
from ._static import Static, abstract, combine, partition


class _OtherTensorsError(Exception):
    """Raised while tracing main: these inputs' program reads tensors other than the ones passed
    (another prepare program). The call goes the slow way, which finds or makes them."""


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
        # The prepared tensors of the last `cache_size` sets of weights, least recently used first.
        self._prepared: collections.OrderedDict[WeightsKey, Prepared] = collections.OrderedDict()
        self._cache_size = cache_size
        self._traced: list[Traced] = []  # every signature traced, to explain one that fails
        self._last: Prepared | None = None
        self._last_program: Program | None = None
        self._last_weight_bytes = 0
        self._prepare_runs = 0

        def split(w_arrays, in_arrays, static):  # traced by jax.jit: its output is the program
            return self._build(w_arrays, in_arrays, static)

        def main(boundary, per_call, in_arrays, static):  # traced by jax.jit: main, compiled
            return self._main_body(boundary, per_call, in_arrays, static)

        self._split = jax.jit(split, static_argnums=2)
        self._main = jax.jit(main, static_argnums=3)

    # --- the per-call path ----------------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        if self._single and args:
            w, ins = args[0], (args[1:], kwargs)
        else:
            w, ins = self._partition(args, kwargs)
        return self._call(*jax.tree.flatten(w), ins, args, kwargs)

    def _call(self, w_leaves: list, w_tree, ins: tuple, args: tuple, kwargs: dict):
        """`f(*args, **kwargs)`, given the weights' leaves and structure and the other arguments
        `ins = (rest, kwargs)` (so `bake`, whose weights never change, flattens them once)."""
        last = self._last
        if last is not None and last.holds(w_leaves, w_tree):
            in_arrays, in_static = partition(ins)
            try:
                return self._main(last.boundary, last.per_call, in_arrays, (last.tag, in_static))
            except _OtherTensorsError:
                pass
        return self._miss(args, kwargs, w_leaves, w_tree)

    def _main_body(self, boundary, per_call, in_arrays, static: tuple[Tag, Static]):
        tag, in_static = static
        program = self._program(tag.weights, ([abstract(x) for x in in_arrays], in_static))
        if program.tag != tag:
            raise _OtherTensorsError
        return program.main(boundary, per_call, in_arrays)

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

    def _assemble(self, w, ins) -> tuple[tuple, dict]:
        """`f`'s `(args, kwargs)` from its weights and its other arguments."""
        rest, kwargs = ins
        if self._single:
            return (w, *rest), kwargs
        args, it_w, it_r = [], iter(w), iter(rest)
        for i in range(len(w) + len(rest)):
            args.append(next(it_w) if i in self._argnums else next(it_r))
        return tuple(args), kwargs

    # --- misses: tracing, splitting, preparing ----------------------------------------------------

    def _build(self, w_arrays, in_arrays, static: tuple[Static, Static]) -> Program:
        """Traces and splits `f` for these shapes and statics (run inside the `split` trace)."""
        weights = ([abstract(x) for x in w_arrays], static[0])
        inputs = ([abstract(x) for x in in_arrays], static[1])
        program = build(
            self._f,
            self._assemble,
            weights,
            inputs,
            max_prepared_bytes=self._max_bytes,
            cut_broadcasts=self._cut,
        )
        traced = Traced.of(weights, inputs)
        if traced not in self._traced:
            self._traced.append(traced)
        return program

    def _program(
        self, weights: tuple[Sequence, Static], inputs: tuple[Sequence, Static]
    ) -> Program:
        """The program for weights and inputs of these shapes and statics: traced and split on
        first sight, then from JAX's trace cache.

        Raises:
            HoistInputError: (E1509) if `f` cannot be traced for these inputs.
        """
        try:
            # Lists always: a tuple of the same shapes would be another key, and another trace.
            shapes = list(weights[0]), list(inputs[0])
            return self._split.trace(*shapes, (weights[1], inputs[1])).out_info
        except (TypeError, ValueError) as e:
            if type(e) not in (TypeError, ValueError):  # the user's own (or JAX's named) errors
                raise
            w = combine(weights[0], weights[1])
            w = w if self._single else w[0] if len(self._argnums) == 1 else None
            failed = Traced.of(weights, inputs)
            raise input_error(self._f, self._argnums, failed, self._traced, w, e) from None

    def _program_for(self, args: tuple, kwargs: dict) -> tuple[Program, list, list, Static]:
        """The program for these arguments (arrays or `jax.ShapeDtypeStruct`s), the array leaves
        of the weights and of the inputs, and the inputs' static part."""
        w, ins = self._partition(args, kwargs)
        (w_arrays, w_static), (in_arrays, in_static) = partition(w), partition(ins)
        weights = ([abstract(x) for x in w_arrays], w_static)
        program = self._program(weights, ([abstract(x) for x in in_arrays], in_static))
        return program, w_arrays, in_arrays, in_static

    def _miss(self, args, kwargs, w_leaves, w_tree):
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
        program, w_arrays, in_arrays, in_static = self._program_for(args, kwargs)
        prepared = self._prepared_for(w_leaves, w_tree)
        if not prepared.use(program.tag):
            boundary = program.prepare(w_arrays)
            if any(map(ji.is_tracer, boundary)):
                return self._f(*args, **kwargs)  # staged by an outer trace: do not cache tracers
            prepared.keep(program.tag, boundary, program.per_call(w_arrays))
            self._prepare_runs += 1
        self._last = prepared
        self._last_program = program
        self._last_weight_bytes = sum(ji.nbytes(jax.typeof(x)) for x in w_arrays)
        return self._main(prepared.boundary, prepared.per_call, in_arrays, (program.tag, in_static))

    def _prepared_for(self, w_leaves: list, w_tree) -> Prepared:
        """The prepared tensors of these weights (empty for new ones), now the most recent."""
        key = WeightsKey.of(w_leaves, w_tree)
        prepared = self._prepared.pop(key, None) or Prepared(key)
        prepared.w_leaves = w_leaves  # equal statics, now the objects the fast path sees
        self._prepared[key] = prepared
        if len(self._prepared) > self._cache_size:
            self._prepared.popitem(last=False)
        return prepared

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
            len(self._traced),
        )

    def prepare_jaxpr(self, *args, **kwargs) -> ji.ClosedJaxpr:
        """The prepare program for these arguments (arrays or `jax.ShapeDtypeStruct`s):
        weight leaves in, the tensors main reads out. Printable like `jax.make_jaxpr`'s result."""
        return self._program_for(args, kwargs)[0].split.prepare

    def main_jaxpr(self, *args, **kwargs) -> ji.ClosedJaxpr:
        """The per-call program: (boundary tensors, per-call weights, inputs) -> outputs."""
        return self._program_for(args, kwargs)[0].split.main

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
