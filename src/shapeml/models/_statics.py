"""Static configuration fields of a model (`sm.static()`): checked, hashed, saved as JSON.

A static field is part of the model's tree structure, not a leaf, so `jax.jit` sees it as
configuration. It must be hashable (jit compares and hashes tree structures) and JSON-serializable
(`sm.save` writes it into the checkpoint's metadata), so it is a number, string, bool, None, or a
tuple of these (nested); JSON's lists come back as tuples.
"""

from __future__ import annotations

import json
from typing import Any

from .._errors import ArgumentTypeError

__all__ = ["check_static", "from_json"]


def check_static(owner: str, name: str, value: Any) -> Any:
    """`value` if it can be a static field's value (hashable and JSON-serializable).

    Raises:
        ArgumentTypeError: (E0003) naming the field and what it got.
    """
    if isinstance(value, list):
        value = from_json(value)
    try:
        hash(value)
        ok = from_json(json.loads(json.dumps(value, allow_nan=False))) == value
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ArgumentTypeError(
            f"`{owner}.{name}` is a static field; {type(value).__name__} {_short(value)} is not "
            "a hashable, JSON-serializable value",
            fix="use numbers, strings, bools, None and tuples of them (a mapping as a tuple of "
            "(key, value) pairs)",
        )
    return value


def from_json(value: Any) -> Any:
    """A JSON value with every list turned into a tuple (so it hashes)."""
    if isinstance(value, list):
        return tuple(from_json(v) for v in value)
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
