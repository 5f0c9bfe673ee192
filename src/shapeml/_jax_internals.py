"""The one place shapeml touches JAX internals (jaxpr types, partial evaluation, DCE).

JAX changes these between minor versions (0.11 folds `ClosedJaxpr` into `Jaxpr`), so everything
else in shapeml calls the small functions here, and a JAX upgrade is ported in this file alone.
`tests/test_jax_internals.py` pins the behaviour each function promises.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.extend.core as jex
from jax._src.interpreters import partial_eval as _pe

ClosedJaxpr = jex.ClosedJaxpr
Jaxpr = jex.Jaxpr
Literal = jex.Literal
Var = jex.Var


def make_closed_jaxpr(fn: Callable, *args) -> ClosedJaxpr:
    """Traces `fn(*args)` (args may be arrays or `jax.ShapeDtypeStruct`s) to a closed jaxpr."""
    return jax.make_jaxpr(fn)(*args)


def used_inputs(closed: ClosedJaxpr, used_outputs: bool | Sequence[bool] = True) -> list[bool]:
    """For each input of `closed`, whether any of the used outputs depends on it.

    Nested jaxprs (pjit, scan, cond, while, custom_jvp/vjp) are followed by JAX's own DCE rules; a
    primitive without a rule keeps all its inputs, so the answer errs towards "used".
    """
    _, used = _pe.dce_jaxpr(closed.jaxpr, used_outputs)
    return list(used)


def split_known(
    closed: ClosedJaxpr, unknowns: Sequence[bool]
) -> tuple[ClosedJaxpr, ClosedJaxpr, list[bool], list]:
    """Partial evaluation: splits `closed` into the part computable from the known inputs alone
    and the part that needs the unknown ones.

    Returns `(known, unknown, out_unknowns, residual_avals)`: `known` maps the known inputs to the
    known outputs followed by residuals; `unknown` maps residuals then unknown inputs to the
    unknown outputs (JAX's `partial_eval_jaxpr_nounits` convention).
    """
    return _pe.partial_eval_jaxpr_nounits(closed, list(unknowns), instantiate=True)


def as_fun(closed: ClosedJaxpr) -> Callable:
    """A Python callable that evaluates `closed` (flat arguments in, flat list of results out)."""
    return jex.jaxpr_as_fun(closed)
