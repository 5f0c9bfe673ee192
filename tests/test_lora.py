"""LoRA as a declaration: adapters by dotted-name pattern on any model (a Llama, GPT-2), the
gradient, optimizer state and `TrainStep` covering the adapters only, the frozen base bit-identical
after training, a hoisted forward equal to the hand-merged model, adapters saved alone and checked
against the base, and the numbers of `peft` (logits and gradients) for the same weights."""

from __future__ import annotations

import os
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest

import shapeml as sm
from shapeml import lora, optim
from shapeml.training import TrainStep
from shapeml.zoo import gpt2, llama

TARGETS = ["*.attn.q", "*.attn.v", "*.mlp.*"]
V = 64


@pytest.fixture(scope="module")
def base():
    return llama.Llama.init(seed=0, V=V, T=32, D=32, H=4, K=2, F=48, L=2, qkv_bias=True)


@pytest.fixture(scope="module")
def adapted(base):
    return lora.apply(base, TARGETS, rank=4, alpha=8)


def tokens(seed=0, shape=(4, 16)):
    return jnp.asarray(np.random.default_rng(seed).integers(0, V, shape), jnp.int32)


def adapter_names(m) -> set[str]:
    return {f"{name}.{ab}" for name in lora.adapters(m) for ab in ("lora_a", "lora_b")}


def test_apply_puts_adapters_on_the_matching_linears_and_freezes_the_rest(base, adapted):
    assert sorted(lora.adapters(adapted)) == [
        f"layers.{i}.{n}"
        for i in range(2)
        for n in ("attn.q", "attn.v", "mlp.down", "mlp.gate", "mlp.up")
    ]
    assert set(sm.params(adapted)) == adapter_names(adapted)
    assert set(sm.buffers(adapted)) == set(sm.params(base))  # every base weight, frozen
    layer = adapted.layers[0].attn.q
    assert isinstance(layer, sm.nn.Linear) and layer.dims.R == 4 and layer.scale == 2.0
    assert isinstance(adapted, llama.Llama)  # the model's own forward runs unchanged
    # lora_b starts at zero: the adapted model computes what the base does
    x = tokens()
    np.testing.assert_array_equal(llama.forward(adapted, x), llama.forward(base, x))


def test_the_gradient_and_optimizer_state_hold_only_the_adapters(adapted):
    _, g = sm.value_and_grad(llama.loss, adapted, tokens())
    assert set(g.named()) == adapter_names(adapted)
    opt = optim.adamw(adapted, lr=1e-3)
    shapes = sorted(a.shape for a in sm.params(adapted).values())
    moments = sorted(a.shape for a in jax.tree.leaves(opt.state) if a.ndim)
    assert moments == sorted(shapes * 2)  # adam's mu and nu of each adapter, nothing else
    assert sm.count_params(adapted) == sum(int(np.prod(s)) for s in shapes)


def test_training_moves_the_adapters_and_leaves_the_base_bit_identical(base, adapted):
    step = TrainStep(llama.loss, adapted, optim.adamw(adapted, lr=1e-2))
    x = tokens(1)
    losses = [float(step(x)) for _ in range(12)]
    assert losses[-1] < losses[0] - 0.3
    trained = step.model
    for name, a in sm.params(base).items():
        assert np.asarray(sm.buffers(trained)[name]).tobytes() == np.asarray(a).tobytes(), name
    assert any(
        not np.array_equal(trained_a, a)
        for trained_a, a in zip(
            sm.params(trained).values(), sm.params(adapted).values(), strict=True
        )
    )


def trained_like(adapted, seed=2):
    """The adapted model with every adapter random (as after training)."""
    keys = iter(jax.random.split(jax.random.key(seed), 64))
    leaves = {
        k: 0.3 * jax.random.normal(next(keys), v.shape) for k, v in sm.params(adapted).items()
    }
    layers = lora.adapters(adapted)

    def where(m):
        found = lora.adapters(m)
        return [getattr(found[n], ab) for n in layers for ab in ("lora_a", "lora_b")]

    values = [leaves[f"{n}.{ab}"] for n in layers for ab in ("lora_a", "lora_b")]
    return eqx.tree_at(where, adapted, values)


