"""Rule tables: a model's declared dims mapped to mesh axes, one `PartitionSpec` per field.

Each axis of a field is spelled by a number, a dim name (`D`, also a derived dim such as `N`) or a
dim expression (`P*P`, `H*Dh`). An axis is split over the mesh axes of:

1. the rule for its spelling, when the table names it (`{"D": "model"}`, `{"H*Dh": "tp"}`);
2. else, for a product, the rule for its first factor: `H*Dh` is laid out head after head, so its
   even blocks are whole heads and `{"H": "tp"}` splits it by heads (what Megatron does);
3. else nothing: the axis is replicated (numbers, unruled dims, other expressions such as `D//H`).

Sub-models are placed by the same table, by name: their dims take the parent's values.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from .._errors import similar
from .._validate import shorten
from ..models import Dims, Model
from ..models._checks import child_dims
from ..models._fields import FieldSpec
from ._errors import (
    AxisReusedError,
    IndivisibleDimError,
    RuleTableError,
    UnknownMeshAxisError,
    UnknownRuleDimError,
)

__all__ = ["FieldPlan", "Rules", "check_mesh", "plan", "rules_table"]

Axes = tuple[str, ...]  # the mesh axes one array axis is split over; () is replicated
# A rule table: Mapping[str, str | tuple[str, ...] | None]. Annotated `Any` because the public
# entry points check it themselves (`rules_table`), with a coded error (E1905) and its fix.
Rules = Any


@dataclasses.dataclass(frozen=True)
class FieldPlan:
    """Where one field goes: its declared axes, their sizes and the mesh axes each is split over.

    `units[i]` is the size that the product of `axes[i]`'s mesh sizes must divide: the dim's
    size, or the first factor's size for an axis split by the first factor of its expression.
    """

    name: str
    kind: str
    declared: tuple[int | str, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    axes: tuple[Axes, ...]
    units: tuple[int, ...]
    rules: tuple[str | None, ...]  # the rule key that split each axis

    @property
    def spec(self) -> P:
        """The `PartitionSpec`: one entry per axis (None: replicated)."""
        return P(*(None if not a else a[0] if len(a) == 1 else a for a in self.axes))

    def local_shape(self, mesh_shape: Mapping[str, int]) -> tuple[int, ...]:
        """The shape of the block one device holds on a mesh with these axis sizes."""
        return tuple(
            n // int(np.prod([mesh_shape[a] for a in axes], dtype=np.int64))
            for n, axes in zip(self.shape, self.axes, strict=True)
        )


def _canon(key: str) -> str:
    """One spelling per expression (`H * Dh` and `H*Dh` are the same rule)."""
    if key.isidentifier():
        return key
    try:
        return ast.unparse(ast.parse(key.strip(), mode="eval").body)
    except SyntaxError:
        return key  # not an expression: reported as an unknown dim


def _first_factor(token: str) -> str | None:
    """The first factor of a product of dims (`H` of `H*Dh`), or None for anything else."""
    node = ast.parse(token, mode="eval").body
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)):
        return None
    while isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        node = node.left
    return node.id if isinstance(node, ast.Name) else None


def rules_table(rules: Any) -> tuple[tuple[str, Axes], ...]:
    """The rule table checked and normalised: `(canonical key, axes)` pairs, sorted by key.

    Raises:
        RuleTableError: (E1905) for a table that is not a mapping of names to axis names.
    """
    if not isinstance(rules, Mapping):
        raise RuleTableError(
            f"`rules` must be a mapping from dim names to mesh axes, got {shorten(rules)} "
            f"({type(rules).__name__})",
            fix='pass e.g. rules={"D": "model"} ({} replicates everything)',
        )
    out: dict[str, Axes] = {}
    for key, value in rules.items():
        if not isinstance(key, str) or not key.strip():
            raise RuleTableError(
                f"rule key {shorten(key)} is not a dim name", fix='write e.g. {"D": "model"}'
            )
        if value is None:
            axes: Axes = ()
        elif isinstance(value, str):
            axes = (value,)
        elif isinstance(value, (tuple, list)) and value and all(isinstance(a, str) for a in value):
            axes = tuple(value)
        else:
            raise RuleTableError(
                f"rule `{key}`: {shorten(value)} is not a mesh axis name, a non-empty tuple of "
                "axis names or None",
                fix=f'write e.g. {{"{key}": "model"}} or {{"{key}": ("data", "model")}}',
            )
        if len(set(axes)) != len(axes):
            raise RuleTableError(
                f"rule `{key}` lists a mesh axis twice: {axes}", fix="name each axis once"
            )
        canon = _canon(key)
        if canon in out:
            raise RuleTableError(
                f"rules `{key}` and another key both spell `{canon}`",
                fix="keep one rule per dim",
            )
        out[canon] = axes
    return tuple(sorted(out.items()))


def _declarations(cls: type[Model], dims: Dims, prefix: str = "") -> Iterator:
    """(dotted name, FieldSpec, the dims it is declared in) of every param and buffer."""
    for name, spec in cls.__shapeml_fields__.items():
        if spec.kind in ("submodel", "submodels"):
            sub = child_dims(spec.model, dims)
            if spec.kind == "submodel":
                yield from _declarations(spec.model, sub, f"{prefix}{name}.")
            else:
                for i in range(spec.count_in(dims)):
                    yield from _declarations(spec.model, sub, f"{prefix}{name}.{i}.")
        else:
            yield prefix + name, spec, dims


def _field_plan(name: str, spec: FieldSpec, dims: Dims, table: dict[str, Axes]) -> FieldPlan:
    shape = spec.shape_in(dims)
    axes, units, used = [], [], []
    for token, size in zip(spec.shape, shape, strict=True):
        rule, unit = None, size
        if isinstance(token, str):
            key = _canon(token)
            if key in table:
                rule = key
            elif (first := _first_factor(token)) is not None and first in table:
                rule, unit = first, dims[first]
        axes.append(table[rule] if rule else ())
        units.append(unit)
        used.append(rule)
    seen: dict[str, int] = {}
    for i, ax in enumerate(axes):
        for a in ax:
            if a in seen:
                j = seen[a]
                twice = spec.shape[i] == spec.shape[j]
                raise AxisReusedError(
                    f"`{name}` [{spec.shape_str}] would be split over mesh axis `{a}` along "
                    + (
                        f"both of its `{spec.shape[i]}` axes (it reads `{spec.shape[i]}` twice)"
                        if twice
                        else f"`{spec.shape[j]}` (rule `{used[j]}`) and `{spec.shape[i]}` "
                        f"(rule `{used[i]}`)"
                    ),
                    fix=(
                        f"declare `{name}`'s axes with distinct names (e.g. `H*Dh` for a head "
                        f"axis), or leave `{spec.shape[i]}` out of the rules"
                        if twice
                        else f"map `{used[i]}` or `{used[j]}` to another mesh axis"
                    ),
                )
            seen[a] = i
    return FieldPlan(
        name, spec.kind, spec.shape, shape, np.dtype(spec.dtype), tuple(axes), tuple(units),
        tuple(used),
    )  # fmt: skip


@functools.lru_cache(maxsize=256)
def _plan(cls: type[Model], dims_items: tuple, table: tuple) -> tuple[FieldPlan, ...]:
    dims = cls.dims.resolve(**{k: v for k, v in dims_items if k in cls.dims.free})
    decls = list(_declarations(cls, dims))
    known = set(dims)
    for _, spec, d in decls:
        known.update(d)
        known.update(_canon(t) for t in spec.shape if isinstance(t, str))
    for key, _ in table:
        if key not in known:
            names = sorted({*dims, *(n for _, _, d in decls for n in d)})
            raise UnknownRuleDimError(
                f"the rules name `{key}`, which `{cls.__name__}` neither declares as a dim nor "
                f"spells in a field (dims: {', '.join(names) or 'none'})",
                fix=similar(key, sorted(known), what="dim")
                or f"remove `{key}` from the rules, or rule one of: {', '.join(names)}",
            )
    lookup = dict(table)
    return tuple(_field_plan(n, s, d, lookup) for n, s, d in decls)


def plan(cls: type[Model], dims: Dims, rules: Any) -> tuple[FieldPlan, ...]:
    """The placement of every param and buffer of a `cls` with these dims, without a mesh.

    Raises:
        RuleTableError: (E1905) for a malformed table.
        UnknownRuleDimError: (E1901) for a rule naming a dim the model does not have.
        AxisReusedError: (E1904) when one field would use a mesh axis twice.
    """
    return _plan(cls, tuple(dims.items()), rules_table(rules))


def check_mesh(plans: tuple[FieldPlan, ...], rules: Any, mesh: Mesh) -> None:
    """Checks a plan against a mesh: every rule's axes exist, every split dim divides.

    Raises:
        UnknownMeshAxisError: (E1902) naming the rule and the mesh's axes.
        IndivisibleDimError: (E1903) naming the field, the dim, its size and the axes.
    """
    sizes = dict(mesh.shape)
    for key, axes in rules_table(rules):
        for a in axes:
            if a not in sizes:
                raise UnknownMeshAxisError(
                    f"rule `{key}` names mesh axis `{a}`, which the mesh does not have "
                    f"(axes: {', '.join(f'{k}={v}' for k, v in sizes.items())})",
                    fix=similar(a, sizes, what="mesh axis")
                    or f"use one of the mesh's axes, or make a mesh with a `{a}` axis",
                )
    for p in plans:
        for token, unit, axes, rule in zip(p.declared, p.units, p.axes, p.rules, strict=True):
            parts = int(np.prod([sizes[a] for a in axes], dtype=np.int64))
            if unit % parts:
                what = f"`{token}` = {unit}" if rule == token else f"`{rule}` = {unit} in `{token}`"
                raise IndivisibleDimError(
                    f"`{p.name}` [{' '.join(map(str, p.declared))}]: {what} does not split "
                    f"evenly over {' x '.join(f'{a}={sizes[a]}' for a in axes)} ({parts} parts)",
                    fix=f"make `{rule}` a multiple of {parts}, use a mesh whose `{'`, `'.join(axes)}` "
                    f"size divides {unit}, or leave `{rule}` out of the rules",
                )
