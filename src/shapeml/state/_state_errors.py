"""Errors of device-resident state, shared by `KVCache` and `state.Graph`: a write of the wrong
shape or dtype (E1403) and a buffer too large to allocate (E1412, raised by `allocate_zeros`)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from .._errors import ShapemlError
from .._validate import shorten

__all__ = ["StateAllocationError", "StateWriteError", "allocate_zeros"]

_WRITE = """
A write into a state must have exactly the shape and dtype of the part of the state it replaces;
nothing is broadcast or cast silently, because a silent cast (float64 into a float32 cache, or a
float into an int8 cache) is a bug that only shows much later. The check runs when the body is
traced, so it costs nothing per call.

    self.total[pos] = new                      # new: (width,), same dtype as total
    self.total[pos] = new.astype(jnp.float32)  # when new has another dtype
"""


class StateWriteError(
    ShapemlError,
    ValueError,
    code="E1403",
    title="state write of the wrong shape or dtype",
    explanation=_WRITE,
):
    pass


_ALLOC = """
A state (or a `KVCache`) was declared larger than the memory it is to be kept in: the host or the
device refused to allocate it. Nothing was allocated and nothing changed; the declaration named in
the message (its shape, dtype and size in bytes) is the one to shrink.

    self.cache = state((10**12, 16))     # 64 TB: E1412 on the first call
    self.cache = state((4096, 16))       # rows the call will actually index
"""


class StateAllocationError(
    ShapemlError,
    MemoryError,
    code="E1412",
    title="state too large to allocate",
    explanation=_ALLOC,
):
    pass


def allocate_zeros(shape: tuple[int, ...], dtype: np.dtype, where=None, *, what: str, fix: str):
    """Zeros the caller owns (on `where`: a device or a sharding), or E1412 naming `what`, its
    shape and size when the memory cannot be had (not a MemoryError or RESOURCE_EXHAUSTED)."""
    try:
        return jnp.zeros(shape, dtype, device=where)
    except (MemoryError, ValueError, jax.errors.JaxRuntimeError) as e:
        size = math.prod(shape) * np.dtype(dtype).itemsize
        raise StateAllocationError(
            f"{what} of shape {list(shape)} ({np.dtype(dtype).name}, {size:,} bytes) could not "
            f"be allocated: {shorten(str(e))}",
            fix=fix,
        ) from None
