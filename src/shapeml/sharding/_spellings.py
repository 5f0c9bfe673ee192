"""How each axis of a field is spelled at every level of the model tree, for the rule tables.

A field's axis is spelled in its own model's names (a Linear's `Out`); each parent's dim mapping
spells it again in the parent's names (`F` inside `nn.MLP`, whose `up` maps `Out="F"`; `4 * D` one
level up, for `mlp = MLP.of(F="4 * D")`). An axis that a level cannot spell (a number, a dim of the
sub-model alone) has no spelling there.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from ..models import Dims, Model
from ..models._checks import statics_of
from ..models._fields import FieldSpec
from ..models._mapped import child_dims

__all__ = ["Level", "axis_rule", "canon", "declarations", "first_factor"]


def canon(key: str) -> str:
    """One spelling per expression (`H * Dh` and `H*Dh` are the same rule)."""
    if key.isidentifier():
        return key
    try:
        return ast.unparse(ast.parse(key.strip(), mode="eval").body)
    except SyntaxError:
        return key  # not an expression: reported as an unknown dim


def first_factor(token: str) -> str | None:
    """The first factor of a product of dims (`H` of `H*Dh`), or None for anything else."""
    node = ast.parse(token, mode="eval").body
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)):
        return None
    while isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        node = node.left
    return node.id if isinstance(node, ast.Name) else None


class Level(NamedTuple):
    """One level of the model tree on the way to a field: the dims of each level from the root
    (`dims[-1]` this one's), and how each of this level's dims is spelled at every level
    (`spell["Out"] == ("4 * D", "F", "Out")`; None where a level has no spelling for it)."""

    dims: tuple[Dims, ...]
    spell: Mapping[str, tuple[str | None, ...]]


class _Respell(ast.NodeTransformer):
    """Replaces each dim name by its spelling at one outer level; notes a name it has none for."""

    def __init__(self, spellings: Mapping[str, str | None]):
        self.spellings, self.missing = spellings, False

    def visit_Name(self, node: ast.Name) -> ast.AST:
        outer = self.spellings.get(node.id)
        if outer is None:
            self.missing = True
            return node
        return ast.parse(outer, mode="eval").body


def _subst(expr: str, level: Level, j: int) -> str | None:
    """`expr` (in `level`'s names) spelled in the names of level `j`, or None if it has none."""
    if j == len(level.dims) - 1:
        return canon(expr)
    respell = _Respell({n: s[j] for n, s in level.spell.items()})
    node = respell.visit(ast.parse(expr.strip(), mode="eval").body)
    return None if respell.missing else ast.unparse(node)


def _child_level(spec: FieldSpec, parent: Level) -> Level:
    dims = child_dims(spec, parent.dims[-1])
    depth = len(parent.dims)
    mapped = dict(spec.mapped.dims)
    spell = {}
    for n in dims:
        target = mapped.get(n)
        if isinstance(target, str):
            outer = tuple(_subst(target, parent, j) for j in range(depth))
        elif target is None and n in parent.spell:
            outer = parent.spell[n]  # the parent's dim of the same name
        else:  # a number, or a dim of the sub-model alone
            outer = (None,) * depth
        spell[n] = (*outer, n)
    return Level((*parent.dims, dims), spell)


def declarations(
    cls: type[Model], level: Level, statics: Mapping[str, Any], prefix: str = ""
) -> Iterator[tuple[str, FieldSpec, Level]]:
    """(dotted name, FieldSpec, its level) of every param and buffer present."""
    own = statics_of(cls, statics, prefix)
    for name, spec in cls.__shapeml_fields__.items():
        if spec.kind in ("submodel", "submodels"):
            sub = _child_level(spec, level)
            paths = (
                [f"{prefix}{name}."]
                if spec.kind == "submodel"
                else [f"{prefix}{name}.{i}." for i in range(spec.count_in(level.dims[-1]))]
            )
            options = {p + k: v for p in paths for k, v in spec.mapped.options_in(own)}
            merged = {**statics, **options}  # once: a copy per sub-model is quadratic
            for p in paths:
                yield from declarations(spec.model, sub, merged, p)
        elif spec.present(own):
            yield prefix + name, spec, level


def axis_rule(token: str, size: int, level: Level, table: Mapping[str, tuple[str, ...]]):
    """`(rule, unit, spellings)` of one axis: the winning rule key (None), what must divide,
    and every spelling the axis has (outermost first), for the report of unused rules."""
    spellings = [_subst(token, level, j) for j in range(len(level.dims))]
    for j, s in enumerate(spellings):
        if s is None:
            continue
        if s in table:
            return s, size, spellings
        first = first_factor(s)
        if first is not None and first in table:
            return first, level.dims[j][first], spellings
    return None, size, spellings
