"""What a port of a PyTorch model needs, each against PyTorch: `LayerNorm(bias=False)`,
`MLP(bias=False)`, the exact and the tanh GELU by name, per-field initializer overrides in a
declaration (GPT-2's `std=0.02` and scaled residual projections), and the cosine schedule with a
floor and the warmup that starts as `LambdaLR((s + 1) / n)` does, step by step."""

from __future__ import annotations

import math
import os

import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float

import shapeml as sm
from shapeml import nn, optim

if os.environ.get("SHAPEML_CI") or os.environ.get("CI"):
    import torch
    import transformers.activations
else:
    torch = pytest.importorskip("torch", reason="torch is not installed: pip install -e '.[hf]'")
    pytest.importorskip("transformers", reason="pip install -e '.[hf]'")
    import transformers.activations

RNG = np.random.default_rng(0)


def _x(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_with_and_without_shift_matches_torch(bias):
    m = nn.LayerNorm.init(seed=0, D=6, bias=bias, eps=1e-5).replace(scale=jnp.asarray(_x(6)))
    ref = torch.nn.LayerNorm(6, eps=1e-5, bias=bias)
    with torch.no_grad():
        ref.weight.copy_(torch.tensor(np.asarray(m.scale)))
        if bias:
            m = m.replace(shift=jnp.asarray(_x(6)))
            ref.bias.copy_(torch.tensor(np.asarray(m.shift)))
    assert (m.shift is None) == (not bias) and m.bias is bias
    assert set(sm.params(m)) == ({"scale", "shift"} if bias else {"scale"})
    x = _x(3, 4, 6) * 2 + 1
    np.testing.assert_allclose(m(jnp.asarray(x)), ref(torch.tensor(x)).detach(), atol=1e-5)


def test_a_parent_declares_a_layernorm_without_shift_and_it_round_trips(tmp_path):
    class Block(sm.Model):
        dims = sm.Dims(D=8)
        ln: nn.LayerNorm = sm.submodel(nn.LayerNorm, bias=False)

    m = Block.init(seed=0)
    assert m.ln.shift is None and set(sm.params(m)) == {"ln.scale"}
    sm.save(tmp_path / "b.safetensors", m)
    assert sm.load(tmp_path / "b.safetensors", Block).ln.shift is None
    with pytest.raises(sm.ShapemlError, match="E1802"):
        nn.LayerNorm.of(bias=1)
    with pytest.raises(sm.ShapemlError, match="E1802"):
        nn.LayerNorm.init(seed=0, bias="no")


@pytest.mark.parametrize(("name", "approximate"), [("gelu", "none"), ("gelu_tanh", "tanh")])
@pytest.mark.parametrize("bias", [True, False])
def test_mlp_bias_and_gelu_by_name_match_torch(name, approximate, bias):
    m = nn.MLP.init(seed=1, D=5, F=12, activation=name, bias=bias)
    assert (m.up.b is None) == (not bias) and (m.down.b is None) == (not bias)
    assert m.up.bias is bias and m.down.bias is bias
    want = {"up.w", "down.w"} | ({"up.b", "down.b"} if bias else set())
    assert set(sm.params(m)) == want
    up, down = torch.nn.Linear(5, 12, bias=bias), torch.nn.Linear(12, 5, bias=bias)
    with torch.no_grad():
        up.weight.copy_(torch.tensor(np.asarray(m.up.w).T))
        down.weight.copy_(torch.tensor(np.asarray(m.down.w).T))
        if bias:
            up.bias.copy_(torch.tensor(np.asarray(m.up.b)))
            down.bias.copy_(torch.tensor(np.asarray(m.down.b)))
    ref = torch.nn.Sequential(up, torch.nn.GELU(approximate=approximate), down)
    x = _x(4, 5) * 3
    np.testing.assert_allclose(m(jnp.asarray(x)), ref(torch.tensor(x)).detach(), atol=2e-6)


def test_the_two_gelus_differ_and_gelu_tanh_is_transformers_gelu_new():
    x = np.linspace(-6, 6, 1001, dtype=np.float32)
    exact = nn.MLP.init(seed=0, D=1, F=1, activation="gelu")
    new = transformers.activations.ACT2FN["gelu_new"](torch.tensor(x)).numpy()
    assert exact.activation == "gelu" and nn.MLP.init(seed=0).activation == "gelu_tanh"
    act = nn._mlp._ACTIVATIONS  # the functions the option names
    np.testing.assert_allclose(act["gelu_tanh"](jnp.asarray(x)), new, atol=1e-6)
    erf = torch.nn.functional.gelu(torch.tensor(x), approximate="none").numpy()
    np.testing.assert_allclose(act["gelu"](jnp.asarray(x)), erf, atol=1e-6)
    assert np.abs(np.asarray(act["gelu"](jnp.asarray(x))) - new).max() > 1e-4


def test_mlp_bias_follows_the_parent_declaration_through_save_and_load(tmp_path):
    class Block(sm.Model):
        dims = sm.Dims(D=8)
        mlp: nn.MLP = sm.submodel(nn.MLP, F="4 * D", bias=False, activation="gelu")

    m = Block.init(seed=0)
    assert set(sm.params(m)) == {"mlp.up.w", "mlp.down.w"}
    sm.save(tmp_path / "b.safetensors", m)
    back = sm.load(tmp_path / "b.safetensors", Block)
    assert back.mlp.up.b is None and back.mlp.activation == "gelu"
    # an MLP given Linears that disagree with its own `bias` is refused
    with pytest.raises(sm.ShapemlError, match="E0902") as e:
        m.mlp.replace(up=nn.Linear.init(seed=0, In=8, Out=32))
    assert "bias: expected False, got True" in str(e.value)


class Block(sm.Model):
    dims = sm.Dims(D=64)
    up: nn.Linear = sm.submodel(nn.Linear, In="D", Out="4 * D", init={"w": sm.normal(std=0.02)})
    proj: nn.Linear = sm.submodel(nn.Linear, In="4 * D", Out="D")
    mlp: nn.MLP = sm.submodel(nn.MLP, F="4 * D")


class Net(sm.Model):
    dims = sm.Dims(D=64, L=2)
    blocks: tuple[Block, ...] = sm.submodels(
        Block, "L", init={"proj.w": sm.normal(std="0.02 / sqrt(2 * L)"), "mlp.up.b": sm.ones}
    )
    head: nn.Linear = sm.submodel(nn.Linear, In="D", Out=3)


class Plain(sm.Model):  # the same fields without overrides
    dims = sm.Dims(D=64, L=2)
    blocks: tuple[Block, ...] = sm.submodels(Block, "L")
    head: nn.Linear = sm.submodel(nn.Linear, In="D", Out=3)


@pytest.mark.parametrize("layers", [2, 6])
def test_init_overrides_draw_gpt2s_statistics_as_torch_does(layers):
    m = Net.init(seed=0, L=layers)
    again = Net.init(seed=0, L=layers)
    plain = Plain.init(seed=0, L=layers)
    # torch: nn.init.normal_(w, std=0.02) and GPT-2's normal_(c_proj, std=0.02 / sqrt(2 * L))
    t = torch.Generator().manual_seed(0)
    ref_up = torch.nn.init.normal_(torch.empty(64, 256), std=0.02, generator=t).numpy()
    ref_proj = torch.nn.init.normal_(
        torch.empty(256, 64), std=0.02 / math.sqrt(2 * layers), generator=t
    ).numpy()
    for blk, blk_plain, blk_again in zip(m.blocks, plain.blocks, again.blocks, strict=True):
        up, proj = np.asarray(blk.up.w), np.asarray(blk.proj.w)
        # 16,384 draws each: the std within 3% of torch's draws, mean near 0
        assert abs(up.std() / ref_up.std() - 1) < 0.03 and abs(up.mean()) < 1e-3
        assert abs(proj.std() / ref_proj.std() - 1) < 0.03 and abs(proj.mean()) < 1e-3
        np.testing.assert_array_equal(blk.mlp.up.b, 1.0)
        # seeded and deterministic: the same seed, the same values
        np.testing.assert_array_equal(up, blk_again.up.w)
        np.testing.assert_array_equal(proj, blk_again.proj.w)
        # the override draws from the field's own key: the declared rule (fan-in, 1 / 16), rescaled
        std = 0.02 / math.sqrt(2 * layers)
        np.testing.assert_allclose(proj / std, blk_plain.proj.w * 16.0, rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(up, blk_plain.up.w)  # Block's own override, in both
        # and changes no other field
        np.testing.assert_array_equal(blk.mlp.down.w, blk_plain.mlp.down.w)
    np.testing.assert_array_equal(m.head.w, plain.head.w)
    assert not np.array_equal(m.blocks[0].proj.w, m.blocks[1].proj.w)


def test_init_overrides_are_checked_at_declaration():
    with pytest.raises(sm.ShapemlError, match="E1802") as e:
        nn.Linear.of(init={"weight": sm.normal(std=0.02)})
    assert "`w`" in str(e.value) or "(w, b)" in str(e.value)
    with pytest.raises(sm.ShapemlError, match="E1802"):
        nn.Linear.of(init={"w": 0.02})
    with pytest.raises(sm.ShapemlError, match="E0905"):
        sm.submodels(Block, "L", init={"mlp.up.weight": sm.zeros})
    with pytest.raises(sm.ShapemlError, match="E0002"):
        sm.normal(std="0.02 / sqrt(")

    class Bad(sm.Model):
        dims = sm.Dims(D=4)
        lin: nn.Linear = sm.submodel(nn.Linear, In="D", init={"w": sm.normal(std="1 / L")})

    with pytest.raises(sm.ShapemlError, match="E0002") as e:
        Bad.init(seed=0)
    assert "`L`" in str(e.value)


def test_a_std_expression_reads_the_declaring_models_dims():
    class Head(sm.Model):
        dims = sm.Dims(D=400)
        w: Float[Array, "D D"] = sm.param(sm.normal(std="1 / sqrt(D)"))

    w = np.asarray(Head.init(seed=0).w)
    assert abs(w.std() * 20 - 1) < 0.01
    assert repr(Head.__shapeml_fields__["w"].init) == "normal(std='1 / sqrt(D)')"


def _torch_lrs(scheduler_of, steps, lr):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=lr)
    sched = scheduler_of(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return np.array(out)


@pytest.mark.parametrize("floor", [0.0, 6e-5])
def test_cosine_with_a_floor_is_cosine_annealing_lr(floor):
    peak, steps = 6e-4, 50
    ref = _torch_lrs(
        lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=steps, eta_min=floor),
        steps + 1,
        peak,
    )
    ours = np.asarray(optim.cosine(peak, steps, floor)(jnp.arange(steps + 1)))
    np.testing.assert_allclose(ours, ref, rtol=2e-6, atol=1e-10)
    # after `steps` it stays at the floor (PyTorch's would rise again)
    np.testing.assert_allclose(optim.cosine(peak, steps, floor=floor)(steps + 7), floor, atol=1e-9)


def test_warmup_from_one_over_n_is_lambda_lr():
    peak, n, decay, floor = 1e-3, 10, 40, 1e-4

    def lam(s):  # the usual recipe: (s + 1) / n, then cosine to a floor
        if s < n:
            return (s + 1) / n
        c = 0.5 * (1 + math.cos(math.pi * min(s - n, decay) / decay))
        return (floor + (peak - floor) * c) / peak

    ref = _torch_lrs(lambda o: torch.optim.lr_scheduler.LambdaLR(o, lam), n + decay + 5, peak)
    sched = optim.warmup(n, optim.cosine(peak, decay, floor=floor), offset=1)
    ours = np.asarray(sched(jnp.arange(n + decay + 5)))
    np.testing.assert_allclose(ours, ref, rtol=2e-6, atol=1e-10)
    assert ours[0] == pytest.approx(peak / n)
    # the default still starts at exactly 0 (optax's linear_schedule)
    assert float(optim.warmup(n, peak)(0)) == 0.0
    # and both survive a checkpoint's description
    assert optim._schedules.from_config(sched.config()) == sched


def test_an_optimizer_trains_with_the_ported_schedule():
    m = nn.Linear.init(seed=0, In=3, Out=2)
    lr = optim.warmup(2, optim.cosine(0.1, 5, floor=0.01), offset=1)
    opt = optim.sgd(m, lr=lr)
    g = sm.grad(lambda m: jnp.sum(m(jnp.ones((1, 3))) ** 2), m)
    m2, opt = optim.update(m, opt, g)
    np.testing.assert_allclose(m2.w, m.w - 0.05 * g.w, rtol=1e-6)


@pytest.mark.parametrize(
    "call",
    [
        lambda: optim.cosine(1e-3, 100, 1e-4, 5),
        lambda: optim.cosine(1e-3, 100, eta_min=1e-4),
        lambda: optim.cosine(1e-3),
        lambda: optim.warmup(10),
        lambda: optim.warmup(10, 1e-3, 1),
        lambda: optim.constant(),
    ],
)
def test_a_bad_schedule_call_is_a_coded_error(call):
    with pytest.raises(sm.ShapemlError, match="E0003") as e:
        call()
    assert "optim." in str(e.value)


def test_bad_schedule_values_are_coded_errors():
    with pytest.raises(sm.ShapemlError, match="E0002"):
        optim.cosine(1e-3, 100, 2e-3)  # a floor above the peak
    with pytest.raises(sm.ShapemlError, match="E0002"):
        optim.cosine(1e-3, 100, -1.0)
    with pytest.raises(sm.ShapemlError, match="E0002"):
        optim.warmup(10, 1e-3, offset=11)
    with pytest.raises(sm.ShapemlError, match="E0003"):
        optim.warmup(10, 1e-3, offset=0.5)
