"""The integer decode step in JAX, and the generate loop: pure functions of the model and a cache.

The step is written once, for the local slice of one device: unsplit it sees every head and every
FFN column; under tensor parallel (`_tp.py`, inside `shard_map`) it sees its own, and `project`
all-reduces the int32 partial sums of the output projections before their requant.
"""

from __future__ import annotations

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._traceback import api_boundary
from ..state._kvcache import KVCache
from ._cache import init_cache
from ._numerics import REQUANT_POINTS, requant_jax

__all__ = ["Projection", "generate_loop", "project", "step"]

# An output projection's rule, `project`'s signature:
# (x int8 [n], w int8 [n m], pair int32 [2], axis str | None) -> (acc int32 [m], out int8 [m]).
Projection = Callable[..., tuple[jax.Array, jax.Array]]


def _mv(x: jax.Array, w: jax.Array) -> jax.Array:
    """int8 vector [n] @ int8 matrix [n m] -> int32 [m], accumulated in int32."""
    return lax.dot_general(x, w, (((0,), (0,)), ((), ())), preferred_element_type=jnp.int32)


@api_boundary
def project(
    x: jax.Array, w: jax.Array, pair: jax.Array | np.ndarray, axis: str | None = None
) -> tuple[jax.Array, jax.Array]:
    """An output projection (Wo, W2), the rule: `acc = x @ w`, all-reduced over `axis` when the
    rows of `w` are split over devices, then one requant of the sum.

    Args:
        x: int8 [n], this device's slice of the input.
        w: int8 [n m], the matching rows.
        pair: int32 [2], the requant's (M, S) (numpy: a compile-time constant).
        axis: the mesh axis the rows are split over (None: unsplit).

    Returns:
        `(acc, out)`: int32 [m] the whole sum, int8 [m] its requant.
    """
    acc = _mv(x, w)
    if axis is not None:
        acc = lax.psum(acc, axis)  # exact: integer addition, within the int32 bounds
    return acc, requant_jax(acc, pair[0], pair[1])


