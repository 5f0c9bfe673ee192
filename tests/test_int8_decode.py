"""The JAX decode step, `generate` and `prompt_next_tokens` against the numpy reference, bit for bit;
the pure functions under the methods; no recompile on a second call."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from shapeml import int8
from shapeml.int8 import Int8Model
from shapeml.state import KVCache

CONFIGS = {
    "base": dict(d=32, heads=4, d_ff=64, vocab=16, ctx=16, table_len=64),
    "odd": dict(d=24, heads=3, d_ff=40, vocab=11, ctx=9, table_len=128),
    "one-head-one-entry": dict(d=16, heads=1, d_ff=8, vocab=5, ctx=6, table_len=1),
    "short-table": dict(d=16, heads=8, d_ff=16, vocab=7, ctx=12, table_len=5),
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def model(request):
    return Int8Model.random(seed=list(CONFIGS).index(request.param), **CONFIGS[request.param])


def _zeros(m):
    return np.zeros((m.ctx, m.d), np.int8), np.zeros((m.ctx, m.d), np.int8)


def test_every_intermediate_matches_reference(model):
    rng = np.random.default_rng(0)
    kc, vc = _zeros(model)
    cache = model.init_cache()
    seen_idx = set()
    for pos in range(model.ctx):
        tok = int(rng.integers(model.vocab))
        ref = model.reference_step(tok, pos, kc, vc)
        cache_before = cache
        got = model.step_intermediates(tok, pos, cache)
        assert set(got) == set(ref)
        for name in ref:
            np.testing.assert_array_equal(got[name], ref[name], err_msg=f"{name} at pos {pos}")
        kc, vc = ref["k_cache"], ref["v_cache"]
        cache = model.cache_from_rows(got["k_cache"], got["v_cache"])
        seen_idx |= set(ref["idx"].ravel().tolist())
        logits, nxt, cache2 = model.decode_step(tok, pos, cache_before)
        np.testing.assert_array_equal(np.asarray(logits), ref["logits"])
        assert int(nxt) == int(ref["next"])
        assert isinstance(cache2, KVCache)
        np.testing.assert_array_equal(model.cache_rows(cache2)[0], kc)
        np.testing.assert_array_equal(model.cache_rows(cache2)[1], vc)
    # the random model exercises the table, not only its first entry
    L = len(model.exp_table)
    assert len(seen_idx) >= min(4, L)
    if L <= 5:  # distances beyond the table are clipped to its last entry
        assert L - 1 in seen_idx


def test_generate_equals_stepping_the_reference(model):
    rng = np.random.default_rng(1)
    for plen in (1, 3, model.ctx):
        prompt = rng.integers(model.vocab, size=plen).tolist()
        n = model.ctx + 1 - plen
        gen_ref, preds_ref = model.reference_generate(prompt, n)
        assert model.generate(prompt, n) == gen_ref
        assert model.prompt_next_tokens(prompt) == preds_ref[:plen]
        buf, preds, cache = model.generate_arrays(prompt, n)
        assert np.asarray(preds)[: len(preds_ref)].tolist() == preds_ref


def test_decode_step_loop_equals_generate():
    m = Int8Model.random(7, **CONFIGS["base"])
    prompt, n = [3, 1, 4, 1, 5], 6
    cache, seq = m.init_cache(), list(prompt)
    for pos in range(len(prompt) + n - 1):
        _, nxt, cache = m.decode_step(seq[pos], pos, cache)
        if pos + 1 >= len(prompt):
            seq.append(int(nxt))
    assert seq[len(prompt) :] == m.generate(prompt, n)
    _, _, gcache = m.generate_arrays(prompt, n)
    np.testing.assert_array_equal(np.asarray(gcache.k), np.asarray(cache.k))
    np.testing.assert_array_equal(np.asarray(gcache.v), np.asarray(cache.v))
    # the cache holds what the reference writes, position by position
    kc, vc = _zeros(m)
    for pos in range(len(prompt) + n - 1):
        r = m.reference_step(seq[pos], pos, kc, vc)
        kc, vc = r["k_cache"], r["v_cache"]
    np.testing.assert_array_equal(m.cache_rows(gcache)[0], kc)
    np.testing.assert_array_equal(m.cache_rows(gcache)[1], vc)


def test_generate_compiles_once_for_any_prompt(caplog):
    m = Int8Model.random(8, **CONFIGS["base"])
    m.generate([1, 2], 3)
    m.decode_step(1, 0, m.init_cache())
    with caplog.at_level(logging.WARNING), jax.log_compiles(True):
        m.generate([5, 6, 7, 8], 9)
        m.generate([1], 1)
        m.prompt_next_tokens([2, 3, 4])
        m.decode_step(3, 5, m.init_cache())
        # another model of the same shapes, dims and statics shares the programs
        Int8Model.from_json(m.to_dict()).generate([2], 4)
    assert not [r for r in caplog.records if "Compiling" in r.getMessage()]


def test_pure_functions_are_the_methods():
    m = Int8Model.random(9, **CONFIGS["odd"])
    kc, vc = _zeros(m)
    cache = m.init_cache()
    step = jax.jit(int8.step)
    for pos, tok in enumerate([1, 4, 2, 7]):
        # the pure numpy step vs the compiled JAX step, on every intermediate
        ref = int8.reference_step(m, tok, pos, kc, vc)
        got = m.step_intermediates(tok, pos, cache)
        assert set(ref) == set(got)
        for k in ref:
            np.testing.assert_array_equal(got[k], ref[k], err_msg=f"{k} at pos {pos}")
        # the pure JAX step under a user's jit (the pairs traced, not folded in): the same
        r = step(m, jnp.int32(tok), jnp.int32(pos), cache)
        np.testing.assert_array_equal(np.asarray(r["logits"]), ref["logits"])
        np.testing.assert_array_equal(np.asarray(r["k_cache"]), ref["k_cache"])
        kc, vc, cache = ref["k_cache"], ref["v_cache"], r["cache"]
    assert int8.reference_generate(m, [1, 2], 5) == m.reference_generate([1, 2], 5)
    buf = np.zeros(m.ctx + 1, np.int32)
    buf[:2] = [1, 2]
    out, preds, _ = jax.jit(int8.generate_loop)(m, buf, jnp.int32(2), jnp.int32(6))
    assert np.asarray(out)[2:7].tolist() == m.generate([1, 2], 5)


def test_the_pure_reference_checks_its_inputs():
    m = Int8Model.random(9, **CONFIGS["base"])
    kc, vc = _zeros(m)
    with pytest.raises(int8.Int8PositionError, match="pos = -1"):
        int8.reference_step(m, 0, -1, kc, vc)  # would read the last row
    with pytest.raises(int8.Int8TokenError, match="16"):
        int8.reference_step(m, 16, 0, kc, vc)
    with pytest.raises(int8.Int8PositionError, match="k_cache"):
        int8.reference_step(m, 0, 0, kc[:3], vc)
    with pytest.raises(int8.Int8PromptError, match="ctx = 16"):
        int8.reference_generate(m, list(range(10)), 10)
    with pytest.raises(int8.Int8PromptError, match="empty"):
        int8.reference_generate(m, [], 1)


def test_new_meta_shares_the_compiled_programs(caplog):
    # the statics (tokens, meta_json) are no part of the compile key: the decode never reads them
    m = Int8Model.random(11, **CONFIGS["base"])
    want = m.generate([1, 2], 3)
    m.decode_step(1, 0, m.init_cache())
    other = m.replace(meta_json='{"note": "re-exported"}', tokens=tuple(f"w{i}" for i in range(16)))
    with caplog.at_level(logging.WARNING), jax.log_compiles(True):
        assert other.generate([1, 2], 3) == want
        other.decode_step(1, 0, other.init_cache())
    assert not [r for r in caplog.records if "Compiling" in r.getMessage()]


def test_the_pure_step_checks_tokens_and_positions_under_a_users_jit():
    # without the host checks of the methods, the program's own checks fail it (no clamping)
    m = Int8Model.random(9, **CONFIGS["base"])
    step = jax.jit(int8.step)
    with pytest.raises(Exception, match="E1401"):
        jax.block_until_ready(step(m, jnp.int32(1), jnp.int32(m.ctx), m.init_cache()))
    with pytest.raises(Exception, match="E1608"):
        jax.block_until_ready(step(m, jnp.int32(m.vocab), jnp.int32(0), m.init_cache()))


def test_tokenizer():
    chars = int8.Tokenizer(("a", "b", ">"))
    assert chars.encode("ba>") == [1, 0, 2] and chars.decode([0, 1]) == "ab"
    words = int8.Tokenizer(("t0", "t1"))
    assert words.encode("t1 t0") == [1, 0] and words.decode([0, 1]) == "t0 t1"
    with pytest.raises(int8.Int8TokenError, match="'c'"):
        chars.encode("abc")
    m = Int8Model.random(0, **CONFIGS["base"])
    assert m.tokenizer == int8.Tokenizer(m.tokens) and len(m.tokenizer) == m.vocab


def test_softmax_properties():
    m = Int8Model.random(3, **CONFIGS["base"])
    kc, vc = _zeros(m)
    table = m.exp_table
    for pos in range(m.ctx):
        r = m.reference_step(pos % m.vocab, pos, kc, vc)
        kc, vc = r["k_cache"], r["v_cache"]
        # the row maximum maps to table[0]; every weight is a table entry; p sums to ~127
        mx = r["scores"] == r["scores"].max(axis=1, keepdims=True)
        assert np.all(r["idx"][mx] == 0) and np.all(r["e"][mx] == table[0])
        assert np.all(np.isin(r["e"], table))
        assert np.all((r["p"] >= 0) & (r["p"] <= 127))
        assert np.all(np.abs(r["p"].sum(axis=1) - 127) <= (pos + 1) // 2 + 1)
        if pos == 0:
            assert r["p"].tolist() == [[127]] * m.heads
    # masked positions (rows > pos) contribute nothing: garbage there changes no output
    rng = np.random.default_rng(0)
    for pos in (0, 5, m.ctx - 1):
        kc2, vc2 = kc.copy(), vc.copy()
        kc2[pos + 1 :] = rng.integers(-128, 128, size=kc2[pos + 1 :].shape)
        vc2[pos + 1 :] = rng.integers(-128, 128, size=vc2[pos + 1 :].shape)
        a = m.reference_step(1, pos, kc, vc)
        b = m.reference_step(1, pos, kc2, vc2)
        c = m.step_intermediates(1, pos, m.cache_from_rows(kc2, vc2))
        for name in ("p", "attn", "logits", "next"):
            np.testing.assert_array_equal(a[name], b[name])
            np.testing.assert_array_equal(c[name], a[name])


def test_bad_tokens_positions_and_prompts():
    m = Int8Model.random(4, **CONFIGS["base"])
    cache = m.init_cache()
    with pytest.raises(int8.Int8TokenError, match="16"):
        m.decode_step(16, 0, cache)
    with pytest.raises(int8.Int8TokenError):
        m.decode_step(-1, 0, cache)
    with pytest.raises(int8.Int8PositionError, match="pos = 16"):
        m.decode_step(1, 16, cache)
    with pytest.raises(int8.Int8PositionError, match="pos = -1"):
        m.reference_step(1, -1, *_zeros(m))
    with pytest.raises(int8.Int8PositionError, match="int8"):
        m.decode_step(1, 0, KVCache(1, 16, 4, 8, np.float32))
    with pytest.raises(int8.Int8TokenError, match=r"prompt\[1\]` = 99"):
        m.generate([1, 99], 2)
    with pytest.raises(int8.Int8PromptError, match="ctx = 16"):
        m.generate(list(range(16)), 2)
    with pytest.raises(int8.Int8PromptError, match="ctx = 16"):
        m.prompt_next_tokens([0] * 17)
    with pytest.raises(int8.Int8PromptError, match="empty"):
        m.generate([], 2)
    assert len(m.generate(list(range(16)), 1)) == 1  # 16 fed tokens fit ctx = 16
    with pytest.raises(int8.Int8TokenError, match="'x'"):
        m.encode("t1 x")
    assert m.decode(m.encode("t1 t3")) == "t1 t3"


def test_tp_errors_in_a_single_device_process():
    m = Int8Model.random(5, **CONFIGS["base"])  # heads=4, d_ff=64
    with pytest.raises(int8.Int8TensorParallelError, match="heads=4"):
        m.decode_step(0, 0, m.init_cache(), tp=3)
    with pytest.raises(int8.Int8TensorParallelError, match="heads=4"):
        m.tp_manifest(8)
    with pytest.raises(int8.Int8TensorParallelError, match="needs 2 devices"):
        m.generate([1], 2, tp=2)
    assert m.generate([1, 2], 4, tp=1) == m.generate([1, 2], 4)


def test_manifest_covers_every_tensor():
    m = Int8Model.random(5, **CONFIGS["base"])
    man = m.tp_manifest(4)
    assert man.heads_per_device == 1 and man.d_ff_per_device == 16
    # every field of the model (the one table of its tensors), then the cache
    assert list(man.tensors) == [*Int8Model.__shapeml_fields__, "k_cache", "v_cache"]
    for t in man.tensors.values():
        if t.split_axis is None:
            assert t.slices == ()
        else:
            ends = [b for _, b in t.slices]
            assert t.slices[0][0] == 0 and ends[-1] == t.shape[t.split_axis]
            assert all(a == b for (_, b), (a, _) in zip(t.slices, t.slices[1:]))
    assert man.tensors["wo"].split_axis == 0 and man.tensors["wq"].split_axis == 1
    assert man.tensors["requant_pairs"].split_axis is None
    assert man.all_reduce == ("psum(wo_acc) then requant wo", "psum(w2_acc) then requant w2")
    assert "psum(w2_acc) then requant w2" in str(man)
