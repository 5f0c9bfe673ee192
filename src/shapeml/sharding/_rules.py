"""Rule tables: a model's declared dims mapped to mesh axes, one `PartitionSpec` per field.

Each axis of a field is spelled by a number, a dim name (`D`, also a derived dim such as `N`) or a
dim expression (`P*P`, `H*Dh`). In a sub-model it has one spelling per level of the model tree:
its own (a Linear's `Out`), and, through each parent's dim mapping, the parent's (`F` for an MLP's
`up = Linear.of(In="D", Out="F")`, `4 * D` one level up for `mlp = MLP.of(F="4 * D")`). The
outermost spelling with a rule wins; at each level an axis is split over the mesh axes of:

1. the rule for its spelling, when the table names it (`{"D": "model"}`, `{"H*Dh": "tp"}`);
2. else, for a product, the rule for its first factor: `H*Dh` is laid out head after head, so its
   even blocks are whole heads and `{"H": "tp"}` splits it by heads (what Megatron does);
3. else the next level inward; with no rule at any level the axis is replicated (numbers,
   unruled dims, other expressions such as `D//H`).

A rule that places no axis of any field (a misspelt dim, a dim no field uses, a rule every axis
of which an outer rule places) is refused (E1901), naming the spellings it could have meant.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from .._errors import similar
from .._traceback import api_boundary
from ..models import Dims, Model
from ..models._fields import FieldSpec
from ._errors import (
    AxisReusedError,
    IndivisibleDimError,
    UnknownMeshAxisError,
    UnknownRuleDimError,
)
from ._fsdp import Fsdp, split_largest
from ._spellings import Level, axis_rule, declarations, first_factor
from ._table import Axes, rules_table

__all__ = ["FieldPlan", "Rules", "check_mesh", "plan"]

# A rule table: Mapping[str, str | tuple[str, ...] | None]. Annotated `Any` because the public
# entry points check it themselves (`rules_table`), with a coded error (E1905) and its fix.
Rules = Any


@api_boundary
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
    rules: tuple[str | None, ...]  # the rule key that placed each axis (None: no rule)

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


class _Axis(NamedTuple):
    """One axis of a field, for the report of a rule that places nothing."""

    field: str
    spellings: tuple[str, ...]  # outermost first
    rule: str | None  # the rule that placed it


def _field_plan(name: str, spec: FieldSpec, level: Level, table: Mapping[str, Axes]):
    """The field's `FieldPlan`, and its named axes as `_Axis` records."""
    shape = spec.shape_in(level.dims[-1])
    axes, units, used, named = [], [], [], []
    for token, size in zip(spec.shape, shape, strict=True):
        rule, unit = None, size
        if isinstance(token, str):
            rule, unit, spellings = axis_rule(token, size, level, table)
            named.append(_Axis(name, tuple(s for s in spellings if s is not None), rule))
        axes.append(table[rule] if rule else ())
        units.append(unit)
        used.append(rule)
    _check_reuse(name, spec, axes, used)
    plan_ = FieldPlan(
        name,
        spec.kind,
        spec.shape,
        shape,
        np.dtype(spec.dtype),
        tuple(axes),
        tuple(units),
        tuple(used),
    )
    return plan_, named


def _check_reuse(name: str, spec: FieldSpec, axes: list[Axes], used: list[str | None]) -> None:
    seen: dict[str, int] = {}
    for i, ax in enumerate(axes):
        for a in ax:
            if a in seen:
                j = seen[a]
                twice = used[i] == used[j]
                if not twice:
                    along = (
                        f"`{spec.shape[j]}` (rule `{used[j]}`) and `{spec.shape[i]}` "
                        f"(rule `{used[i]}`)"
                    )
                elif spec.shape[i] == spec.shape[j]:
                    along = f"both of its `{spec.shape[i]}` axes (it reads `{spec.shape[i]}` twice)"
                else:  # two own names mapped onto one parent name
                    along = (
                        f"both of its axes `{spec.shape[j]}` and `{spec.shape[i]}`, which are "
                        f"both spelled `{used[i]}` (it reads `{used[i]}` twice)"
                    )
                raise AxisReusedError(
                    f"`{name}` [{spec.shape_str}] would be split over mesh axis `{a}` along "
                    + along,
                    fix=(
                        f"declare `{name}`'s axes with distinct names (e.g. `H*Dh` for a head "
                        f"axis), or leave `{used[i]}` out of the rules"
                        if twice
                        else f"map `{used[i]}` or `{used[j]}` to another mesh axis"
                    ),
                )
            seen[a] = i


