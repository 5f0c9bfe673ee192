"""`KVCache`: the keys and values of past positions of a decoder, one slot per position.

A decode step writes this position's K and V (`write`) and attends over positions `0..pos`
(`read` returns the whole cache and the mask). The cache is a plain pytree, usable inside any
`jax.jit` or `lax.scan`, and as the carry of a stateful step (a `Graph` state, the cached
decoder), where its buffers are donated and updated in place. Every position is bounds-checked,
never clamped (`check_index`): in a stateful step inside its program, before the step runs, so a
bad position changes nothing; in your own `jit` by `eqx.error_if`.
"""

from __future__ import annotations

import typing
from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Bool, Int, Shaped

from .._traceback import api_boundary
from .._validate import held_dtype, instance, integer, numeric_dtype, shorten
from ._index import check_index
from ._state_errors import StateWriteError, allocate_zeros

__all__ = ["KVCache"]


@api_boundary
class KVCache(eqx.Module):
    """Keys and values of `ctx` positions for each of `layers` layers.

    Attributes:
        k: keys, shape `[layers, batch, ctx, heads, head_dim]`.
        v: values, the same shape.
        name: how errors name this cache.

    Example:
        >>> cache = KVCache(layers=2, ctx=16, heads=4, head_dim=8)
        >>> cache = cache.write(0, pos, k, v)       # k, v: [batch, heads, head_dim]
        >>> keys, values, mask = cache.read(0, pos)  # [batch, ctx, heads, head_dim], [1, ctx]
    """

    # What each axis of `k` and `v` holds, by the dim names a rule table uses (`{"H": "tp"}`
    # splits a cache over its heads, as the attention weights it serves).
    AXES: typing.ClassVar[tuple[str, ...]] = ("L", "B", "T", "H", "Dh")

    k: Shaped[Array, "L B T H Dh"]
    v: Shaped[Array, "L B T H Dh"]
    name: str = eqx.field(static=True)

    @typing.no_type_check  # validates its arguments itself, with coded errors
    def __init__(
        self,
        layers: int,
        ctx: int,
        heads: int,
        head_dim: int,
        dtype: Any = jnp.float32,
        *,
        batch: int = 1,
        name: str = "KVCache",
    ):
        """Raises `ArgumentError`/`ArgumentTypeError` (E0002, E0003) for a size that is not an
        int >= 1 or a non-numeric dtype, and `StateAllocationError` (E1412) when the memory
        cannot be had (sizes are checked before anything is allocated)."""
        # Checked before anything is allocated: a float, a bool or a negative size is refused,
        # never truncated or read as 1.
        shape = tuple(
            integer(arg, value, low=1, fix=f"pass `{arg}` as a positive Python int")
            for arg, value in (
                ("layers", layers),
                ("batch", batch),
                ("ctx", ctx),
                ("heads", heads),
                ("head_dim", head_dim),
            )
        )
        instance("name", name, str, "a string")
        dtype = held_dtype(numeric_dtype(dtype, f"{name}(dtype=)"), f"{name} (k and v)")
        fix = "use a shorter context, fewer layers or a smaller batch"
        axes = "[layers, batch, ctx, heads, head_dim]"
        self.k = allocate_zeros(shape, dtype, what=f"{name}.k {axes}", fix=fix)
        self.v = allocate_zeros(shape, dtype, what=f"{name}.v {axes}", fix=fix)
        self.name = name

    @property
    def layers(self) -> int:
        return self.k.shape[0]

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    @property
    def ctx(self) -> int:
        return self.k.shape[2]

    @property
    def heads(self) -> int:
        return self.k.shape[3]

    @property
    def head_dim(self) -> int:
        return self.k.shape[4]

    def _layer(self, layer):
        return check_index(layer, self.layers, what=f"{self.name} layers")

    def _pos(self, pos, n):
        n = integer("n", n, low=1, fix="pass n, how many positions, as a Python int >= 1")
        what = f"{self.name} positions (ctx)"
        return check_index(pos, self.ctx, what=what, extent=n)

    @typing.no_type_check  # validates its arguments itself, with coded errors
    def write(
        self,
        layer: int | Int[Array, ""],
        pos: int | Int[Array, ""],
        k: Shaped[Array, "B H Dh"] | Shaped[Array, "B n H Dh"],
        v: Shaped[Array, "B H Dh"] | Shaped[Array, "B n H Dh"],
    ) -> KVCache:
        """A cache with `k`, `v` written at `layer`, positions `pos .. pos + n - 1`.

        Args:
            layer: which layer's slots (an int, or traced inside a scan over layers).
            pos: the first position written (an int or a traced 0-d int).
            k: keys, `[batch, heads, head_dim]` for one position or `[batch, n, heads, head_dim]`.
            v: values, the same shape as `k`.

        Raises:
            StateIndexError: (E1401) if `layer` or `pos .. pos + n - 1` is outside the cache.
            StateWriteError: (E1403) if `k` or `v` is not an array of the cache's shape and dtype.
        """
        for label, x in (("k", k), ("v", v)):
            if not hasattr(x, "ndim") or x.ndim not in (3, 4):
                raise StateWriteError(
                    f"{self.name}.write takes {label} as an array of shape [batch, heads, "
                    f"head_dim] or [batch, n, heads, head_dim], got {shorten(x)}",
                    fix=f"pass {label} as a jax array of dtype {self.k.dtype}",
                )
        one = k.ndim == 3
        k4 = k[:, None] if one else k
        v4 = v[:, None] if one else v
        n = k4.shape[1]
        want = (self.batch, n, self.heads, self.head_dim)
        for label, x in (("k", k4), ("v", v4)):
            if tuple(x.shape) != want or x.dtype != self.k.dtype:
                got = tuple(x.shape[:1]) + tuple(x.shape[2:]) if one else tuple(x.shape)
                raise StateWriteError(
                    f"{self.name}.write got {label} of shape {got} ({x.dtype}), but the cache "
                    f"takes [batch={self.batch}, (n,) heads={self.heads}, "
                    f"head_dim={self.head_dim}] ({self.k.dtype})",
                    fix=f"reshape {label} to {(self.batch, self.heads, self.head_dim)} and cast "
                    f"it to {self.k.dtype}",
                )
        layer = self._layer(layer)
        pos = self._pos(pos, n)
        start = (layer, 0, pos, 0, 0)

        def put(cache, new):
            return lax.dynamic_update_slice(cache, new[None], start)

        return eqx.tree_at(lambda c: (c.k, c.v), self, (put(self.k, k4), put(self.v, v4)))

    @typing.no_type_check  # validates its arguments itself, with coded errors
    def mask(self, pos: int | Int[Array, ""], n: int = 1) -> Bool[Array, "n T"]:
        """`[n, ctx]`: query `i` (at position `pos + i`) sees positions `0 .. pos + i`."""
        pos = self._pos(pos, n)
        return jnp.arange(self.ctx)[None, :] <= pos + jnp.arange(n)[:, None]

    @typing.no_type_check  # validates its arguments itself, with coded errors
    def read(
        self, layer: int | Int[Array, ""], pos: int | Int[Array, ""], n: int = 1
    ) -> tuple[Shaped[Array, "B T H Dh"], Shaped[Array, "B T H Dh"], Bool[Array, "n T"]]:
        """Keys and values of `layer` (all `ctx` slots) and the causal mask for queries at
        `pos .. pos + n - 1`: positions after a query are masked (they hold stale values).

        Returns:
            `(k, v, mask)`: `[batch, ctx, heads, head_dim]` twice, and `[n, ctx]` booleans.
        """
        layer = self._layer(layer)
        mask = self.mask(pos, n)
        k = lax.dynamic_index_in_dim(self.k, layer, 0, keepdims=False)
        v = lax.dynamic_index_in_dim(self.v, layer, 0, keepdims=False)
        return k, v, mask
