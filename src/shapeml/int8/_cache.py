"""The decode's KV cache: the library's `shapeml.state.KVCache` (int8, one layer, batch 1), and
its conversions to and from the reference's rows (int8 [ctx d])."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..state._kvcache import KVCache
from ._errors import Int8PositionError

__all__ = ["cache_from_rows", "cache_rows", "check_cache", "init_cache"]


def init_cache(m, *, heads: int | None = None) -> KVCache:
    """An empty cache for `m`: k, v int8 `[1 1 T H Dh]` (layer, batch, position, head, lane);
    `heads`: a device's share of H under tensor parallel (default: all H)."""
    dims = m.dims
    heads = dims.H if heads is None else heads
    return KVCache(1, dims.T, heads, dims.Dh, jnp.int8, batch=1, name="int8 KV cache")


def check_cache(dims, cache: Any) -> KVCache:
    """`cache` if it is a KVCache of the layout of a model with these dims (`m.dims`), else
    Int8PositionError (E1610)."""
    want = (1, 1, dims.T, dims.H, dims.Dh)
    if not isinstance(cache, KVCache):
        raise Int8PositionError(
            f"cache must be a shapeml.state.KVCache, got {type(cache).__name__}",
            fix="start from model.init_cache()",
        )
    for name, a in (("k", cache.k), ("v", cache.v)):
        if tuple(a.shape) != want or a.dtype != jnp.int8:
            raise Int8PositionError(
                f"cache.{name} is {a.dtype}{tuple(a.shape)}, expected int8{want}",
                fix="start from model.init_cache()",
            )
    return cache


def cache_rows(m, cache: KVCache) -> tuple[np.ndarray, np.ndarray]:
    """Keys and values as int8 [ctx d] numpy arrays: row j is position j (the reference's view)."""
    cache = check_cache(m.dims, cache)
    k, v = jax.device_get((cache.k, cache.v))
    shape = (m.dims.T, m.dims.D)
    return np.asarray(k).reshape(shape), np.asarray(v).reshape(shape)


def cache_from_rows(m, k: np.ndarray, v: np.ndarray) -> KVCache:
    """A KVCache holding int8 [ctx d] key and value rows (e.g. the reference's).

    Raises:
        Int8PositionError: (E1610) for rows of another shape or dtype.
    """
    shape = (m.dims.T, m.dims.D)
    rows = {}
    for name, x in (("k", k), ("v", v)):
        x = np.asarray(x)
        if x.shape != shape or x.dtype != np.int8:
            raise Int8PositionError(
                f"{name} rows are {x.dtype}{x.shape}, expected int8{shape}",
                fix="pass the reference's k_cache / v_cache",
            )
        rows[name] = jnp.asarray(x.reshape(1, m.dims.T, m.dims.H, m.dims.Dh))  # [B n H Dh]
    return init_cache(m).write(0, 0, rows["k"], rows["v"])  # all T positions from 0
