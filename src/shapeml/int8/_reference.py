"""The integer decode step in plain numpy, one token at a time: the executable form of docs/int8.md.

Every other decode path (the JAX step, `generate`, tensor parallel) is tested bit for bit against
this one, intermediate by intermediate. It uses int64 everywhere and clips explicitly, so no
intermediate can wrap.
"""

from __future__ import annotations

import jax
import numpy as np

from .._traceback import api_boundary
from ._checks import check_pos, check_prompt, check_rows, check_token
from ._numerics import requant
from ._tokenizer import IntLike, TokenIds

__all__ = ["reference_generate", "reference_step"]


@api_boundary
def reference_step(
    m, tok: IntLike, pos: IntLike, k_cache: np.ndarray, v_cache: np.ndarray
) -> dict[str, np.ndarray]:
    """One decode step on the host.

    Args:
        m: the model (`Int8Model`; its tables on the host or on a device).
        tok: the token fed at this position, 0 <= tok < V.
        pos: its position, 0 <= pos < T.
        k_cache, v_cache: int8 [T D]; rows 0..pos-1 hold the earlier positions' keys/values.
            Not modified.

    Returns:
        Every intermediate by name (docs/int8.md lists them), as int64 arrays, plus the updated
        caches `k_cache`, `v_cache` (copies with row `pos` written). Attention intermediates have
        shape [heads, pos + 1]: masked positions are not part of the computation.

    Raises:
        Int8TokenError (E1608), Int8PositionError (E1610): a token or position out of range, or
        caches that are not int8 [T D].
    """
    dims = m.dims
    tok, pos = check_token(dims, tok, "tok"), check_pos(dims, pos)
    check_rows(dims, k_cache, "k_cache")
    check_rows(dims, v_cache, "v_cache")
    return _step(m, tok, pos, k_cache, v_cache)


def _step(m, tok: int, pos: int, k_cache: np.ndarray, v_cache: np.ndarray):
    """`reference_step` without the checks (`reference_generate` checked its whole trace)."""
    H, dh = m.dims.H, m.dims.Dh
    i64 = lambda a: np.asarray(a, dtype=np.int64)
    table = np.asarray(m.exp_table)
    L = len(table)
    pairs = m.requant
    r: dict[str, np.ndarray] = {}

    def rq(x, name):
        return i64(requant(x, *pairs[name]))

    x0 = np.clip(i64(np.asarray(m.embed)[tok]) + i64(np.asarray(m.positions)[pos]), -128, 127)
    r["x0"] = x0
    for n in ("q", "k", "v"):
        r[f"{n}_acc"] = x0 @ i64(getattr(m, f"w{n}"))
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
    r["wo_acc"] = r["attn"] @ i64(m.wo)
    r["wo"] = rq(r["wo_acc"], "wo")
    r["res1"] = rq(x0, "res1")  # the stream, rescaled to x1's scale
    r["x1"] = np.clip(r["res1"] + r["wo"], -128, 127)
    r["w1_acc"] = r["x1"] @ i64(m.w1)
    r["h"] = np.maximum(rq(r["w1_acc"], "w1"), 0)
    r["w2_acc"] = r["h"] @ i64(m.w2)
    r["w2"] = rq(r["w2_acc"], "w2")
    r["res2"] = rq(r["x1"], "res2")
    r["x2"] = np.clip(r["res2"] + r["w2"], -128, 127)
    r["logits"] = i64(m.eq) @ r["x2"]
    r["next"] = np.int64(np.argmax(r["logits"]))
    r["k_cache"], r["v_cache"] = kc, vc
    return r


@api_boundary
def reference_generate(m, prompt: TokenIds, n: IntLike) -> tuple[list[int], list[int]]:
    """Greedy decoding with the reference, one step per fed token.

    Args:
        m: the model.
        prompt: token ids, 1 <= len(prompt), len(prompt) + n - 1 <= T.
        n: how many tokens to generate.

    Returns:
        `(generated, preds)`: the n generated ids, and the `next` of every fed position.

    Raises:
        Int8TokenError (E1608), Int8PromptError (E1609).
    """
    prompt = check_prompt(m.dims, prompt, n)
    m = jax.device_get(m)  # one copy of the tables to the host, not one per step
    kc = np.zeros((m.dims.T, m.dims.D), np.int8)
    vc = np.zeros_like(kc)
    seq, preds = list(prompt), []
    for t in range(len(prompt) + n - 1):
        r = _step(m, seq[t], t, kc, vc)
        kc, vc = r["k_cache"], r["v_cache"]
        preds.append(int(r["next"]))
        if t + 1 >= len(prompt):
            seq.append(int(r["next"]))
    return seq[len(prompt) :], preds
