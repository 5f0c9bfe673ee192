"""Tensor-parallel decode (tp = 1, 2, 4 over forced host devices) == the unsplit step, bit for bit.

The negative control lives here, not in the library: the tp step is built from public pieces
(`int8.tp_step` with a `project` rule), and the test composes a wrong rule that requantizes each
device's partial sum before the all-reduce.
"""

import textwrap

import pytest
from _forced_devices import result_of

SCRIPT = textwrap.dedent(
    """
    import json
    import warnings
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    import shapeml as sm
    from shapeml import int8
    from shapeml.int8 import Int8Model


    def requant_first(x, w, pair, axis):
        # wrong on purpose: requant of each partial sum, then the sum of the int8 results
        acc = lax.dot_general(x, w, (((0,), (0,)), ((), ())), preferred_element_type=jnp.int32)
        part = int8.requant_jax(acc, pair[0], pair[1]).astype(jnp.int32)
        out = jnp.clip(lax.psum(part, axis), -128, 127).astype(jnp.int8)
        return lax.psum(acc, axis), out


    warnings.simplefilter("error")  # the documented path warns nothing
    out = {}
    for seed, dims in enumerate([dict(d=32, heads=4, d_ff=64, vocab=16, ctx=12),
                                 dict(d=48, heads=8, d_ff=16, vocab=9, ctx=7, table_len=6)]):
        m = Int8Model.random(seed, **dims)
        res = out[str(seed)] = {}
        cache = m.init_cache()
        caches = {tp: m.init_cache() for tp in (1, 2, 4)}
        placed = {tp: m.tp_params(tp) for tp in (1, 2, 4)}
        rng = np.random.default_rng(seed)
        step_ok = {str(tp): True for tp in (1, 2, 4)}
        for pos in range(m.ctx):
            tok = int(rng.integers(m.vocab))
            ref = m.reference_step(tok, pos, *m.cache_rows(cache))
            logits, nxt, cache = m.decode_step(tok, pos, cache)
            assert np.array_equal(np.asarray(logits), ref["logits"])
            for tp in (1, 2, 4):
                # the model placed once (tp_params) or placed on the call: the same integers
                model = placed[tp] if pos % 2 else m
                lg, nx, caches[tp] = model.decode_step(tok, pos, caches[tp], tp=tp)
                step_ok[str(tp)] &= bool(
                    np.array_equal(np.asarray(lg), np.asarray(logits))
                    and int(nx) == int(nxt)
                    and np.array_equal(np.asarray(caches[tp].k), np.asarray(cache.k))
                    and np.array_equal(np.asarray(caches[tp].v), np.asarray(cache.v)))
        res["step"] = step_ok
        prompt = rng.integers(m.vocab, size=3).tolist()
        n = m.ctx - 2
        want = m.generate_arrays(prompt, n)
        res["generate"] = {}
        for tp in (1, 2, 4):
            got = placed[tp].generate_arrays(prompt, n, tp=tp)
            res["generate"][str(tp)] = all(
                np.array_equal(np.asarray(a), np.asarray(b))
                for a, b in zip([got[0], got[1], got[2].k, got[2].v],
                                [want[0], want[1], want[2].k, want[2].v]))
        res["prompt_next"] = m.prompt_next_tokens(prompt, tp=4) == m.prompt_next_tokens(prompt)
        # the pure pieces, composed by hand (the pairs traced, not folded in), are the unsplit step
        mesh = sm.sharding.make_mesh({"tp": 2})
        exact = jax.jit(int8.tp_step(mesh))
        a = exact(placed[2], np.int32(1), np.int32(0), int8.place(m.init_cache(), mesh))
        b = m.decode_step(1, 0, m.init_cache())
        res["pieces"] = all(np.array_equal(np.asarray(x), np.asarray(y))
                            for x, y in zip([a[0], a[1], a[2].k, a[2].v],
                                            [b[0], b[1], b[2].k, b[2].v]))
        # negative control: requant before the all-reduce is not the rule, and the logits show it
        # (greedy tokens may survive the extra rounding, so they are not the control)
        for tp in (2, 4):
            mesh = sm.sharding.make_mesh(f"tp={tp}")
            wrong = jax.jit(int8.tp_step(mesh, project=requant_first))
            c, diff = m.init_cache(), 0
            for pos in range(m.ctx):
                a = placed[tp].decode_step(pos % m.vocab, pos, c, tp=tp)
                b = wrong(placed[tp], np.int32(pos % m.vocab), np.int32(pos), int8.place(c, mesh))
                diff += not np.array_equal(np.asarray(a[0]), np.asarray(b[0]))
                c = a[2]
            res[f"negative_control_{tp}"] = diff
        # the placement is what the manifest says
        man = m.tp_manifest(4)
        tables = sm.buffers(placed[4])
        leaves = dict(tables, k_cache=caches[4].k, v_cache=caches[4].v)
        res["placement"] = set(leaves) == set(man.tensors) and all(
            len(leaves[name].sharding.device_set) == 4
            and (t.split_axis is None) == leaves[name].sharding.is_fully_replicated
            and (t.split_axis is None or all(
                s.data.shape[t.split_axis] == b - a
                for s, (a, b) in zip(sorted(leaves[name].addressable_shards,
                                            key=lambda s: s.device.id), t.slices)))
            for name, t in man.tensors.items())
    print("RESULT" + json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def result():
    return result_of(SCRIPT, 4)


@pytest.mark.parametrize("seed", ["0", "1"])
@pytest.mark.parametrize("tp", ["1", "2", "4"])
def test_tp_step_equals_unsplit(result, seed, tp):
    assert result[seed]["step"][tp] is True


@pytest.mark.parametrize("seed", ["0", "1"])
@pytest.mark.parametrize("tp", ["1", "2", "4"])
def test_tp_generate_equals_unsplit(result, seed, tp):
    assert result[seed]["generate"][tp] is True


@pytest.mark.parametrize("seed", ["0", "1"])
def test_tp_prompt_next_tokens_pieces_and_placement(result, seed):
    assert result[seed]["prompt_next"] is True
    assert result[seed]["pieces"] is True
    assert result[seed]["placement"] is True


@pytest.mark.parametrize("seed", ["0", "1"])
@pytest.mark.parametrize("tp", [2, 4])
def test_requant_before_psum_differs(result, seed, tp):
    # logits differ at most positions of the trace when partials are requantized before the sum
    assert result[seed][f"negative_control_{tp}"] >= 3
