"""`nn.MultiHeadAttention`: `H` heads of width `Dh = D // H`, optionally causal, with rotary,
learned or no positions, over a whole sequence (`__call__`) or incrementally against the library's
`KVCache` (`step`, a prefill or one decode step)."""

from __future__ import annotations

import math
import typing
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Bool, Float, Int

from .._shaped import shaped
from .._traceback import api_boundary
from ..models import Dims, normal, param, static, submodel
from ..state._index import check_index
from ..state._kvcache import KVCache
from ._errors import LayerDimsError, LayerInputError, LayerOptionError
from ._layer import Layer
from ._linear import Linear
from ._rotary import rotate

__all__ = ["MultiHeadAttention"]

_POSITIONS = ("none", "rotary", "learned")


@api_boundary
class MultiHeadAttention(Layer):
    """Multi-head self-attention, `[b t D] -> [b t D]`.

    Dims: `D` (width), `H` (heads), `Dh = D // H` (head width), `T` (context: the length of the
    learned position table and of a cache from `new_cache`). Sub-models: `q`, `k`, `v` (bias-free
    `Linear`s `D -> H * Dh`) and `o` (`H * Dh -> D`); `H * Dh` is `D`, spelled by heads so that a
    rule table can split attention by heads (`{"H": "model"}`). Options: `causal` (default False: every position sees every
    other), `positions`: `"none"` (the default), `"rotary"` (RoPE on queries and keys), or
    `"learned"` (a table `pos [T D]` added to the input of the query and key projections, not of
    the values, as in Shortformer's position-infused attention; `pos` is None otherwise).

    Example:
        >>> class Block(sm.Model):
        ...     dims = sm.Dims(D=64, H=4, T=128)
        ...     attn: nn.MultiHeadAttention = sm.submodel(
        ...         nn.MultiHeadAttention, causal=True, positions="rotary")
        >>> y = block.attn(x)                                   # x [b t D], t <= T
        >>> cache = block.attn.new_cache(batch=b)
        >>> y, cache = block.attn.step(x[:, :1], cache, 0, 0)   # decode position 0
    """

    dims = Dims(D=64, H=4, Dh="D // H", T=128)
    # The head side of each projection is spelled `H * Dh` (= D), laid out head after head: a
    # rule on `D` splits the model side only, and `{"H": "model"}` splits the heads (Megatron).
    q: Linear = submodel(Linear, In="D", Out="H * Dh", bias=False)
    k: Linear = submodel(Linear, In="D", Out="H * Dh", bias=False)
    v: Linear = submodel(Linear, In="D", Out="H * Dh", bias=False)
    o: Linear = submodel(Linear, In="H * Dh", Out="D", bias=False)
    pos: Float[Array, "T D"] | None = param(normal(std=0.02), when={"positions": "learned"})
    causal: bool = static(default=False)
    positions: str = static(default="none")

    @classmethod
    @typing.no_type_check  # validates its arguments itself, with coded errors
    def init(
        cls,
        seed: Any = 0,
        *,
        D: int = 64,
        H: int = 4,
        T: int = 128,
        causal: bool = False,
        positions: str = "none",
        max_bytes: int | None = None,
    ) -> MultiHeadAttention:
        """A new `MultiHeadAttention` drawn from `seed`.

        Args:
            seed: a whole number, a `jax.random.key` or an int array (as `sm.Model.init`).
            D: width (`H` must divide it; the head width is `Dh = D // H`).
            H: number of heads.
            T: context: the length of the learned position table and of `new_cache`'s cache.
            causal: whether each position sees only itself and earlier ones.
            positions: `"none"`, `"rotary"` (needs an even `Dh`) or `"learned"`.
            max_bytes: the most the layer may hold (default 16 GiB).
        """
        return super().init(
            seed, max_bytes=max_bytes, D=D, H=H, T=T, causal=causal, positions=positions
        )

    @classmethod
    def _check(cls, dims, options) -> None:
        if not isinstance(options["causal"], bool):
            raise LayerOptionError(
                f"`MultiHeadAttention` causal is {options['causal']!r}; it must be True or False",
                fix="use `sm.submodel(nn.MultiHeadAttention, causal=True)`",
            )
        pos = options["positions"]
        if not isinstance(pos, str) or pos not in _POSITIONS:
            raise LayerOptionError(
                f"`MultiHeadAttention` positions is {pos!r}; it must be one of "
                f"{', '.join(map(repr, _POSITIONS))}",
                fix='use `sm.submodel(nn.MultiHeadAttention, positions="rotary")` (or "learned", '
                '"none")',
            )
        if dims is None:
            return
        d, h = dims["D"], dims["H"]
        if h < 1 or d % h:
            raise LayerDimsError(
                f"`{cls.__name__}` has width D={d}, which H={h} heads do not divide",
                fix=f"choose H dividing D (e.g. H={next(i for i in (8, 4, 2, 1) if d % i == 0)})",
            )
        if pos == "rotary" and dims["Dh"] % 2:
            raise LayerDimsError(
                f"`{cls.__name__}` uses rotary positions, which rotate pairs of a head's "
                f"features, but its head width Dh = D // H = {dims['Dh']} is odd",
                fix="choose D and H with an even D // H",
            )

    @shaped
    def __call__(
        self, x: Float[Array, "b t D"], *, mask: Bool[Array, "t t"] | None = None
    ) -> Float[Array, "b t D"]:
        """Attention over the whole sequence `x [b t D]` (`mask [t t]`: which keys each query
        sees, combined with the causal mask when `causal`)."""
        t = x.shape[1]
        if self.pos is not None and t > self.dims.T:
            raise LayerInputError(
                f"a sequence of {t} positions is longer than the position table T={self.dims.T}",
                fix=f"pass at most {self.dims.T} positions, or build the layer with T >= {t}",
            )
        q, k, v = _project(self, x, 0)
        if self.causal:
            causal = jnp.tril(jnp.ones((t, t), bool))
            mask = causal if mask is None else mask & causal
        return _mix(self, q, k, v, mask)

    @shaped
    def step(
        self,
        x: Float[Array, "b n D"],
        cache: KVCache,
        layer: int | Int[Array, ""],
        pos: int | Int[Array, ""],
    ) -> tuple[Float[Array, "b n D"], KVCache]:
        """Runs `n` new positions `pos .. pos + n - 1` against `cache` (layer `layer`).

        Their keys and values are written into the cache, and each attends to every cached
        position up to its own (always causal). `n` = the prompt at `pos = 0` is a prefill,
        `n = 1` a decode step; `pos` may be traced (no recompile).

        Returns:
            `(y [b n D], cache)`, the cache now holding the new positions.

        Raises:
            StateIndexError: (E1401) if `pos + n` exceeds the cache (or `T`, with learned
                positions) or `pos < 0`.
            LayerInputError: (E1803) if the cache has other heads or head width.
        """
        d = self.dims
        if (cache.heads, cache.head_dim) != (d.H, d.Dh):
            raise LayerInputError(
                f"the cache holds {cache.heads} heads of width {cache.head_dim}, but the "
                f"attention has H={d.H} heads of width Dh={d.Dh}",
                fix="make the cache with `attn.new_cache(layers=..., batch=...)`",
            )
        n = x.shape[1]
        if self.pos is not None:
            # The table has T rows: a position past it is an index error, never a clamped read.
            pos = check_index(pos, d.T, what=f"positions of the table T={d.T}", extent=n)
        q, k, v = _project(self, x, pos)
        cache = cache.write(layer, pos, k.astype(cache.k.dtype), v.astype(cache.v.dtype))
        keys, values, mask = cache.read(layer, pos, n)
        return _mix(self, q, keys.astype(q.dtype), values.astype(q.dtype), mask), cache

    def new_cache(self, *, layers: int = 1, batch: int = 1, ctx: int | None = None) -> KVCache:
        """An empty `KVCache` for this attention: `layers` x `batch` x `ctx` (default `T`)
        positions of `H` heads of width `Dh`, in the weights' dtype."""
        d = self.dims
        ctx = d.T if ctx is None else ctx
        return KVCache(layers, ctx, d.H, d.Dh, self.q.w.dtype, batch=batch, name="attention cache")


