"""sm.hoist, sm.bake, sm.export / sm.load_exported, through the public API.

Reference: the same function under plain `jax.jit` (and numpy where the math is simple).
"""

import contextlib
import logging
import os

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
from jax import lax
from jaxtyping import Array, Float

import shapeml as sm
from shapeml.hoisting import (
    ArtifactCorruptError,
    ArtifactMismatchError,
    ExportedInputError,
    ExportError,
    HoistArgumentError,
    HoistInputError,
    MutableWeightsError,
    NotTracedError,
    UnhashableStaticError,
)

D_IN, D, R, C, T_MAX = 12, 8, 2, 5, 16


def make_model(seed: int) -> dict:
    k = jax.random.split(jax.random.key(seed), 5)
    return {
        "q": jax.random.randint(k[0], (D_IN, D), -127, 128).astype(jnp.int8),
        "scale": jax.random.uniform(k[1], (D,), minval=0.01, maxval=0.02),
        "lora_a": jax.random.normal(k[2], (D_IN, R)) * 0.1,
        "lora_b": jax.random.normal(k[3], (R, D)) * 0.1,
        "proj": jax.random.normal(k[4], (C, D)),  # stored (out, in), used transposed
    }


def rope_table(t_max: int, d: int):
    pos = jnp.arange(t_max, dtype=jnp.float32)
    inv = 1.0 / (10000.0 ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    ang = pos[:, None] * inv[None, :]
    return jnp.cos(ang), jnp.sin(ang)


def forward(m, x, key):
    """int8 dequant + LoRA merge, RoPE, dropout with a per-call key, transposed projection."""
    w = m["q"].astype(jnp.float32) * m["scale"][None, :] + m["lora_a"] @ m["lora_b"]
    h = x @ w
    cos, sin = rope_table(T_MAX, D)
    t = x.shape[1]
    cos, sin = cos[:t], sin[:t]
    h1, h2 = h[..., : D // 2], h[..., D // 2 :]
    cos, sin = cos[None], sin[None]
    h = jnp.concatenate([h1 * cos - h2 * sin, h1 * sin + h2 * cos], axis=-1)
    keep = jax.random.bernoulli(key, 0.75, h.shape)
    h = jnp.where(keep, h / 0.75, 0.0)
    return h @ m["proj"].T


def forward_numpy(m, x, keep):
    """The same math in numpy, with the dropout mask given."""
    m = {k: np.asarray(v, np.float64) for k, v in m.items()}
    w = m["q"] * m["scale"] + m["lora_a"] @ m["lora_b"]
    h = np.asarray(x, np.float64) @ w
    t = x.shape[1]
    inv = 1.0 / (10000.0 ** (np.arange(0, D, 2) / D))
    ang = np.arange(t)[:, None] * inv[None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    h1, h2 = h[..., : D // 2], h[..., D // 2 :]
    h = np.concatenate([h1 * cos - h2 * sin, h1 * sin + h2 * cos], axis=-1)
    h = np.where(keep, h / 0.75, 0.0)
    return h @ m["proj"].T


REF = jax.jit(forward)


def inputs(batch=2, t=5, seed=1):
    return jax.random.normal(jax.random.key(seed), (batch, t, D_IN))


@contextlib.contextmanager
def count_compiles(caplog, name="main"):
    """Yields a list that ends up holding one entry per XLA compilation of `jit(name)`."""
    found = []
    with caplog.at_level(logging.WARNING, logger="jax"), jax.log_compiles():
        start = len(caplog.records)
        yield found
        found += [r for r in caplog.records[start:] if f"Compiling jit({name})" in r.getMessage()]


# --- splitting ------------------------------------------------------------------------------


def test_prepare_holds_exactly_the_weight_only_work():
    fast = sm.hoist(forward)
    m, x, key = make_model(0), inputs(), jax.random.key(3)
    fast(m, x, key)
    rep = fast.report()
    # Dequant, LoRA merge, the transpose and the RoPE table run once...
    assert rep.prepare_ops["convert_element_type"] == 1
    assert rep.prepare_ops["dot_general"] == 1
    assert rep.prepare_ops["transpose"] == 1
    assert rep.prepare_ops["cos"] == 1 and rep.prepare_ops["sin"] == 1
    # ...and only the per-input work, dropout included, runs per call.
    assert rep.main_ops["dot_general"] == 2
    assert rep.main_ops["random_bits"] == 1
    for op in ("convert_element_type", "transpose", "cos", "sin", "iota", "pow"):
        assert op not in rep.main_ops
    assert "random_bits" not in rep.prepare_ops
    shapes = sorted(b.shape for b in rep.boundary if b.source == "prepared")
    for shape in [(D_IN, D), (5, D // 2), (5, D // 2), (D, C)]:
        assert shape in shapes
        shapes.remove(shape)
    assert all(int(np.prod(s)) <= 1 for s in shapes)  # only scalar constants besides
    assert rep.weight_bytes == sum(v.nbytes for v in m.values())
    assert rep.prepared_bytes == sum(b.nbytes for b in rep.boundary if b.source == "prepared")
    assert "hoisted" in str(rep) and "per call" in str(rep)


def test_matches_jit_and_numpy():
    fast = sm.hoist(forward)
    m, x = make_model(0), inputs()
    for seed in range(2):
        key = jax.random.key(seed)
        got = fast(m, x, key)
        np.testing.assert_allclose(got, REF(m, x, key), rtol=1e-6, atol=1e-6)
        keep = np.asarray(jax.random.bernoulli(key, 0.75, (2, 5, D)))
        np.testing.assert_allclose(got, forward_numpy(m, x, keep), rtol=1e-4, atol=1e-4)


def test_dropout_stays_per_call():
    fast = sm.hoist(forward)
    m, x = make_model(0), inputs()
    a = fast(m, x, jax.random.key(1))
    b = fast(m, x, jax.random.key(2))
    c = fast(m, x, jax.random.key(1))
    assert not np.allclose(a, b)
    np.testing.assert_array_equal(a, c)
    assert fast.report().prepare_runs == 1


def test_keys_in_the_weights_are_per_call():
    def noisy(m, x):
        return x @ (m["w"] * 2.0) + jax.random.normal(m["key"], (x.shape[0], 3))

    fast = sm.hoist(noisy)
    x = jnp.ones((4, 3))
    for seed in range(2):
        m = {"w": jnp.eye(3), "key": jax.random.key(seed)}
        np.testing.assert_allclose(fast(m, x), jax.jit(noisy)(m, x), rtol=1e-6)
    rep = fast.report()
    assert "random_bits" in rep.main_ops and "random_bits" not in rep.prepare_ops
    assert rep.prepare_ops["mul"] == 1  # w * 2.0; the rest are scalar constants of `normal`
    assert rep.prepared_bytes <= 9 * 4 + 8


def test_legacy_uint32_keys_in_the_weights_are_not_cached():
    def noisy(m, x):
        return x + jax.random.uniform(m["seed"], x.shape)

    fast = sm.hoist(noisy)
    m, x = {"seed": jax.random.PRNGKey(0)}, jnp.zeros(5)
    np.testing.assert_array_equal(fast(m, x), jax.jit(noisy)(m, x))
    rep = fast.report()
    assert rep.prepared_bytes <= 8 and "random_bits" in rep.main_ops
    assert "random_bits" not in rep.prepare_ops and "random_wrap" not in rep.prepare_ops


# --- the cache --------------------------------------------------------------------------------


def test_same_weights_reuse_new_weights_reprepare_without_recompiling(caplog):
    fast = sm.hoist(forward)
    m0, m1, x, key = make_model(0), make_model(1), inputs(), jax.random.key(0)
    fast(m0, x, key)
    with count_compiles(caplog) as compiles:
        y0 = fast(m0, inputs(seed=5), key)
        assert fast.report().prepare_runs == 1
        y1 = fast(m1, inputs(seed=5), key)
        assert fast.report().prepare_runs == 2
        fast(m1, x, key)
        assert fast.report().prepare_runs == 2
        # A new array in one leaf invalidates too.
        m2 = dict(m1, scale=m1["scale"] * 2)
        y2 = fast(m2, inputs(seed=5), key)
        assert fast.report().prepare_runs == 3
    assert compiles == []
    assert fast.report().traces == 1
    ref = REF
    np.testing.assert_allclose(y0, ref(m0, inputs(seed=5), key), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(y1, ref(m1, inputs(seed=5), key), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(y2, ref(m2, inputs(seed=5), key), rtol=1e-6, atol=1e-6)


def test_new_batch_size_retraces_main_but_prepares_once():
    fast = sm.hoist(forward)
    m, key = make_model(0), jax.random.key(0)
    for batch in (1, 3):
        x = inputs(batch=batch)
        np.testing.assert_allclose(fast(m, x, key), REF(m, x, key), rtol=1e-6, atol=1e-6)
    assert fast.report().traces == 2
    assert fast.report().prepare_runs == 1  # same prepare program: prepared once for both


def test_cache_size_keeps_several_models():
    fast = sm.hoist(forward, cache_size=2)
    ms, x, key = [make_model(0), make_model(1)], inputs(), jax.random.key(0)
    for m in ms + ms:
        fast(m, x, key)
    assert fast.report().prepare_runs == 2
    fast.clear()
    fast(ms[0], x, key)
    assert fast.report().prepare_runs == 3


class Mlp(eqx.Module):
    w: jax.Array
    scale: jax.Array
    eps: float
    act: str = eqx.field(static=True)


def mlp(m: Mlp, x):
    h = x @ (m.w.astype(jnp.float32) * m.scale).T
    h = h / (1.0 + m.eps)
    return jnp.tanh(h) if m.act == "tanh" else jax.nn.relu(h)


def test_equinox_module_with_static_fields():
    fast = sm.hoist(mlp)
    w = jax.random.randint(jax.random.key(0), (4, 3), -5, 5).astype(jnp.int8)
    x = jax.random.normal(jax.random.key(1), (2, 3))
    for act in ("tanh", "relu"):
        m = Mlp(w, jnp.full((4, 1), 0.5), 0.25, act)
        np.testing.assert_allclose(fast(m, x), jax.jit(mlp)(m, x), rtol=1e-6)
    assert fast.report().traces == 2  # the static field selects the program
    # A rebuilt module with the same arrays and equal (not identical) statics: no re-prepare.
    runs = fast.report().prepare_runs
    m2 = Mlp(m.w, m.scale, float("0.25"), "relu")
    np.testing.assert_allclose(fast(m2, x), jax.jit(mlp)(m, x), rtol=1e-6)
    assert fast.report().prepare_runs == runs


def test_integer_work_is_bit_exact():
    def int_forward(m, x):
        w = (m["w"].astype(jnp.int32) + m["offset"]).T
        return lax.dot_general(x, w, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32)

    m = {
        "w": jax.random.randint(jax.random.key(0), (6, 5), -128, 128).astype(jnp.int8),
        "offset": jnp.int32(3),
    }
    x = jax.random.randint(jax.random.key(1), (4, 5), -128, 128).astype(jnp.int32)
    got = sm.hoist(int_forward)(m, x)
    want = np.asarray(x, np.int64) @ (np.asarray(m["w"], np.int64) + 3).T
    np.testing.assert_array_equal(np.asarray(got), want)


def test_weight_only_outputs_and_several_weight_arguments():
    def f(x, a, b):
        w = a["w"].T + b["w"]
        return x @ w, w

    fast = sm.hoist(f, weights=(1, 2))
    a, b = {"w": jnp.arange(9.0).reshape(3, 3)}, {"w": jnp.eye(3)}
    x = jnp.ones((2, 3))
    y, w = fast(x, a, b)
    y_ref, w_ref = f(x, a, b)
    np.testing.assert_allclose(y, y_ref)
    np.testing.assert_allclose(w, w_ref)
    assert fast.report().prepare_ops == {"add": 1, "transpose": 1}


def test_max_prepared_bytes_bounds_the_cache():
    def f(m, x):
        big = m["a"].astype(jnp.float32) * m["s"][None, :]  # 4x the int8 bytes
        small = jnp.sum(big, axis=0)
        return x @ big + small[None, :]

    m = {
        "a": jax.random.randint(jax.random.key(0), (64, 64), -9, 9).astype(jnp.int8),
        "s": jnp.full((64,), 0.5),
    }
    x = jnp.ones((2, 64))
    free = sm.hoist(f)
    free(m, x)
    assert free.report().prepared_bytes == 64 * 64 * 4 + 64 * 4
    bounded = sm.hoist(f, max_prepared_bytes=1024)
    np.testing.assert_allclose(bounded(m, x), jax.jit(f)(m, x), rtol=1e-6)
    rep = bounded.report()
    assert rep.prepared_bytes <= 1024 and rep.over_budget >= 1


def test_broadcasts_are_cached_small():
    def f(m, x):
        table = jnp.broadcast_to(m["bias"] * 2.0, (256, 64))  # a big broadcast of a small tensor
        return x + table, jnp.zeros((128, 128))

    m = {"bias": jnp.arange(64.0)}
    x = jnp.ones((256, 64))
    fast = sm.hoist(f)
    y, z = fast(m, x)
    np.testing.assert_allclose(y, x + 2.0 * jnp.arange(64.0)[None, :])
    np.testing.assert_array_equal(z, np.zeros((128, 128)))
    rep = fast.report()
    assert rep.prepared_bytes == 64 * 4
    assert rep.cut_broadcasts >= 2
    uncut = sm.hoist(f, cut_broadcasts=False)
    uncut(m, x)
    assert uncut.report().prepared_bytes == (256 * 64 + 128 * 128) * 4


def test_static_python_leaves_select_the_program():
    def f(m, x, power):
        return (m["w"] * 3.0) ** power + x

    fast = sm.hoist(f)
    m, x = {"w": jnp.arange(3.0)}, jnp.ones(3)
    for p in (1, 2, 1):
        np.testing.assert_allclose(fast(m, x, p), f(m, x, p), rtol=1e-6)
    assert fast.report().traces == 2


# --- transformations and control flow ---------------------------------------------------------


def test_under_outer_jit_weights_are_tracers():
    fast = sm.hoist(forward)
    m, x, key = make_model(0), inputs(), jax.random.key(0)
    np.testing.assert_allclose(jax.jit(fast)(m, x, key), REF(m, x, key), rtol=1e-6, atol=1e-6)
    with pytest.raises(NotTracedError):
        fast.report()  # the call stepped aside: nothing was split or cached


def dense_loss(fn, m, x):
    return jnp.sum(fn(m, x) ** 2)


def test_grad_through_hoisted():
    fast = sm.hoist(dense)
    m, x = make_model(0), jax.random.normal(jax.random.key(1), (3, D_IN))
    floats = {k: v for k, v in m.items() if k != "q"}

    def by_weights(fn):
        return jax.jit(jax.grad(lambda fl: dense_loss(fn, {**fl, "q": m["q"]}, x)))(floats)

    # Weights are tracers: hoisting steps aside, the gradient is f's own.
    g_fast, g_ref = by_weights(fast), by_weights(dense)
    for k in floats:
        np.testing.assert_allclose(g_fast[k], g_ref[k], rtol=1e-5, atol=1e-7)
    # Weights concrete (closed over), inputs traced: main is differentiated.
    gx = jax.jit(jax.grad(lambda x: dense_loss(fast, m, x)))(x)
    gx_ref = jax.grad(lambda x: dense_loss(jax.jit(dense), m, x))(x)
    np.testing.assert_allclose(gx, gx_ref, rtol=1e-5, atol=1e-7)
    assert fast.report().prepare_runs == 1


def test_vmap_and_outer_jit_over_inputs_only():
    fast = sm.hoist(dense)
    m, x = make_model(0), jax.random.normal(jax.random.key(1), (3, D_IN))
    ref = jax.jit(dense)(m, x)
    np.testing.assert_allclose(jax.vmap(lambda xi: fast(m, xi))(x), ref, rtol=1e-6, atol=1e-6)
    # First call under an outer jit: prepare still runs eagerly and nothing traced is cached.
    fresh = sm.hoist(dense)
    np.testing.assert_allclose(jax.jit(lambda x: fresh(m, x))(x), ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(fresh(m, x * 2.0), jax.jit(dense)(m, x * 2.0), rtol=1e-6)
    assert fresh.report().prepare_runs == 1


def control_flow(m, x):
    w = m["q"].astype(jnp.float32) * m["s"][None, :]  # hoisted around the control flow below

    def body(h, layer):
        return jnp.tanh(h @ (layer["q"].astype(jnp.float32) * layer["s"][None, :])), None

    h, _ = lax.scan(body, x @ w, m["stack"])
    h = lax.cond(jnp.sum(x) > 0, lambda h: h @ w.T @ w, lambda h: -h, h)
    h = lax.fori_loop(0, 3, lambda i, h: h * m["s"][None, :] + i, h)
    h = lax.while_loop(
        lambda h: jnp.max(jnp.abs(h)) < 50.0, lambda h: h * 2.0 + w[0][None, :], h + 1.0
    )
    flag = lax.cond(m["s"][0] > 0, lambda: w.sum(), lambda: -w.sum())  # weight-only cond
    return h + flag


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_control_flow_inside_f(sign):
    k = jax.random.split(jax.random.key(0), 3)
    m = {
        "q": jax.random.randint(k[0], (4, 4), -9, 9).astype(jnp.int8),
        "s": jnp.full((4,), 0.1),
        "stack": {
            "q": jax.random.randint(k[1], (3, 4, 4), -9, 9).astype(jnp.int8),
            "s": jnp.full((3, 4), 0.05),
        },
    }
    x = sign * jnp.abs(jax.random.normal(k[2], (2, 4)))
    fast = sm.hoist(control_flow)
    np.testing.assert_allclose(fast(m, x), jax.jit(control_flow)(m, x), rtol=1e-5, atol=1e-6)
    rep = fast.report()
    assert rep.prepare_ops["cond"] == 1 and rep.main_ops["cond"] == 1
    assert rep.main_ops["scan"] == 2 and rep.main_ops["while"] == 1
    # The per-layer dequant inside the scan is hoisted across the loop, stacked.
    assert rep.prepare_ops["scan"] >= 1
    assert (3, 4, 4) in [b.shape for b in rep.boundary if b.source == "prepared"]


def test_jaxpr_views_accept_shapes():
    fast = sm.hoist(forward)
    m = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), make_model(0))
    x = jax.ShapeDtypeStruct((3, 4, D_IN), jnp.float32)
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
    prep, main = fast.prepare_jaxpr(m, x, key), fast.main_jaxpr(m, x, key)
    assert "cos" in str(prep) and "cos" not in str(main)
    assert "random_bits" in str(main) and "random_bits" not in str(prep)
    assert [v.aval.shape for v in main.jaxpr.outvars] == [(3, 4, C)]


# --- bake -------------------------------------------------------------------------------------


def test_bake_equals_jit():
    m = make_model(0)
    serve = sm.bake(forward, m)
    for batch in (1, 2, 1):
        x, key = inputs(batch=batch), jax.random.key(batch)
        np.testing.assert_allclose(serve(x, key), REF(m, x, key), rtol=1e-6, atol=1e-6)
    assert serve.report().prepare_runs == 1
    assert serve.report().prepare_ops["cos"] == 1
    x, key = inputs(), jax.random.key(0)
    np.testing.assert_allclose(jax.jit(serve)(x, key), forward(m, x, key), rtol=1e-5, atol=1e-5)


# --- export -----------------------------------------------------------------------------------


def dense(m, x):
    w = m["q"].astype(jnp.float32) * m["scale"][None, :]
    return jnp.tanh(x @ (w + m["lora_a"] @ m["lora_b"]))


def test_export_round_trip_any_batch(tmp_path):
    m = make_model(0)
    path = tmp_path / "dense.safetensors"
    sm.export(dense, m, (jnp.ones((2, D_IN)),), path)
    loaded = sm.load_exported(path)
    for batch in (1, 7):
        x = jax.random.normal(jax.random.key(batch), (batch, D_IN))
        np.testing.assert_allclose(loaded(x), jax.jit(dense)(m, x), rtol=1e-6, atol=1e-6)


def masked(m, x):
    # the -inf mask depends on the weights only, so it is hoisted into the stored tensors
    mask = jnp.where(m["scale"] > 1.0, -jnp.inf, 0.0)[None, :]
    return jax.nn.softmax(x @ m["q"].astype(jnp.float32) + mask, axis=-1)


def test_export_stores_a_computed_infinity_but_refuses_nonfinite_weights(tmp_path):
    m = make_model(0)
    m = {**m, "scale": m["scale"].at[0].set(2.0)}
    path = tmp_path / "masked.safetensors"
    sm.export(masked, m, (jnp.ones((2, D_IN)),), path)
    x = jax.random.normal(jax.random.key(1), (3, D_IN))
    np.testing.assert_allclose(sm.load_exported(path)(x), masked(m, x), rtol=1e-6, atol=1e-6)
    bad = {**m, "lora_a": m["lora_a"].at[0, 0].set(jnp.nan)}
    with pytest.raises(sm.ShapemlError, match=r"E1307[\s\S]*lora_a"):
        sm.export(masked, bad, (jnp.ones((2, D_IN)),), tmp_path / "bad.safetensors")
    assert not (tmp_path / "bad.safetensors").exists()


def test_export_with_a_key_input(tmp_path):
    m, path = make_model(0), tmp_path / "a.safetensors"
    sm.export(forward, m, (inputs(), jax.random.key(0)), path)
    loaded = sm.load_exported(path)
    for batch in (1, 3):
        x, key = inputs(batch=batch), jax.random.key(batch)
        np.testing.assert_allclose(loaded(x, key), REF(m, x, key), rtol=1e-5, atol=1e-5)


def test_export_int8_matches_numpy_quantization(tmp_path):
    k = jax.random.split(jax.random.key(0), 4)
    d_in, d = 64, 32
    m = {
        "q": jax.random.randint(k[0], (d_in, d), -127, 128).astype(jnp.int8),
        "scale": jax.random.uniform(k[1], (d,), minval=0.001, maxval=0.002),
        "lora_a": jax.random.normal(k[2], (d_in, R)) * 0.1,
        "lora_b": jax.random.normal(k[3], (R, d)) * 0.1,
    }
    path = tmp_path / "q.safetensors"
    sm.export(dense, m, (jnp.ones((2, d_in)),), path, quantize="int8")
    w = np.asarray(m["q"], np.float32) * np.asarray(m["scale"]) + np.asarray(
        m["lora_a"] @ m["lora_b"]
    )
    # The reference: symmetric int8, one scale per output channel (last axis).
    scale = np.abs(w).max(axis=0) / 127.0
    w_q = np.clip(np.round(w / scale), -127, 127) * scale
    x = jax.random.normal(jax.random.key(3), (5, d_in))
    got = sm.load_exported(path)(x)
    np.testing.assert_allclose(got, np.tanh(np.asarray(x) @ w_q), rtol=1e-5, atol=1e-5)
    assert not np.allclose(got, np.tanh(np.asarray(x) @ w), rtol=1e-6, atol=1e-6)
    assert os.path.getsize(path) < d_in * d * 2 + 16384  # int8 storage, not float32


def test_export_rejects_keys_in_weights_and_bad_options(tmp_path):
    m = {"w": jnp.eye(2), "key": jax.random.key(0)}
    with pytest.raises(ExportError, match="PRNG key"):
        sm.export(lambda m, x: x @ m["w"], m, (jnp.ones((1, 2)),), tmp_path / "k")
    with pytest.raises(ExportError, match="quantize"):
        sm.export(dense, make_model(0), (jnp.ones((1, D_IN)),), tmp_path / "q", quantize="int4")


def test_corrupt_artifacts_raise(tmp_path):
    m, path = make_model(0), tmp_path / "dense.safetensors"
    sm.export(dense, m, (jnp.ones((2, D_IN)),), path)
    data = path.read_bytes()

    flipped = tmp_path / "flipped.safetensors"
    flipped.write_bytes(data[:-5] + bytes([data[-5] ^ 0xFF]) + data[-4:])
    with pytest.raises(ArtifactCorruptError, match="checksum"):
        sm.load_exported(flipped)

    # Unreadable and missing files are the file layer's errors, as for every file shapeml reads.
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(sm.ShapemlError, match=r"E1302.*truncated\.safetensors") as e:
        sm.load_exported(truncated)
    assert isinstance(e.value, ValueError) and "sm.export" in str(e.value)

    with pytest.raises(FileNotFoundError, match=r"E1304.*missing\.safetensors"):
        sm.load_exported(tmp_path / "missing.safetensors")

    plain = tmp_path / "plain.safetensors"
    safetensors.numpy.save_file({"w": np.ones(3, np.float32)}, plain)
    with pytest.raises(ArtifactCorruptError, match="not a shapeml export"):
        sm.load_exported(plain)


def read_artifact(path):
    with safetensors.safe_open(str(path), framework="numpy") as fh:
        return fh.metadata(), {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118


def test_mismatched_artifact_raises(tmp_path):
    # Two real exports of different widths; the program of one with the tensors of the other.
    narrow = {
        k: v[..., : D - 1] if k in ("q", "scale", "lora_b") else v for k, v in make_model(0).items()
    }
    sm.export(dense, make_model(0), (jnp.ones((2, D_IN)),), tmp_path / "a.safetensors")
    sm.export(dense, narrow, (jnp.ones((2, D_IN)),), tmp_path / "b.safetensors")
    meta_a, _ = read_artifact(tmp_path / "a.safetensors")
    meta_b, tensors_b = read_artifact(tmp_path / "b.safetensors")
    mixed = dict(meta_b, program=meta_a["program"], program_sha256=meta_a["program_sha256"])
    bad = tmp_path / "mixed.safetensors"
    safetensors.numpy.save_file(tensors_b, bad, metadata=mixed)
    with pytest.raises(ArtifactMismatchError, match="program expects"):
        sm.load_exported(bad)

    # The manifest of one with the tensors (and checksum) of the other.
    mixed = dict(meta_b, manifest=meta_a["manifest"])
    safetensors.numpy.save_file(tensors_b, bad, metadata=mixed)
    with pytest.raises(ArtifactMismatchError, match="manifest says"):
        sm.load_exported(bad)

    # A format version this shapeml does not read.
    safetensors.numpy.save_file(tensors_b, bad, metadata=dict(meta_b, version="999"))
    with pytest.raises(ArtifactMismatchError, match="version"):
        sm.load_exported(bad)

    loaded = sm.load_exported(tmp_path / "a.safetensors")
    with pytest.raises(ExportedInputError, match="takes 1 input"):
        loaded(jnp.ones((2, D_IN)), jnp.ones((2, D_IN)))


# --- errors -----------------------------------------------------------------------------------


def test_errors_name_the_problem():
    fast = sm.hoist(lambda m, x: x @ m["w"])
    with pytest.raises(NotTracedError):
        fast.report()
    with pytest.raises(MutableWeightsError, match=r"\['w'\]"):
        fast({"w": np.eye(2, dtype=np.float32)}, jnp.ones(2))
    with pytest.raises(HoistArgumentError, match="weights"):
        sm.hoist(lambda m, x: x, weights=-1)
    with pytest.raises(HoistArgumentError, match="positional"):
        sm.hoist(lambda x, m: x, weights=1)(jnp.ones(2))
    with pytest.raises(UnhashableStaticError, match=r"E1504.*`set`"):  # a set is a static leaf
        sm.hoist(lambda m, x, s: x @ m["w"])({"w": jnp.eye(2)}, jnp.ones(2), {1, 2})
    assert "E1502" in str(sm.explain("E1502"))


class Dense(sm.Model):
    dims = sm.Dims(I=4, O=3)
    w: Float[Array, "I O"] = sm.param(sm.normal())


def test_a_wrong_input_shape_is_a_coded_error_naming_the_input_and_the_traced_shape():
    traces = []

    def f(m, x, y=None):
        traces.append(x.shape)
        return x @ (m.w * 2.0)

    m, fast = Dense.init(seed=0), sm.hoist(f)
    with pytest.raises(HoistInputError) as info:  # the first call: no earlier shapes to show
        fast(m, jnp.ones((2, 5)))
    err = info.value
    assert err.code == "E1509" and isinstance(err, TypeError) and isinstance(err, ValueError)
    assert "`x`: float32[2,5]" in str(err) and "dims: I=4, O=3" in str(err)
    assert "dot_general requires contracting dimensions" in str(err)
    for batch in (2, 7):  # new batch sizes retrace and run
        np.testing.assert_allclose(fast(m, jnp.ones((batch, 4))), jnp.ones((batch, 4)) @ m.w * 2)
    with pytest.raises(HoistInputError, match=r"`x` is float32\[2,5\], traced for float32\[\*,4\]"):
        fast(m, jnp.ones((2, 5)))
    with pytest.raises(HoistInputError, match="`x`: float32\\[2,3\\]"):  # by keyword
        fast(m, x=jnp.ones((2, 3)))
    # nothing was cached for the refused shapes: the good ones still run, without retracing
    n = len(traces)
    assert fast(m, jnp.ones((2, 4))).shape == (2, 3) and len(traces) == n
    assert fast.report().traces == 2  # (2, 4) and (7, 4); refusals build no program
    assert fast(m, jnp.ones(4)).shape == (3,)  # a new rank that traces is a legitimate call


def test_a_wrong_shape_inside_a_pytree_input_and_under_bake():
    def f(m, batch):
        return batch["x"] @ m.w + batch["bias"]

    m = Dense.init(seed=0)
    fast = sm.hoist(f)
    fast(m, {"x": jnp.ones((2, 4)), "bias": jnp.ones((2, 3))})
    fast(m, {"x": jnp.ones((5, 4)), "bias": jnp.ones((5, 3))})
    with pytest.raises(HoistInputError, match=r"`batch\['bias'\]` is float32\[2,4\]") as info:
        fast(m, {"x": jnp.ones((2, 4)), "bias": jnp.ones((2, 4))})
    assert "traced for float32[*,3]" in str(info.value)
    serve = sm.bake(f, m)
    serve({"x": jnp.ones((2, 4)), "bias": jnp.ones((2, 3))})
    with pytest.raises(HoistInputError, match=r"`batch\['x'\]` is float32\[2,6\]"):
        serve({"x": jnp.ones((2, 6)), "bias": jnp.ones((2, 3))})


def test_the_users_own_errors_and_shaped_errors_pass_through_unchanged():
    class MyError(ValueError):
        pass

    def f(m, x):
        if x.shape[-1] != 4:
            raise MyError("mine")
        return x @ m.w

    m = Dense.init(seed=0)
    with pytest.raises(MyError, match="mine"):
        sm.hoist(f)(m, jnp.ones((2, 5)))

    @sm.shaped
    def g(m: Dense, x: Float[Array, "b I"]) -> Float[Array, "b O"]:
        return x @ m.w

    with pytest.raises(sm.ShapemlError, match=r"E1001.*dimension I is 5"):
        sm.hoist(g)(m, jnp.ones((2, 5)))


# --- compiling through jax.jit's caches ------------------------------------------------------


def test_no_retrace_or_recompile_on_a_second_call(caplog):
    traces = []

    def f(m, x):
        traces.append(x.shape)
        return x @ (m["w"] * 2.0)

    fast = sm.hoist(f)
    m = {"w": jnp.eye(3)}
    with count_compiles(caplog) as compiles:
        for batch in (2, 2, 5, 2, 5):
            np.testing.assert_allclose(fast(m, jnp.ones((batch, 3))), 2.0 * jnp.ones((batch, 3)))
    assert traces == [(2, 3), (5, 3)]  # no re-trace on a second call, one per new shape
    assert len(compiles) == 2  # main compiled once per input shape
    assert fast.report().traces == 2 and fast.report().prepare_runs == 1
    with count_compiles(caplog) as compiles:  # new weights: prepared, nothing traced or compiled
        fast({"w": jnp.eye(3) * 2.0}, jnp.ones((5, 3)))
        fast({"w": jnp.eye(3) * 3.0}, jnp.ones((2, 3)))
    assert compiles == [] and len(traces) == 2 and fast.report().prepare_runs == 3


def test_inputs_needing_other_prepared_tensors_alternate(caplog):
    def f(m, x):  # the weight-only work depends on the input's length: a slice of a table
        return x + jnp.tanh(m["pos"][: x.shape[0]] * 2.0)

    fast = sm.hoist(f)
    m = {"pos": jax.random.normal(jax.random.key(0), (8, 3))}
    xs = [jnp.ones((3, 3)), jnp.ones((5, 3))]
    for x in xs:
        fast(m, x)
    with count_compiles(caplog) as compiles:
        for x in xs * 2:
            np.testing.assert_allclose(fast(m, x), jax.jit(f)(m, x), rtol=1e-6)
    assert compiles == []
    rep = fast.report()
    assert rep.traces == 2 and rep.prepare_runs == 2  # one set of tensors per length
    assert "tanh" in rep.prepare_ops and "tanh" not in rep.main_ops
