"""`sm.bake`: bind the weights once and evaluate their weight-only part, returning `g(*inputs)`.

Unlike leaving a closed-over model to XLA's constant folder (slow, and it skips large tensors),
shapeml evaluates the prepare program itself (a hoisted `f` whose weights never change), and the
compiled main program reads the results as arguments.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Callable
from typing import Any

import jax

from .._traceback import api_boundary
from ._hoist import Hoisted, check_options
from ._report import HoistReport


@api_boundary
class Baked:
    """`f` with its weights bound and their weight-only work done. See `bake`."""

    @typing.no_type_check  # validates its arguments itself, with coded errors
    def __init__(self, f: Callable, model: Any, max_prepared_bytes: int | None):
        check_options(f, 0, max_prepared_bytes)
        functools.update_wrapper(self, f)
        self._model = model
        self._leaves, self._tree = jax.tree.flatten(model)  # fixed: flattened once
        # The model is fixed, so there is only ever one set of weights to prepare.
        self._hoisted = Hoisted(f, 0, max_prepared_bytes, cut_broadcasts=True, cache_size=1)

    def __call__(self, *inputs, **kwargs):
        args = (self._model, *inputs)
        return self._hoisted._call(self._leaves, self._tree, (inputs, kwargs), args, kwargs)

    def report(self) -> HoistReport:
        """What was evaluated at bake time; see `Hoisted.report`."""
        return self._hoisted.report()


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def bake(f: Callable, model: Any, *, max_prepared_bytes: int | None = None) -> Baked:
    """Binds `model` as `f`'s weights and folds the weight-only work: returns `g(*inputs)`.

    `g(*inputs) == f(model, *inputs)`. On the first call for an input structure and shapes, `f` is
    traced and split as `sm.hoist` does; the weight-only part is evaluated once by shapeml and its
    results become arguments of the compiled per-call program. Random draws and side effects stay
    per call. `g` can be called under an outer `jax.jit`, `grad` or `vmap` over the inputs.

    Args:
        f: the function, `f(model, *inputs, **kwargs)`.
        model: its weights, a pytree of JAX arrays (the `model` argument of `f`).
        max_prepared_bytes: as in `sm.hoist`.

    Returns:
        A callable of the inputs only, with `report()`.

    Raises:
        ArgumentTypeError, ArgumentError: (E0003, E0002) for a non-callable `f` or a bad
            `max_prepared_bytes` (as `sm.hoist`), before anything is traced.

    Example:
        >>> serve = sm.bake(forward, model)
        >>> y = serve(x)
    """
    return Baked(f, model, max_prepared_bytes)
