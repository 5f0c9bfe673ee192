"""`dense(x, w)`: `x @ w` over the last axis, with a derivative rule that gives XLA:CPU its weight
gradient as a plain matrix product.

Autodiff of `x @ w` asks for `dw = x^T @ g`, a product that contracts the leading (token) axis of
both operands. XLA:CPU runs that as a transpose copy of a large activation (fused with whatever
produced it, often recomputing it) followed by a slower library call; in the char GPT's step these
were a fifth of the time (`docs/performance.md`). Here the tangent of `w` is contracted with the
transposed input `x^T [In n]` that the forward pass makes once, so the transposed program computes
`dw = x^T @ g` with both operands in the layout a matrix product wants. It is a `custom_jvp`, so
forward mode, `jax.hessian` and shapeml's dead-param analysis (a `jvp`) keep working, and the
numbers are those of `x @ w`.
"""

from __future__ import annotations

import jax
from jax import lax
from jax.custom_derivatives import SymbolicZero
from jax.typing import ArrayLike

__all__ = ["dense"]


@jax.custom_jvp
def dense(x: ArrayLike, w: ArrayLike) -> jax.Array:
    """`x [*b In] @ w [In Out] -> [*b Out]` (numpy inputs too, as `@sm.shaped` layers take them)."""
    return x @ w


def _dense_jvp(primals, tangents):
    x, w = primals
    dx, dw = tangents
    y = dense(x, w)
    dy = None
    if not isinstance(dx, SymbolicZero):
        dy = dx @ w
    if not isinstance(dw, SymbolicZero):
        # x^T [In n]: contracting its axis 0 with dw's axis 0 is `x @ dw`, whose transpose (the
        # weight gradient) is then `x^T @ g`, both operands row-major.
        xt = x.reshape(-1, x.shape[-1]).T
        term = lax.dot_general(xt, dw, (((0,), (0,)), ((), ())))
        term = term.reshape(y.shape)
        dy = term if dy is None else dy + term
    if dy is None:
        dy = SymbolicZero(jax.core.get_aval(y).to_tangent_aval())
    return y, dy


dense.defjvp(_dense_jvp, symbolic_zeros=True)
