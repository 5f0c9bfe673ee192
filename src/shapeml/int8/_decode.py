"""The integer decode step in JAX, and `generate`: the whole trace in one compiled call.

The step body is written once, for the local slice of one device: unsplit it sees every head and
every FFN column; under tensor parallel (`_tp.py`) it sees its own and all-reduces its int32
partial sums before their requant.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax

from ..state import KVCache
from ._numerics import requant_jax

__all__ = ["Int8Params", "generate_loop", "new_cache", "step_body"]


class Int8Params(NamedTuple):
    """The model's tables as device arrays (int8, except the int32 exp table)."""

    embed: jax.Array  # [vocab d]
    positions: jax.Array  # [ctx d]
    wq: jax.Array  # [d d]   (a device's columns under tp)
    wk: jax.Array
    wv: jax.Array
    wo: jax.Array  # [d d]   (a device's rows under tp)
    w1: jax.Array  # [d d_ff] (columns under tp)
    w2: jax.Array  # [d_ff d] (rows under tp)
    eq: jax.Array  # [vocab d]
    exp_table: jax.Array  # int32 [L]


def new_cache(ctx: int, heads: int, dh: int) -> KVCache:
    """The one layer's KV cache, `shapeml.state.KVCache` in int8: k, v `[1 1 ctx heads dh]`."""
    return KVCache(1, ctx, heads, dh, jnp.int8, batch=1, name="int8 KV cache")


def _write(cache: KVCache, pos: jax.Array, k: jax.Array, v: jax.Array) -> KVCache:
    """Writes position `pos`'s key and value rows ([heads dh] each) into the cache.

    `KVCache.write` would check a traced `pos` inside the program with a host callback, which
    puts every call of the compiled step on JAX's slow dispatch path (~0.6 ms instead of ~0.1 ms
    per call here). `pos` is checked on the host before every call instead (`decode_step`), and
    `generate`'s loop bound is checked against ctx, so the write goes straight to the arrays.
    """
    start = (jnp.int32(0), jnp.int32(0), pos.astype(jnp.int32), jnp.int32(0), jnp.int32(0))
    put = lambda a, x: lax.dynamic_update_slice(a, x[None, None, None], start)
    return eqx.tree_at(lambda c: (c.k, c.v), cache, (put(cache.k, k), put(cache.v, v)))


def _mv(x: jax.Array, w: jax.Array) -> jax.Array:
    """int8 vector [n] @ int8 matrix [n m] -> int32 [m], accumulated in int32."""
    return lax.dot_general(x, w, (((0,), (0,)), ((), ())), preferred_element_type=jnp.int32)