def test_the_hoisted_forward_equals_the_hand_merged_model(adapted):
    m = trained_like(adapted)
    merged = lora.merge(m)
    assert type(merged) is llama.Llama and not lora.adapters(merged)
    assert set(sm.params(merged)) == set(sm.buffers(m))
    x = tokens(3)
    hoisted = sm.hoist(llama.forward)
    want = np.asarray(jax.jit(llama.forward)(merged, x))
    np.testing.assert_allclose(np.asarray(hoisted(m, x)), want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(
        np.asarray(hoisted(m, tokens(4))), jax.jit(llama.forward)(merged, tokens(4)), atol=1e-5
    )
    report = hoisted.report()
    assert report.prepare_runs == 1  # each merged weight computed once for these weights
    # the per-call program is the merged model's: no adapter product left in it
    plain = sm.hoist(llama.forward)
    plain(merged, x)
    assert report.main_ops.get("dot_general") == plain.report().main_ops.get("dot_general")
    assert report.prepare_ops.get("dot_general", 0) >= len(lora.adapters(m))


def test_adapters_are_saved_alone_and_loaded_onto_the_base(base, adapted, tmp_path):
    m = trained_like(adapted)
    path = lora.save(tmp_path / "adapters.safetensors", m)
    assert path.stat().st_size < 40_000
    back = lora.load(path, base)
    x = tokens(5)
    np.testing.assert_array_equal(llama.forward(back, x), llama.forward(m, x))
    assert set(sm.params(back)) == adapter_names(m)


def test_adapters_that_do_not_fit_the_base_get_one_report(adapted, tmp_path):
    path = lora.save(tmp_path / "adapters.safetensors", trained_like(adapted))
    other = llama.Llama.init(seed=0, V=V, T=32, D=48, H=4, K=2, F=48, L=1)
    with pytest.raises(lora.LoRAFileError) as e:
        lora.load(path, other)
    text = str(e.value)
    assert e.value.code == "E2302"
    assert "layers.1.attn.q`: `Llama` has no nn.Linear" in text
    assert "layers.0.attn.q`: the adapter was trained on In=32 Out=32" in text
    sm.save(tmp_path / "model.safetensors", llama.Llama.init(seed=0, V=V, T=32, D=32, H=4, L=1))
    with pytest.raises(lora.LoRAFileError, match="not a LoRA adapters file"):
        lora.load(tmp_path / "model.safetensors", other)


def test_a_pattern_that_matches_no_linear_is_a_coded_error(base, adapted):
    with pytest.raises(lora.LoRATargetError, match="layers.0.attn.q") as e:
        lora.apply(base, ["*.attn.query"])
    assert e.value.code == "E2301"
    plain = lora.apply(base, ["q", "attn.v"])  # plain names match as suffixes, as in peft
    assert sorted(lora.adapters(plain)) == [f"layers.{i}.attn.{p}" for i in range(2) for p in "qv"]
    with pytest.raises(lora.LoRATargetError, match="already hold LoRA adapters"):
        lora.apply(adapted, ["*.attn.q"])
    with pytest.raises(lora.LoRATargetError, match="no LoRA adapters"):
        lora.save("never-written.safetensors", base)
    assert not os.path.exists("never-written.safetensors")


def test_lora_works_on_gpt2_too():
    g = gpt2.GPT2.init(seed=0, V=V, T=32, D=32, H=4, L=2)
    m = lora.apply(g, ["*.attn.c_attn", "*.mlp.up"], rank=2, alpha=4, rslora=True)
    assert m.h[0].attn.c_attn.scale == pytest.approx(4 / np.sqrt(2))
    _, grads = sm.value_and_grad(gpt2.loss, m, tokens())
    assert set(grads.named()) == adapter_names(m) and len(adapter_names(m)) == 8
    step = TrainStep(gpt2.loss, m, optim.sgd(m, lr=0.5))
    before = float(gpt2.loss(m, tokens()))
    for _ in range(5):
        step(tokens())
    assert float(gpt2.loss(step.model, tokens())) < before
    merged = lora.merge(step.model)
    np.testing.assert_allclose(
        gpt2.forward(merged, tokens()), gpt2.forward(step.model, tokens()), atol=1e-5
    )


def test_freeze_holds_every_param_as_a_buffer(base):
    frozen = sm.models.freeze(base)
    assert sm.params(frozen) == {} and set(sm.buffers(frozen)) == set(sm.params(base))
    assert "frozen" in repr(frozen)
    thawed = sm.models.freeze(frozen, False)
    assert set(sm.params(thawed)) == set(sm.params(base))
    np.testing.assert_array_equal(llama.forward(frozen, tokens()), llama.forward(base, tokens()))


def test_the_adapter_gradient_equals_the_unmerged_formula(adapted):
    """The layer's derivative rule (unmerged, as peft) against autodiff of the merged product."""
    m = trained_like(adapted)
    layer = m.layers[0].mlp.up
    x = jax.random.normal(jax.random.key(0), (3, 5, 32))

    def through_rule(a, b):
        return jnp.sum(jnp.sin(layer.replace(lora_a=a, lora_b=b)(x)))

    def by_hand(a, b):
        return jnp.sum(jnp.sin(x @ (layer.w + layer.scale * a @ b)))

    got = jax.grad(through_rule, argnums=(0, 1))(layer.lora_a, layer.lora_b)
    want = jax.grad(by_hand, argnums=(0, 1))(layer.lora_a, layer.lora_b)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    jax.test_util.check_grads(through_rule, (layer.lora_a, layer.lora_b), order=1, modes="rev")


def test_logits_and_gradients_equal_peft(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        initializer_range=0.1,
    )
    hf = transformers.LlamaForCausalLM(config).eval()
    hf.save_pretrained(tmp_path / "base")
    base = llama.from_hf(tmp_path / "base")
    peft_config = peft.LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"]
    )
    with warnings.catch_warnings():  # peft reads a property transformers 5 deprecates
        warnings.simplefilter("ignore", FutureWarning)
        theirs = peft.get_peft_model(hf, peft_config)
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.3)
    ours = lora.apply(base, ["*.attn.q", "*.attn.v", "*.mlp.down"], rank=4, alpha=8)
    names = {
        "attn.q": "self_attn.q_proj",
        "attn.v": "self_attn.v_proj",
        "mlp.down": "mlp.down_proj",
    }
    state = dict(theirs.named_parameters())

    def peft_name(layer: str, ab: str) -> str:
        i, rest = layer.split(".")[1], ".".join(layer.split(".")[2:])
        return f"base_model.model.model.layers.{i}.{names[rest]}.lora_{ab}.default.weight"

    layers = lora.adapters(ours)

    def where(m):
        found = lora.adapters(m)
        return [getattr(found[n], f"lora_{ab}") for n in layers for ab in "ab"]

    values = [
        jnp.asarray(state[peft_name(n, ab.upper())].detach().numpy().T)
        for n in layers
        for ab in "ab"
    ]
    ours = eqx.tree_at(where, ours, values)
    x = np.random.default_rng(0).integers(0, V, (2, 12))
    out = theirs(torch.from_numpy(x), labels=torch.from_numpy(x))
    np.testing.assert_allclose(
        llama.forward(ours, jnp.asarray(x)), out.logits.detach().numpy(), atol=1e-4
    )
    out.loss.backward()
    out.loss = out.loss.detach()
    value, g = sm.value_and_grad(llama.loss, ours, jnp.asarray(x))
    assert float(value) == pytest.approx(out.loss.item(), abs=1e-5)
    named = g.named()
    for n in layers:
        for ab in "ab":
            want = state[peft_name(n, ab.upper())].grad.numpy().T
            np.testing.assert_allclose(named[f"{n}.lora_{ab}"], want, atol=1e-5, err_msg=n)
