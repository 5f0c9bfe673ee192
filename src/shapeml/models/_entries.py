"""The report of a checkpoint's entries against a model's declarations: every missing,
unexpected (with near-miss hints), wrong-shape and wrong-dtype entry, at once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .._errors import similar

__all__ = ["entry_problems", "first_problems"]


def entry_problems(expected: Mapping[str, tuple], arrays: Mapping[str, Any]) -> list[str]:
    """Every missing, unexpected (with near-miss hints), wrong-shape and wrong-dtype entry.

    `expected` maps each name to `(shape, dtype)`.
    """
    problems = []
    missing = [k for k in expected if k not in arrays]
    for k in missing:
        problems.append(f"missing: `{k}` {_fmt(*expected[k])}")
    for k in arrays:
        if k not in expected:
            # near-miss hints are for a renamed field or two, not for a file of another model
            hint = similar(k, missing, what="missing entry") if len(missing) <= 64 else None
            problems.append(
                f"unexpected: `{k}` {_fmt(arrays[k].shape, arrays[k].dtype)}"
                + (f" ({hint})" if hint else "")
            )
    for k, (shape, dtype) in expected.items():
        if k in arrays:
            a = arrays[k]
            if tuple(a.shape) != tuple(shape):
                problems.append(
                    f"wrong shape: `{k}` expected {_fmt(shape, dtype)}, "
                    f"file has {_fmt(a.shape, a.dtype)}"
                )
            elif np.dtype(a.dtype) != np.dtype(dtype):
                problems.append(
                    f"wrong dtype: `{k}` expected {np.dtype(dtype).name}, "
                    f"file has {np.dtype(a.dtype).name}"
                )
    return problems


def first_problems(problems: list[str], limit: int = 40) -> list[str]:
    """The problems to list in a message: all of a few, the first `limit` of many."""
    if len(problems) <= limit:
        return problems
    return [*problems[:limit], f"... and {len(problems) - limit} more"]


def _fmt(shape, dtype) -> str:
    return f"[{' '.join(map(str, shape))}] {np.dtype(dtype).name}"
