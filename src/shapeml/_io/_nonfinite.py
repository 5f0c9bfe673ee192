"""NaN and infinities in saved tensors: which names may hold them, which arrays do, and their names
in a message. Writers refuse them (E1307) and readers warn (W1301) unless asked otherwise."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from .._errors import ArgumentTypeError
from .._validate import shorten

__all__ = ["allowed_nonfinite", "names_text", "nonfinite"]

# Scanned for NaN/inf this many elements at a time, so the check never allocates a copy's worth.
_CHUNK = 1 << 22


def allowed_nonfinite(allow_nonfinite: Any) -> bool | frozenset[str]:
    """`allow_nonfinite` checked: a bool, or the frozenset of names that may hold NaN/inf."""
    if isinstance(allow_nonfinite, bool):
        return allow_nonfinite
    if (
        isinstance(allow_nonfinite, Collection)
        and not isinstance(allow_nonfinite, (str, bytes))
        and all(isinstance(n, str) for n in allow_nonfinite)
    ):
        return frozenset(allow_nonfinite)
    raise ArgumentTypeError(
        f"`allow_nonfinite` must be True, False or a collection of tensor names, got "
        f"{shorten(allow_nonfinite)}",
        fix="pass allow_nonfinite=True, or e.g. allow_nonfinite=('mask',)",
    )


def nonfinite(arrays: Mapping[str, np.ndarray], skip: Iterable[str] | bool = ()) -> list[str]:
    """The names of floating arrays holding a NaN or an infinity (`skip`: names not checked)."""
    if skip is True:
        return []
    skip = set(skip or ())
    bad = []
    for name, a in arrays.items():
        if name in skip or not jnp.issubdtype(a.dtype, jnp.inexact) or a.size == 0:
            continue
        flat = a.reshape(-1)
        if any(not np.isfinite(flat[i : i + _CHUNK]).all() for i in range(0, flat.size, _CHUNK)):
            bad.append(name)
    return bad


def names_text(names: list[str], limit: int = 5) -> str:
    """`a`, `b` and 3 more: a list of names cut for a message (each name cut too)."""
    cut = [n if len(n) <= 60 else n[:57] + "..." for n in names[:limit]]
    shown = ", ".join(f"`{n}`" for n in cut)
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
