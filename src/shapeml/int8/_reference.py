"""The integer decode step in plain numpy, one token at a time: the executable form of docs/int8.md.

Every other decode path (the JAX step, `generate`, tensor parallel) is tested bit for bit against
this one, intermediate by intermediate. It uses int64 everywhere and clips explicitly, so no
intermediate can wrap.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ._numerics import requant

__all__ = ["reference_step"]


def reference_step(
    dims: Mapping[str, int],
    pairs: Mapping[str, tuple[int, int]],
    table: np.ndarray,
    t: Mapping[str, np.ndarray],
    tok: int,
    pos: int,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
) -> dict[str, np.ndarray]:
    """One decode step on the host.

    Args:
        dims: the model's dims (d, heads, d_ff, vocab, ctx).
        pairs: requant point -> (M, S).
        table: int32 [L], the exp table.
        t: tensor name -> int8 array (embed [vocab d], positions [ctx d], wq..wo [d d],
            w1 [d d_ff], w2 [d_ff d], eq [vocab d]).
        tok: the token fed at this position, 0 <= tok < vocab (checked by the caller).
        pos: its position, 0 <= pos < ctx (checked by the caller).
        k_cache, v_cache: int8 [ctx d]; rows 0..pos-1 hold the earlier positions' keys/values.
            Not modified.

    Returns:
        Every intermediate by name (docs/int8.md lists them), as int64 arrays, plus the updated
        caches `k_cache`, `v_cache` (copies with row `pos` written). Attention intermediates have
        shape [heads, pos + 1]: masked positions are not part of the computation.
    """
    H = dims["heads"]
    dh = dims["d"] // H
    i64 = lambda a: np.asarray(a, dtype=np.int64)
    L = len(table)
    r: dict[str, np.ndarray] = {}

    def rq(x, name):
        return i64(requant(x, *pairs[name]))

    x0 = np.clip(i64(t["embed"][tok]) + i64(t["positions"][pos]), -128, 127)
    r["x0"] = x0
    for n in ("q", "k", "v"):
        r[f"{n}_acc"] = x0 @ i64(t[f"w{n}"])
        r[n] = rq(r[f"{n}_acc"], n)
    kc = np.array(k_cache, dtype=np.int8, copy=True)
    vc = np.array(v_cache, dtype=np.int8, copy=True)
    kc[pos] = r["k"]
    vc[pos] = r["v"]
    K = i64(kc[: pos + 1]).reshape(pos + 1, H, dh)
    V = i64(vc[: pos + 1]).reshape(pos + 1, H, dh)
    q = r["q"].reshape(H, dh)
    scores = np.einsum("hi,jhi->hj", q, K)
    dist = scores.max(axis=1, keepdims=True) - scores
    idx = np.minimum(rq(dist, "score"), L - 1)
    e = i64(table)[idx]
    z = e.sum(axis=1, keepdims=True)
    p = (254 * e + z) // (2 * z)  # round half up of 127 * e / z (all terms positive)
    r.update(scores=scores, dist=dist, idx=idx, e=e, z=z[:, 0], p=p)
    r["attn_acc"] = np.einsum("hj,jhi->hi", p, V).reshape(-1)
    r["attn"] = rq(r["attn_acc"], "attn")
    r["wo_acc"] = r["attn"] @ i64(t["wo"])
    r["wo"] = rq(r["wo_acc"], "wo")
    r["res1"] = rq(x0, "res1")  # the stream, rescaled to x1's scale
    r["x1"] = np.clip(r["res1"] + r["wo"], -128, 127)
    r["w1_acc"] = r["x1"] @ i64(t["w1"])
    r["h"] = np.maximum(rq(r["w1_acc"], "w1"), 0)
    r["w2_acc"] = r["h"] @ i64(t["w2"])
    r["w2"] = rq(r["w2_acc"], "w2")
    r["res2"] = rq(r["x1"], "res2")
    r["x2"] = np.clip(r["res2"] + r["w2"], -128, 127)
    r["logits"] = i64(t["eq"]) @ r["x2"]
    r["next"] = np.int64(np.argmax(r["logits"]))
    r["k_cache"], r["v_cache"] = kc, vc
    return r