@api_boundary
def step(
    m,
    tok: jax.Array,
    pos: jax.Array,
    cache: KVCache,
    *,
    axis: str | None = None,
    project: Projection = project,
) -> dict[str, jax.Array]:
    """One decode step on (a device's slice of) the model; returns every intermediate.

    Args:
        m: the model (`Int8Model`); under tensor parallel, this device's slices of its tables.
        tok, pos: int32 scalars, 0 <= tok < V and 0 <= pos < T; checked inside the program with
            `eqx.error_if` (E1608, and the cache's E1401), as the methods check them on the host.
        cache: the int8 KV cache, k/v `[1 1 T H Dh]` (this device's heads under tp).
        axis: the mesh axis that splits heads and FFN columns (None: unsplit).
        project: the output projections' rule (`project`); the tests pass a wrong one.

    Returns:
        name -> array; attention intermediates are [heads T] with masked positions zeroed
        (scores/dist/idx/e/p at j > pos are 0). Includes `cache` (the new KVCache), `k_cache`,
        `v_cache` (its rows as [T heads*Dh]), `logits`, `next`.
    """
    pairs = m.requant_pairs  # numpy constants in the compiled programs (`_programs.py`)
    pair = lambda name: pairs[REQUANT_POINTS.index(name)]
    rq = lambda x, name: requant_jax(x, *pair(name))
    i32 = lambda a: a.astype(jnp.int32)
    heads, dh = cache.heads, cache.head_dim  # this device's heads
    r: dict[str, jax.Array] = {}
    # JAX would clamp an out-of-range gather; the cache checks `pos` the same way on write.
    vocab = m.embed.shape[0]
    bad = (tok < 0) | (tok >= vocab)
    tok = eqx.error_if(tok, bad, f"[E1608] the token id is outside the vocabulary 0..{vocab - 1}")
    x0 = jnp.clip(i32(m.embed[tok]) + i32(m.positions[pos]), -128, 127).astype(jnp.int8)
    r["x0"] = x0
    for n, w in (("q", m.wq), ("k", m.wk), ("v", m.wv)):
        r[f"{n}_acc"] = _mv(x0, w)
        r[n] = rq(r[f"{n}_acc"], n)
    cache = cache.write(0, pos, r["k"].reshape(1, heads, dh), r["v"].reshape(1, heads, dh))
    K, V, valid = cache.read(0, pos)  # [1 T heads dh] twice, [1 T]
    K, V = K[0], V[0]
    ctx = K.shape[0]
    q = r["q"].reshape(heads, dh)
    scores = lax.dot_general(q, K, (((1,), (2,)), ((0,), (1,))), preferred_element_type=jnp.int32)
    scores = jnp.where(valid, scores, 0)
    mx = jnp.max(jnp.where(valid, scores, jnp.iinfo(jnp.int32).min), axis=1, keepdims=True)
    dist = jnp.where(valid, mx - scores, 0)
    L = m.exp_table.shape[0]
    idx = jnp.where(valid, jnp.minimum(i32(rq(dist, "score")), L - 1), 0)
    e = jnp.where(valid, m.exp_table[idx], 0)
    z = jnp.sum(e, axis=1, keepdims=True)
    pr = (254 * e + z) // (2 * z)
    r.update(scores=scores, dist=dist, idx=idx, e=e, z=z[:, 0], p=pr)
    attn_acc = lax.dot_general(
        pr.astype(jnp.int8), V, (((1,), (0,)), ((0,), (1,))), preferred_element_type=jnp.int32
    )
    r["attn_acc"] = attn_acc.reshape(-1)
    r["attn"] = rq(r["attn_acc"], "attn")
    r["wo_acc"], r["wo"] = project(r["attn"], m.wo, pair("wo"), axis)
    r["res1"] = rq(i32(x0), "res1")
    r["x1"] = jnp.clip(i32(r["res1"]) + i32(r["wo"]), -128, 127).astype(jnp.int8)
    r["w1_acc"] = _mv(r["x1"], m.w1)
    r["h"] = jnp.maximum(rq(r["w1_acc"], "w1"), 0)
    r["w2_acc"], r["w2"] = project(r["h"], m.w2, pair("w2"), axis)
    r["res2"] = rq(i32(r["x1"]), "res2")
    r["x2"] = jnp.clip(i32(r["res2"]) + i32(r["w2"]), -128, 127).astype(jnp.int8)
    r["logits"] = _mv(r["x2"], m.eq.T)
    r["next"] = jnp.argmax(r["logits"]).astype(jnp.int32)
    r["cache"] = cache
    r["k_cache"], r["v_cache"] = K.reshape(ctx, -1), V.reshape(ctx, -1)
    return r


@api_boundary
def generate_loop(
    m,
    buf: jax.Array,
    plen: jax.Array,
    steps: jax.Array,
    *,
    axis: str | None = None,
    project: Projection = project,
) -> tuple[jax.Array, jax.Array, KVCache]:
    """Runs `steps` decode steps from position 0 inside one program (a `lax.fori_loop`).

    Args:
        m: the model (a device's slices under tp).
        buf: int32 [T + 1]; entries 0..plen-1 hold the prompt.
        plen: int32 scalar, the prompt length (>= 1).
        steps: int32 scalar, how many tokens to feed (<= T).
        axis, project: as for `step`.

    Returns:
        `(buf, preds, cache)`: buf with the generated tokens at plen..steps; preds int32 [T],
        preds[t] the `next` of the step at position t (0 past `steps`); the final cache.
    """
    ctx = m.positions.shape[0]
    dh = m.dims.Dh

    def body(t, carry):
        buf, preds, c = carry
        r = step(m, buf[t], t, c, axis=axis, project=project)
        nxt = r["next"]
        keep = t + 1 < plen
        buf = buf.at[t + 1].set(jnp.where(keep, buf[t + 1], nxt))
        preds = preds.at[t].set(nxt)
        return buf, preds, r["cache"]

    preds = jnp.zeros((ctx,), jnp.int32)
    # The cache starts empty inside the program: nothing to upload per call. Its heads are this
    # device's: the columns of Wq it holds, over the head width.
    cache = init_cache(m, heads=m.wq.shape[1] // dh)
    if axis is not None:  # each device's slice of the cache differs (shard_map)
        cache = jax.tree.map(lambda a: lax.pcast(a, axis, to="varying"), cache)
    return lax.fori_loop(jnp.int32(0), steps, body, (buf, preds, cache))
