"""`adapted(x, w, a, b, scale)`: `x @ (w + scale * a @ b)`, the product of a LoRA layer, with a
derivative rule that never forms the merged weight's gradient.

Written as the merged product, its weight-only part `w + scale * a @ b` is what `sm.hoist` computes
once per weights (partial evaluation inlines a `custom_jvp`'s function), so a hoisted LoRA forward
runs the hand-merged model's program. Differentiated, the rule takes the unmerged route as `peft`
does: `y = x @ w + scale * (x @ a) @ b`, whose transpose gives the adapters' gradients through the
rank-`R` products, and the frozen `w` (a symbolic zero tangent) costs nothing.
"""

from __future__ import annotations

import functools

import jax
from jax import lax
from jax.custom_derivatives import SymbolicZero

__all__ = ["adapted"]


@functools.partial(jax.custom_jvp, nondiff_argnums=(4,))
def adapted(x: jax.Array, w: jax.Array, a: jax.Array, b: jax.Array, scale: float) -> jax.Array:
    """`x [*n In] @ (w [In Out] + scale * a [In R] @ b [R Out]) -> [*n Out]`."""
    merged = w + (a * _scalar(scale, a.dtype)) @ b
    return x @ merged


def _scalar(value: float, dtype) -> jax.Array:
    """`value` as a 0-d array of `dtype` (no promotion of bfloat16 activations)."""
    return lax.convert_element_type(value, dtype)


def _rows_times(x: jax.Array, t: jax.Array) -> jax.Array:
    """`x @ t` contracted through `x^T`, so the transpose (`x^T @ g`, a weight-side gradient)
    takes both operands row-major, as `nn`'s `dense` does."""
    xt = x.reshape(-1, x.shape[-1]).T
    out = lax.dot_general(xt, t, (((0,), (0,)), ((), ())))
    return out.reshape(*x.shape[:-1], t.shape[-1])


def _adapted_jvp(scale, primals, tangents):
    x, w, a, b = primals
    dx, dw, da, db = tangents
    s = _scalar(scale, x.dtype)
    xa = x @ a
    y = x @ w + (xa * s) @ b
    terms = []
    if not isinstance(dx, SymbolicZero):
        terms.append(dx @ w + ((dx @ a) * s) @ b)
    if not isinstance(dw, SymbolicZero):
        terms.append(_rows_times(x, dw))
    if not isinstance(da, SymbolicZero):
        terms.append((_rows_times(x, da) * s) @ b)
    if not isinstance(db, SymbolicZero):
        terms.append(_rows_times(xa * s, db))
    if not terms:
        return y, SymbolicZero(jax.core.get_aval(y).to_tangent_aval())
    return y, functools.reduce(lambda p, q: p + q, terms)


adapted.defjvp(_adapted_jvp, symbolic_zeros=True)