def step_body(
    p: Int8Params,
    tok: jax.Array,
    pos: jax.Array,
    cache: KVCache,
    *,
    pairs: Mapping[str, tuple[int, int]],
    heads: int,
    axis: str | None = None,
    reduce: str = "exact",
) -> dict[str, jax.Array]:
    """One decode step on (a device's slice of) the model; returns every intermediate.

    Args:
        p: the tables; under tensor parallel, this device's slices.
        tok, pos: int32 scalars.
        cache: the int8 KV cache, k/v `[1 1 ctx heads dh]` (this device's heads under tp).
        pairs: requant point -> (M, S), baked into the program.
        heads: the number of heads this device computes.
        axis: the mesh axis to all-reduce partial sums over (None: unsplit).
        reduce: "exact" all-reduces int32 partials then requants (the rule); "requant_first"
            requants each partial first (wrong on purpose: the negative control of the tests).

    Returns:
        name -> array; attention intermediates are [heads ctx] with masked positions zeroed
        (scores/dist/idx/e/p at j > pos are 0). Includes `cache` (the new KVCache), `k_cache`,
        `v_cache` (its rows as [ctx d_local]), `logits`, `next`.
    """
    rq = lambda x, name: requant_jax(x, *pairs[name])
    i32 = lambda a: a.astype(jnp.int32)
    r: dict[str, jax.Array] = {}
    ctx = p.positions.shape[0]
    x0 = jnp.clip(i32(p.embed[tok]) + i32(p.positions[pos]), -128, 127).astype(jnp.int8)
    r["x0"] = x0
    for n, w in (("q", p.wq), ("k", p.wk), ("v", p.wv)):
        r[f"{n}_acc"] = _mv(x0, w)
        r[n] = rq(r[f"{n}_acc"], n)
    dh = r["q"].shape[0] // heads
    cache = _write(cache, pos, r["k"].reshape(heads, dh), r["v"].reshape(heads, dh))
    K, V = cache.k[0, 0], cache.v[0, 0]  # [ctx heads dh]
    q = r["q"].reshape(heads, dh)
    scores = lax.dot_general(q, K, (((1,), (2,)), ((0,), (1,))), preferred_element_type=jnp.int32)
    valid = (jnp.arange(ctx, dtype=jnp.int32) <= pos)[None, :]
    scores = jnp.where(valid, scores, 0)
    mx = jnp.max(jnp.where(valid, scores, jnp.iinfo(jnp.int32).min), axis=1, keepdims=True)
    dist = jnp.where(valid, mx - scores, 0)
    L = p.exp_table.shape[0]
    idx = jnp.where(valid, jnp.minimum(i32(rq(dist, "score")), L - 1), 0)
    e = jnp.where(valid, p.exp_table[idx], 0)
    z = jnp.sum(e, axis=1, keepdims=True)
    pr = (254 * e + z) // (2 * z)
    r.update(scores=scores, dist=dist, idx=idx, e=e, z=z[:, 0], p=pr)
    attn_acc = lax.dot_general(
        pr.astype(jnp.int8), V, (((1,), (0,)), ((0,), (1,))), preferred_element_type=jnp.int32
    )
    r["attn_acc"] = attn_acc.reshape(-1)
    r["attn"] = rq(r["attn_acc"], "attn")

    def project(x, w, name):
        acc = _mv(x, w)
        if axis is None:
            return acc, rq(acc, name)
        if reduce == "exact":
            acc = lax.psum(acc, axis)
            return acc, rq(acc, name)
        # Negative control: requant of each partial, then the sum; not the rule.
        part = rq(acc, name)
        return lax.psum(acc, axis), jnp.clip(lax.psum(i32(part), axis), -128, 127).astype(jnp.int8)

    r["wo_acc"], r["wo"] = project(r["attn"], p.wo, "wo")
    r["res1"] = rq(i32(x0), "res1")
    r["x1"] = jnp.clip(i32(r["res1"]) + i32(r["wo"]), -128, 127).astype(jnp.int8)
    r["w1_acc"] = _mv(r["x1"], p.w1)
    r["h"] = jnp.maximum(rq(r["w1_acc"], "w1"), 0)
    r["w2_acc"], r["w2"] = project(r["h"], p.w2, "w2")
    r["res2"] = rq(i32(r["x1"]), "res2")
    r["x2"] = jnp.clip(i32(r["res2"]) + i32(r["w2"]), -128, 127).astype(jnp.int8)
    r["logits"] = _mv(r["x2"], p.eq.T)
    r["next"] = jnp.argmax(r["logits"]).astype(jnp.int32)
    r["cache"] = cache
    r["k_cache"], r["v_cache"] = K.reshape(ctx, -1), V.reshape(ctx, -1)
    return r


def generate_loop(
    p: Int8Params,
    buf: jax.Array,
    plen: jax.Array,
    steps: jax.Array,
    **body_kw,
) -> tuple[jax.Array, jax.Array, KVCache]:
    """Runs `steps` decode steps from position 0 inside one program (a `lax.fori_loop`).

    Args:
        p: the tables (a device's slices under tp).
        buf: int32 [ctx + 1]; entries 0..plen-1 hold the prompt.
        plen: int32 scalar, the prompt length (>= 1).
        steps: int32 scalar, how many tokens to feed (<= ctx).
        **body_kw: passed to `step_body` (pairs, heads, axis, reduce).

    Returns:
        `(buf, preds, cache)`: buf with the generated tokens at plen..steps; preds int32 [ctx],
        preds[t] the `next` of the step at position t (0 past `steps`); the final cache.
    """
    ctx = p.positions.shape[0]

    def body(t, carry):
        buf, preds, c = carry
        r = step_body(p, buf[t], t, c, **body_kw)
        nxt = r["next"]
        keep = t + 1 < plen
        buf = buf.at[t + 1].set(jnp.where(keep, buf[t + 1], nxt))
        preds = preds.at[t].set(nxt)
        return buf, preds, r["cache"]

    preds = jnp.zeros((ctx,), jnp.int32)
    # The cache starts empty inside the program: nothing to upload per call.
    cache = new_cache(ctx, body_kw["heads"], p.wq.shape[1] // body_kw["heads"])
    if body_kw.get("axis") is not None:  # each device's slice of the cache differs (shard_map)
        cache = jax.tree.map(lambda a: lax.pcast(a, body_kw["axis"], to="varying"), cache)
    return lax.fori_loop(jnp.int32(0), steps, body, (buf, preds, cache))
