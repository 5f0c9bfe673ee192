"""Deep-model options on the zoo models: `TrainStep(remat=...)` and `train(..., precision=,
remat=)` with the `loss` of GPT-2, the transformer and Llama, against the same training without the
option (the reference), a resumed `train` against an uninterrupted one, and `nn.scan` over a dict
of stacked per-layer arrays against a Python loop."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shapeml as sm
from shapeml import nn, optim
from shapeml.data import batches
from shapeml.training import TrainStep, train
from shapeml.zoo import gpt2, llama, transformer

ZOO = {
    "gpt2": (gpt2.loss, lambda: gpt2.GPT2.init(seed=0, V=40, T=32, D=32, H=4, L=3), 40),
    "transformer": (
        transformer.loss,
        lambda: transformer.Transformer.init(seed=0, V=40, T=32, D=32, H=4, F=64, L=3),
        40,
    ),
    "llama": (
        llama.loss,
        lambda: llama.Llama.init(seed=0, V=40, T=32, D=32, H=4, K=2, F=48, L=3),
        40,
    ),
}


def _tokens(vocab, n=16, t=17, seed=0):
    return np.random.default_rng(seed).integers(0, vocab, (n, t)).astype(np.int32)


def _adamw(m):
    return optim.adamw(
        m, lr=optim.warmup(2, optim.cosine(1e-2, 8)), transforms=[optim.clip_norm(1)]
    )


def _close(a, b, tol):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol)


@pytest.mark.parametrize("name", list(ZOO))
def test_train_step_remat_full_matches_no_remat_and_keeps_less(name):
    loss, make, vocab = ZOO[name]
    m = make()
    tokens = jnp.asarray(_tokens(vocab, n=4))
    # SGD: the weights move by the gradients themselves (Adam's first steps are their signs,
    # which float noise flips where a gradient is ~0)
    steps = {
        p: TrainStep(loss, m, optim.sgd(m, lr=0.5), devices=1, remat=p) for p in ("none", "full")
    }
    traj = {p: [float(s(tokens)) for _ in range(4)] for p, s in steps.items()}
    np.testing.assert_allclose(traj["full"], traj["none"], rtol=1e-5)
    _close(steps["full"].model, steps["none"].model, 1e-5)
    temp = {p: s.compiled(tokens).memory_analysis().temp_size_in_bytes for p, s in steps.items()}
    assert temp["full"] < temp["none"], temp  # the blocks really were rematerialized


@pytest.mark.parametrize("name", list(ZOO))
def test_bfloat16_with_remat_follows_the_bfloat16_step_and_float32(name):
    loss, make, vocab = ZOO[name]
    m = make()
    tokens = jnp.asarray(_tokens(vocab, n=4))
    runs = {
        "f32": TrainStep(loss, m, _adamw(m), devices=1),
        "bf16": TrainStep(loss, m, _adamw(m), devices=1, precision="bfloat16"),
        "bf16_remat": TrainStep(loss, m, _adamw(m), devices=1, precision="bfloat16", remat="full"),
    }
    traj = {k: [float(s(tokens)) for _ in range(4)] for k, s in runs.items()}
    # recomputed in other fusions, bfloat16 values may round differently (its half-ulp is 2e-3)
    np.testing.assert_allclose(traj["bf16_remat"], traj["bf16"], rtol=4e-3)
    np.testing.assert_allclose(traj["bf16_remat"], traj["f32"], rtol=2e-2)
    assert traj["bf16_remat"][-1] < traj["bf16_remat"][0]
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(runs["bf16_remat"].model))


@pytest.mark.parametrize("name", list(ZOO))
def test_train_with_precision_and_remat_resumes_like_an_uninterrupted_run(name, tmp_path):
    loss, make, vocab = ZOO[name]
    data = _tokens(vocab)
    options = dict(precision="bfloat16", remat="full", progress=False, devices=1)

    def run(steps, **kw):
        m = make()
        return train(loss, m, _adamw(m), batches(data, batch_size=4), steps=steps, **options, **kw)

    straight = run(8)
    ckpt = tmp_path / "run.safetensors"
    run(4, checkpoint=ckpt)
    resumed = run(8, checkpoint=ckpt, resume=True)
    for a, b in zip(jax.tree.leaves(resumed.model), jax.tree.leaves(straight.model)):
        np.testing.assert_array_equal(a, b)
    assert int(resumed.opt.step) == 8
    # the reference: the same 8 steps through TrainStep with the same options, by hand
    m = make()
    step = TrainStep(loss, m, _adamw(m), devices=1, precision="bfloat16", remat="full")
    for batch in itertools.islice(batches(data, batch_size=4), 8):
        step(*batch)
    _close(straight.model, step.model, 1e-6)


def test_train_refuses_a_bad_precision_or_remat_before_reading_anything(tmp_path):
    loss, make, vocab = ZOO["gpt2"]
    m = make()
    data = batches(_tokens(vocab), batch_size=4)
    ckpt = tmp_path / "missing.safetensors"
    with pytest.raises(sm.ArgumentError) as e:
        train(loss, m, _adamw(m), data, steps=2, remat="everything", checkpoint=ckpt, resume=True)
    assert e.value.code == "E0002" and "'full'" in str(e.value)
    with pytest.raises(sm.ArgumentError) as e:
        train(loss, m, _adamw(m), data, steps=2, precision=16, progress=False)
    assert e.value.code == "E0002" and "bfloat16" in str(e.value)


def test_scan_over_a_dict_of_stacked_arrays_equals_a_loop():
    rng = np.random.default_rng(0)
    layers = {
        "w": jnp.asarray(rng.normal(size=(3, 5, 5)), jnp.float32),
        "b": jnp.asarray(rng.normal(size=(3, 5)), jnp.float32),
    }
    x = jnp.asarray(rng.normal(size=(2, 5)), jnp.float32)

    def body(w, x):
        return jnp.tanh(x @ w["w"] + w["b"][None])

    def loop(layers, x):
        for i in range(3):
            x = body({k: v[i] for k, v in layers.items()}, x)
        return jnp.sum(x**2)

    def scanned(layers, x, remat=None):
        return jnp.sum(nn.scan(body, layers, x, remat=remat) ** 2)

    ref = jax.value_and_grad(loop)(layers, x)
    for remat in (None, "none", "full"):
        _close(jax.value_and_grad(scanned)(layers, x, remat), ref, 1e-5)
    assert [set(d) for d in nn.unstack(layers)] == [{"w", "b"}] * 3
