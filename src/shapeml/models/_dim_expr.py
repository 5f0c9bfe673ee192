"""Dim expressions (`"(S // P) ** 2"`): parsed once, evaluated with every step bounded.

Pure functions over Python's `ast`; a problem raises `ExprError` with a message and a fix, which
`shapeml.models._dims` turns into its coded `DimsError` (E0903).
"""

from __future__ import annotations

import ast
import functools
import operator
from collections.abc import Mapping

from .._errors import similar

__all__ = ["MAX_DIM", "ExprError", "compute", "names", "parse"]

# The largest dim and the largest value inside a dim expression: checked before each step, so
# no expression (`2 ** 2 ** 2 ** 2 ** 2 ** 2`) can compute a huge number or hang.
MAX_DIM = 2**62
_MAX_EXPR = 500  # characters: a dim expression is short; a longer one is a mistake


class ExprError(ValueError):
    """What is wrong with a dim expression, and how to fix it."""

    def __init__(self, message: str, *, fix: str):
        super().__init__(message)
        self.fix = fix


_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.Div: None,  # exact division, checked below
}
_SYMBOLS = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
}


@functools.lru_cache(maxsize=4096)
def _syntax(expr: str) -> ast.expr:
    return ast.parse(expr, mode="eval").body


def parse(expr: str, where: str) -> ast.expr:
    if len(expr) > _MAX_EXPR:
        raise ExprError(
            f"{where}: the expression `{expr[:40]}...` is {len(expr):,} characters long",
            fix=f"write a dim expression in at most {_MAX_EXPR} characters",
        )
    try:
        tree = _syntax(expr.strip())
    except (SyntaxError, RecursionError, MemoryError):
        raise ExprError(
            f"{where}: `{expr}` is not an expression of dims",
            fix="write it with dim names, whole numbers and + - * // / % ** ( ), e.g. `(S // P) ** 2`",
        ) from None
    for node in ast.walk(tree):
        ok = isinstance(node, (ast.BinOp, ast.UnaryOp, ast.Name, ast.Load, ast.USub, ast.UAdd))
        ok = ok or type(node) in _BINOPS
        if isinstance(node, ast.Constant):
            ok = type(node.value) is int
        if not ok:
            raise ExprError(
                f"{where}: `{expr}` uses `{ast.unparse(node) if isinstance(node, ast.expr) else type(node).__name__}`, "
                "which a dim expression cannot contain",
                fix="use only dim names, whole numbers and + - * // / % ** ( )",
            )
    return tree


def names(expr: str, where: str) -> set[str]:
    """The dim names an expression reads."""
    return {n.id for n in ast.walk(parse(expr, where)) if isinstance(n, ast.Name)}


def _too_large(where: str, expr: str, what: str) -> ExprError:
    return ExprError(
        f"{where}: `{expr}` computes {what}, more than the largest dim 2**62",
        fix="check the dims it reads and its powers",
    )


def _ev(node: ast.expr, values: Mapping[str, int], expr: str, where: str) -> int:
    # Module level, not a closure: one function however many expressions are evaluated.
    if isinstance(node, ast.Constant):
        if node.value > MAX_DIM:
            raise _too_large(where, expr, f"the number {str(node.value)[:30]}")
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in values:
            raise ExprError(
                f"{where}: `{expr}` reads the dim `{node.id}`, which is not declared "
                f"(declared: {', '.join(values) or 'none'})",
                fix=similar(node.id, values, what="dim") or f"declare `{node.id}` in sm.Dims",
            )
        return values[node.id]
    if isinstance(node, ast.UnaryOp):
        v = _ev(node.operand, values, expr, where)
        return -v if isinstance(node.op, ast.USub) else v
    left, right = _ev(node.left, values, expr, where), _ev(node.right, values, expr, where)
    if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
        raise ExprError(f"{where}: `{expr}` divides by zero", fix="check the dims it reads")
    if isinstance(node.op, ast.Div):
        if left % right:
            raise ExprError(
                f"{where}: `{expr}` is not a whole number ({left} / {right})",
                fix="use `//` to round down, or choose dims that divide exactly",
            )
        return left // right
    if isinstance(node.op, ast.Pow):
        if right < 0 or right > 64:
            raise ExprError(f"{where}: `{expr}` raises to the power {right}", fix="use 0..64")
        if abs(left) > 1 and (abs(left).bit_length() - 1) * right > 62:  # checked before computing
            raise _too_large(where, expr, f"{left} ** {right}")
    value = _BINOPS[type(node.op)](left, right)
    if abs(value) > MAX_DIM:
        raise _too_large(where, expr, f"{left} {_SYMBOLS[type(node.op)]} {right}")
    return value


def compute(expr: str, values: Mapping[str, int], where: str) -> int:
    """The value of `expr` with these dims: a whole number in `0 .. MAX_DIM`."""
    try:
        value = _ev(parse(expr, where), values, expr, where)
    except RecursionError:
        raise ExprError(f"{where}: `{expr[:40]}...` nests too deeply", fix="simplify it") from None
    if value < 0:
        raise ExprError(
            f"{where}: `{expr}` is {value}, a negative size", fix="check the dims it reads"
        )
    return value