def _project(m: MultiHeadAttention, x, offset):
    """Queries, keys and values `[b t H Dh]` of `x [b t D]` at positions `offset + i`."""
    b, t, _ = x.shape
    d = m.dims
    xqk = x
    if m.pos is not None:
        xqk = x + lax.dynamic_slice_in_dim(m.pos, offset, t)[None].astype(x.dtype)
    q = m.q(xqk).reshape(b, t, d.H, d.Dh)
    k = m.k(xqk).reshape(b, t, d.H, d.Dh)
    v = m.v(x).reshape(b, t, d.H, d.Dh)
    if m.positions == "rotary":
        positions = offset + jnp.arange(t)
        q, k = rotate(q, positions), rotate(k, positions)
    return q, k, v


def _mix(m: MultiHeadAttention, q, k, v, mask):
    """Softmax attention of `q [b n H Dh]` over `k, v [b s H Dh]` where `mask [n s]`, projected."""
    b, n = q.shape[:2]
    # The scale goes on q [b n H Dh], not on the scores [b H n s]: fewer numbers to multiply, in
    # the forward and the backward pass. The softmax runs in float32 whatever the compute dtype.
    q = q * jnp.asarray(1 / math.sqrt(m.dims.Dh), q.dtype)
    scores = jnp.einsum("bnhk,bshk->bhns", q, k, preferred_element_type=jnp.float32)
    if mask is not None:
        scores = jnp.where(mask[None, None], scores, jnp.finfo(scores.dtype).min)
    p = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return m.o(jnp.einsum("bhns,bshk->bnhk", p, v).reshape(b, n, m.dims.D))
