"""Host arrays converted to a declared dtype only when no value changes meaning.

Used wherever users hand shapeml numpy data for a declared tensor (model fields, graph weights):
float64 -> float32 and int -> float are fine; an integer that does not fit, or a finite float that
would become inf, is refused with the offending value instead of wrapping silently.
"""

from __future__ import annotations

import numpy as np

__all__ = ["cast_host_array"]


def cast_host_array(value: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray | None, str | None]:
    """`(converted, None)`, or `(None, why)` when the conversion would change a value's meaning."""
    src, dst = np.dtype(value.dtype), np.dtype(dtype)
    same_kind = (
        src.kind == dst.kind
        or (dst.kind in "fc" and src.kind in "iu")
        or (dst.kind in "iu" and src.kind in "iu")
    )
    if not same_kind:
        return None, f"dtype {src.name} cannot become {dst.name} (another kind)"
    if dst.kind in "iu" and value.size:
        info = np.iinfo(dst)
        lo, hi = value.min(), value.max()
        if lo < info.min or hi > info.max:
            bad = lo if lo < info.min else hi
            return None, f"the value {bad} does not fit in {dst.name} ({info.min}..{info.max})"
    with np.errstate(over="ignore"):  # overflow is detected below and reported with the value
        converted = value.astype(dst)
    if dst.kind == "f" and src.kind == "f" and value.size:
        overflow = np.isfinite(value) & ~np.isfinite(converted)
        if overflow.any():
            return None, f"the value {value[overflow].flat[0]} overflows {dst.name}"
    return converted, None
