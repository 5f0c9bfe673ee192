"""The FSDP preset: every field split along one mesh axis, composed with a tensor-parallel table.

`fsdp("data")` is a rule table that needs no dim names: each field (and with it its optimizer
state) is split over the mesh axis `data` along its largest axis that the axis's size divides
and that no other rule splits; a field with no such axis stays replicated. `fsdp(("data",
"model"))` splits over both axes at once (every device of a 2-d mesh holds 1/4). Given a
tensor-parallel table, `fsdp("data", {"F": "model"})` applies that table first and then splits
every field along one of its remaining axes: PyTorch's FSDP on a 2-d mesh (FSDP x TP) in one line.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator, Mapping
from typing import Any

from .._errors import ArgumentTypeError
from .._traceback import api_boundary
from .._validate import shorten
from ._table import rules_table

__all__ = ["Fsdp", "fsdp", "split_largest"]


@api_boundary
@dataclasses.dataclass(frozen=True)
class Fsdp(Mapping):
    """A rule table (`fsdp(axis, rules)`): the tensor-parallel `rules`, then every field split
    over mesh axes `axes` along its largest free axis. Pass it wherever a table goes
    (`sm.shard`, `TrainStep(mesh=, rules=)`, `train`, `sharding.load`, `memory_report`).

    Attributes:
        axes: the mesh axes every field is split over (those the rules leave it).
        table: the tensor-parallel rules applied first, as `(dim, mesh axes)` pairs.
    """

    axes: tuple[str, ...]
    table: tuple[tuple[str, Any], ...] = ()

    def __getitem__(self, key: str) -> Any:
        return dict(self.table)[key]

    def __iter__(self) -> Iterator[str]:
        return iter(k for k, _ in self.table)

    def __len__(self) -> int:
        return len(self.table)

    def __repr__(self) -> str:
        axis = self.axes[0] if len(self.axes) == 1 else self.axes
        return f"fsdp({axis!r}, {dict(self.table)!r})" if self.table else f"fsdp({axis!r})"

    def __hash__(self) -> int:
        return hash((self.axes, repr(self.table)))


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def fsdp(axis: str | tuple[str, ...] = "data", rules: Mapping[str, Any] | None = None) -> Fsdp:
    """The FSDP rule table: every field split over mesh axis `axis`, after `rules` (optional
    tensor-parallel rules by dim name) have placed what they name.

    Each field is split along its largest axis that the mesh axes divide and that `rules` leave
    unsplit (the first of equal ones), over those of the mesh axes `rules` do not already use
    for that field; a field with no such axis stays as `rules` place it. Its optimizer state
    follows it. Without a mesh (`partition_specs`) the sizes are unknown, and the largest free
    axis is taken.

    Args:
        axis: the mesh axis to split every field over (the data-parallel one, as in FSDP), or
            a tuple of axes to split over all of them (`("data", "model")`: over every device
            of a 2-d mesh).
        rules: a tensor-parallel table applied first, e.g. `{"F": "model"}`; see each zoo
            model's docs for its table.

    Returns:
        an `Fsdp` rule table.

    Raises:
        ArgumentTypeError: (E0003) for an axis that is not a name.
        RuleTableError: (E1905) for a malformed `rules`.

    Example:
        >>> mesh = sharding.make_mesh("data=2,model=2")
        >>> step = TrainStep(gpt2.loss, m, opt, mesh=mesh,
        ...                  rules=sharding.fsdp("data", {"F": "model", "H": "model"}))
        >>> print(sharding.memory_report(m, mesh, sharding.fsdp("data"), opt))
    """
    axes = (axis,) if isinstance(axis, str) else axis
    if (
        not isinstance(axes, tuple)
        or not axes
        or not all(isinstance(a, str) and a for a in axes)
        or len(set(axes)) != len(axes)
    ):
        raise ArgumentTypeError(
            f"fsdp(axis) takes a mesh axis name or a tuple of distinct names, got {shorten(axis)}",
            fix='pass e.g. sharding.fsdp("data") or sharding.fsdp(("data", "model"))',
        )
    table = rules_table({} if rules is None else rules)
    return Fsdp(axes, tuple((k, v[0] if len(v) == 1 else v if v else None) for k, v in table))


def split_largest(plans: tuple, axes: tuple[str, ...], sizes: Mapping[str, int] | None) -> tuple:
    """`plans` (FieldPlans) with each one split over those of `axes` it does not use yet, along
    its largest free axis that their sizes divide (any free axis when `sizes` is None); those
    with no such axis unchanged."""
    out = []
    for p in plans:
        used = {a for ax in p.axes for a in ax}
        mine = tuple(a for a in axes if a not in used)
        parts = 1
        for a in mine:
            parts *= (sizes or {}).get(a, 1)
        free = [
            i
            for i, (n, a) in enumerate(zip(p.shape, p.axes, strict=True))
            if not a and n > 1 and n % parts == 0
        ]
        if not mine or not free:
            out.append(p)
            continue
        i = max(free, key=lambda j: (p.shape[j], -j))
        out.append(
            dataclasses.replace(
                p,
                axes=p.axes[:i] + (mine,) + p.axes[i + 1 :],
                units=p.units[:i] + (p.shape[i],) + p.units[i + 1 :],
                rules=p.rules[:i] + ("fsdp",) + p.rules[i + 1 :],
            )
        )
    return tuple(out)
