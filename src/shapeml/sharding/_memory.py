"""How many bytes each device holds of a model (and its optimizer state) placed by a rule table."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, TextIO

import jax
import numpy as np
from jax.sharding import Mesh

from .._traceback import api_boundary
from ..models import Model
from ..models._introspect import dotted_name
from ._place import checked_plans, shardings_like
from ._rules import Rules

__all__ = ["FieldMemory", "MemoryReport", "memory_report"]


@api_boundary
@dataclasses.dataclass(frozen=True)
class FieldMemory:
    """One array's bytes in all and on each device (the largest block: blocks are even).

    `rules` names the rule that placed each split axis, in axis order (`"F"`, `"D, F"`), as the
    table spells it (the outermost spelling with a rule wins); `""` for an array no rule splits
    and for optimizer state.
    """

    name: str
    shape: tuple[int, ...]
    spec: str
    total_bytes: int
    device_bytes: int
    rules: str = ""


@api_boundary
@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """Bytes per device of every field (and optimizer-state leaf) on a mesh.

    Attributes:
        rows: one `FieldMemory` per array, model fields first (`opt.`-prefixed rows after).
        devices: how many devices the mesh has.
    """

    rows: tuple[FieldMemory, ...]
    devices: int

    @property
    def total_bytes(self) -> int:
        """Bytes of one whole copy: what each device holds when everything is replicated."""
        return sum(r.total_bytes for r in self.rows)

    @property
    def device_bytes(self) -> int:
        """Bytes each device holds as placed."""
        return sum(r.device_bytes for r in self.rows)

    @property
    def ratio(self) -> float:
        """Per-device bytes relative to replicated (1/axis size for a table that splits all)."""
        return self.device_bytes / self.total_bytes if self.total_bytes else 1.0

    def __str__(self) -> str:
        width = max([len(r.name) for r in self.rows] + [5])
        rule = max([len(r.rules) for r in self.rows] + [4])
        lines = [
            f"{'field':{width}s}  {'shape':16s} {'spec':28s} {'rule':{rule}s} {'total':>12s} "
            f"{'per device':>12s}"
        ]
        lines += [
            f"{r.name:{width}s}  {str(list(r.shape)):16s} {r.spec:28s} {r.rules or '-':{rule}s} "
            f"{r.total_bytes:12,d} {r.device_bytes:12,d}"
            for r in self.rows
        ]
        lines.append(
            f"{'all':{width}s}  {'':16s} {f'{self.devices} devices':28s} {'':{rule}s} "
            f"{self.total_bytes:12,d} {self.device_bytes:12,d}  ({self.ratio:.3f} of replicated)"
        )
        return "\n".join(lines)


def _spec_text(spec) -> str:
    return "P(" + ", ".join(repr(s) for s in spec) + ")"


@api_boundary
def memory_report(
    m: Model, mesh: Mesh, rules: Rules, *, opt: Any = None, file: TextIO | None = sys.stdout
) -> MemoryReport:
    """Prints (to `file`; None prints nothing) and returns the bytes per device of each field.

    Computed from the declarations and the rules, so nothing is placed: plan a layout before you
    have the devices. Each row says which rule split the field (column `rule`): a rule on a
    parent's dim reaches the fields of the layers mapped to it. With `opt`, the optimizer state is
    counted too, each leaf placed as `step_shardings` places it.

    Example:
        >>> report = sm.memory_report(m, mesh, {"D": "data"}, opt=opt)
        >>> report.ratio   # 0.25 on a 4-device data axis
    """
    plans = checked_plans(m, mesh, rules).values()
    sizes = dict(mesh.shape)
    rows = [
        FieldMemory(
            p.name,
            p.shape,
            _spec_text(p.spec),
            int(np.prod(p.shape, dtype=np.int64)) * p.dtype.itemsize,
            int(np.prod(p.local_shape(sizes), dtype=np.int64)) * p.dtype.itemsize,
            ", ".join(r for r, axes in zip(p.rules, p.axes, strict=True) if r and axes),
        )
        for p in plans
    ]
    if opt is not None:
        placed = shardings_like(opt, m, mesh, rules)
        leaves = jax.tree_util.tree_leaves_with_path(opt)
        for (path, leaf), sharding in zip(leaves, jax.tree.leaves(placed), strict=True):
            shape = tuple(np.shape(leaf))
            item = np.dtype(getattr(leaf, "dtype", np.asarray(leaf).dtype)).itemsize
            local = sharding.shard_shape(shape)
            rows.append(
                FieldMemory(
                    f"opt.{dotted_name(path)}",
                    shape,
                    _spec_text(sharding.spec),
                    int(np.prod(shape, dtype=np.int64)) * item,
                    int(np.prod(local, dtype=np.int64)) * item,
                )
            )
    report = MemoryReport(tuple(rows), int(mesh.size))
    if file is not None:
        print(report, file=file)
    return report
