"""A rule table checked and normalised: dim names (canonical spellings) to tuples of mesh axes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._validate import shorten
from ._errors import RuleTableError
from ._spellings import canon

__all__ = ["Axes", "rules_table"]

Axes = tuple[str, ...]  # the mesh axes one array axis is split over; () is replicated


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
        key_canon = canon(key)
        if key_canon in out:
            raise RuleTableError(
                f"rules `{key}` and another key both spell `{key_canon}`",
                fix="keep one rule per dim",
            )
        out[key_canon] = axes
    return tuple(sorted(out.items()))