@functools.lru_cache(maxsize=256)
def _plan(cls: type[Model], dims_items: tuple, statics: tuple, table: tuple):
    dims = cls.dims.resolve(**{k: v for k, v in dims_items if k in cls.dims.free})
    root = Level((dims,), {n: (n,) for n in dims})
    lookup = dict(table)
    plans, named, names = [], [], set(dims)
    for name, spec, level in declarations(cls, root, dict(statics)):
        fp, axes = _field_plan(name, spec, level, lookup)
        plans.append(fp)
        named += axes
        names.update(n for d in level.dims for n in d)
    placed = {a.rule for a in named}
    for key, _ in table:
        if key not in placed:
            raise _places_nothing(cls.__name__, key, named, sorted(names))
    return tuple(plans)


def _places_nothing(owner: str, key: str, named: list[_Axis], names: list[str]):
    """E1901 for a rule that places no axis, naming what it could have meant."""
    spellings = sorted({s for a in named for s in a.spellings})
    firsts = {f for s in spellings if (f := first_factor(s)) is not None}
    shadowed = [
        a for a in named if key in a.spellings or key in {first_factor(s) for s in a.spellings}
    ]
    if shadowed:
        winners = sorted({a.rule for a in shadowed if a.rule is not None})
        return UnknownRuleDimError(
            f"the rules name `{key}`, but every axis spelled `{key}` (e.g. in `{shadowed[0].field}`)"
            f" is placed by the rule for an outer spelling ({', '.join(f'`{w}`' for w in winners)})"
            ", so it places nothing",
            fix=f"remove `{key}` from the rules (the outermost spelling with a rule wins), or "
            f"remove {', '.join(f'`{w}`' for w in winners)}",
        )
    where = (
        f"a dim of `{owner}` or a sub-model that no field's axis is spelled with"
        if key in names
        else f"which `{owner}` neither declares as a dim nor spells in a field"
    )
    usable = sorted(set(spellings) | firsts)
    shown = ", ".join(usable[:40]) + (f", ... ({len(usable)} in all)" if len(usable) > 40 else "")
    return UnknownRuleDimError(
        f"the rules name `{key}`, {where} (dims: {', '.join(names) or 'none'}), so it places "
        "nothing",
        fix=similar(key, usable, what="spelling")
        or f"remove `{key}` from the rules, or rule one of the spellings of the fields' axes: "
        f"{shown or 'none'}",
    )


def plan(
    cls: type[Model],
    dims: Dims,
    rules: Any,
    statics: Mapping[str, Any] | None = None,
    sizes: Mapping[str, int] | None = None,
) -> tuple[FieldPlan, ...]:
    """The placement of every param and buffer of a `cls` with these dims.

    `statics` are the static values by dotted name (`sm.models._introspect.statics(m)`, or a
    checkpoint's): they say which optional tensors are present. Those not given take the
    declared options and defaults. `sizes` are the mesh's axis sizes, which the FSDP preset
    (`fsdp(axis)`) needs to pick the axis it splits (without them it takes the largest).

    Raises:
        RuleTableError: (E1905) for a malformed table.
        UnknownRuleDimError: (E1901) for a rule that places no axis of any field.
        AxisReusedError: (E1904) when one field would use a mesh axis twice.
    """
    given = tuple(sorted((statics or {}).items()))
    plans = _plan(cls, tuple(dims.items()), given, rules_table(rules))
    if isinstance(rules, Fsdp):
        plans = split_largest(plans, rules.axes, sizes)
    return plans


def check_mesh(plans: tuple[FieldPlan, ...], rules: Any, mesh: Mesh) -> None:
    """Checks a plan against a mesh: every rule's axes exist, every split dim divides.

    Raises:
        UnknownMeshAxisError: (E1902) naming the rule and the mesh's axes.
        IndivisibleDimError: (E1903) naming the field, the dim, its size and the axes.
    """
    sizes = dict(mesh.shape)
    table = rules_table(rules)
    if isinstance(rules, Fsdp):
        table += (("fsdp", rules.axes),)
    for key, axes in table:
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
