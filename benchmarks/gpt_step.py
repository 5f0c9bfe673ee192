"""The char-level GPT's training step (AdamW + clipping, warmup + cosine): shapeml vs raw JAX.

Contenders, measured in one run, in interleaved rounds, median per step, at 2 blocks of width 128
with batch x context 8x64, 32x64 and 8x128, at 4 blocks of width 256 with 16x128 and at 6 blocks
of width 384 with 8x128:
  shapeml  `shapeml.training.TrainStep` over `examples/char_gpt.py`'s `loss` and model (as the
           example runs it: blocks as a tuple, every CPU core a device by `sm.use_cpu_devices()`,
           called first), `nn` layers (Embedding,
           LayerNorm, causal rotary MultiHeadAttention, MLP) and
           `optim.adamw(..., transforms=[optim.clip_norm(1.0)])`;
  jax      the same math on a raw dict of arrays, as idiomatic JAX writes it: `jax.jit` + optax
           (`clip_by_global_norm`, `adamw` with a `join_schedules` warmup + cosine and the same
           no-decay mask), params and optimizer state donated, one device;
  torch    PyTorch eager and `torch.compile`, when `import torch` works (otherwise the script says
           so and measures the JAX ratio alone), at PyTorch's own default threading (no thread
           count or `OMP_WAIT_POLICY` is set); `gpt_step_vs_torch` is against the faster.
Before timing, the contenders train a few steps from the same weights on the same batches and their
loss trajectories must agree, so the race is between the same computations.
The last line is `gpt_step_vs_torch: ratio=X (budget 1.0)`, the worst size.

With `--scan` it races the same shapeml step with the blocks stored stacked and run by one
`lax.scan` (`GPT.init(scan=True)`, `nn.scan`'s default policy) against the blocks as a tuple run by
a Python loop, at 4 blocks (width 256, 16x128) and 6 blocks (width 384, 8x128), and prints last
`gpt_scan_vs_loop: ratio=X (budget 1.15)`, the worse of the two.
See docs/performance.md. Run: python benchmarks/gpt_step.py [--quick] [--scan]
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

import shapeml as sm
from shapeml import optim
from shapeml.training import TrainStep

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT / "examples"))
from _timing import interleaved  # noqa: E402
from char_gpt import GPT, loss  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the PyTorch contenders are optional
    torch = None

# (model dims, batch, context): the small GPT at three sizes, and a larger one
SMALL = dict(V=96, D=128, H=4, L=2)
LARGE = dict(V=96, D=256, H=4, L=4)
XL = dict(V=96, D=384, H=6, L=6)
SIZES = ((SMALL, 8, 64), (SMALL, 32, 64), (SMALL, 8, 128), (LARGE, 16, 128), (XL, 8, 128))
DEEP = ((LARGE, 16, 128), (XL, 8, 128))  # the sizes of the --scan race
DIMS = SMALL
LR, WARMUP, COSINE, CLIP, WD = 3e-3, 10, 1000, 1.0, 0.1


# -- shapeml --------------------------------------------------------------------------------
def shapeml_step(m: GPT, lr=LR, warmup=WARMUP, cosine=COSINE, **options) -> TrainStep:
    schedule = optim.warmup(warmup, optim.cosine(lr, cosine))
    opt = optim.adamw(
        m, lr=schedule, weight_decay=WD, transforms=[optim.clip_norm(CLIP)], skip_nonfinite=False
    )
    return TrainStep(loss, m, opt, **options)


# -- raw JAX + optax --------------------------------------------------------------------------
def _ln(p, name, x, eps=1e-5):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
    y = (x - mu) * jnp.reciprocal(jnp.sqrt(var + eps))
    return y * p[name + ".scale"][None, None] + p[name + ".shift"][None, None]


def _rope(x):
    """`x [b t h k]` at positions 0..t-1, pairs (i, i + k/2) rotated by pos * 1e4 ** (-2i/k)."""
    t, k = x.shape[1], x.shape[-1]
    half = k // 2
    angle = (
        jnp.arange(t, dtype=jnp.float32)[:, None]
        * (10_000.0 ** (-jnp.arange(half, dtype=jnp.float32) * 2.0 / k))[None, :]
    )
    cos, sin = jnp.cos(angle)[None, :, None, :], jnp.sin(angle)[None, :, None, :]
    a, b = x[..., :half], x[..., half:]
    return jnp.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def raw_loss(p: dict, tokens, heads: int, layers: int):
    """char_gpt.loss written on a dict of arrays keyed by the same dotted names."""
    inp, target = tokens[:, :-1], tokens[:, 1:]
    b, t = inp.shape
    x = jnp.take(p["emb.w"], inp, axis=0, mode="fill", fill_value=jnp.nan)
    d = x.shape[-1]
    k = d // heads
    causal = jnp.tril(jnp.ones((t, t), bool))
    for i in range(layers):
        pre = f"blocks.{i}."
        h = _ln(p, pre + "ln1", x)
        q = _rope((h @ p[pre + "attn.q.w"]).reshape(b, t, heads, k))
        kk = _rope((h @ p[pre + "attn.k.w"]).reshape(b, t, heads, k))
        v = (h @ p[pre + "attn.v.w"]).reshape(b, t, heads, k)
        s = jnp.einsum("bnhk,bshk->bhns", q, kk) / math.sqrt(k)
        s = jnp.where(causal[None, None], s, jnp.finfo(s.dtype).min)
        a = jnp.einsum("bhns,bshk->bnhk", jax.nn.softmax(s, axis=-1), v).reshape(b, t, d)
        x = x + a @ p[pre + "attn.o.w"]
        h = _ln(p, pre + "ln2", x) @ p[pre + "mlp.up.w"] + p[pre + "mlp.up.b"][None, None]
        h = jax.nn.gelu(h, approximate=True) @ p[pre + "mlp.down.w"]
        x = x + h + p[pre + "mlp.down.b"][None, None]
    logits = _ln(p, "ln_f", x) @ p["emb.w"].T
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, target[:, :, None], axis=-1))


class RawStep:
    """A hand-written `jax.jit` step on a raw dict, params and optimizer state donated."""

    def __init__(self, m: GPT, lr=LR, warmup=WARMUP, cosine=COSINE):
        schedule = optax.join_schedules(
            [optax.linear_schedule(0.0, lr, warmup), optax.cosine_decay_schedule(lr, cosine)],
            [warmup],
        )
        self.params = {k: jnp.array(v) for k, v in sm.params(m).items()}
        # No decay on norm scales and shifts or biases: what their `decay=False` declares.
        mask = {k: not k.endswith((".b", ".scale", ".shift")) for k in self.params}
        self.tx = optax.chain(
            optax.clip_by_global_norm(CLIP), optax.adamw(schedule, weight_decay=WD, mask=mask)
        )
        self.state = self.tx.init(self.params)
        heads, layers = m.dims.H, m.dims.L

        def step(params, state, tokens):
            value, g = jax.value_and_grad(raw_loss)(params, tokens, heads, layers)
            updates, state = self.tx.update(g, state, params)
            return optax.apply_updates(params, updates), state, value

        self._step = jax.jit(step, donate_argnums=(0, 1))

    def __call__(self, tokens):
        self.params, self.state, value = self._step(self.params, self.state, tokens)
        return value


# -- PyTorch eager and torch.compile ------------------------------------------------------------
class TorchStep:
    """The same step in PyTorch: `F.layer_norm`, the same rotary layout, tanh-GELU, a tied head,
    `torch.optim.AdamW` with the same no-decay group, `clip_grad_norm_`, `LambdaLR`."""

    def __init__(self, m: GPT, lr=LR, warmup=WARMUP, cosine=COSINE, compiled=False):
        self.p = {k: torch.tensor(np.array(v), requires_grad=True) for k, v in sm.params(m).items()}
        no_decay = [v for k, v in self.p.items() if k.endswith((".b", ".scale", ".shift"))]
        decay = [v for k, v in self.p.items() if not k.endswith((".b", ".scale", ".shift"))]
        groups = [{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}]
        self.opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8)

        def factor(t):
            if t < warmup:
                return t / warmup
            return 0.5 * (1 + math.cos(math.pi * min(t - warmup, cosine) / cosine))

        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, factor)
        self.heads, self.layers = m.dims.H, m.dims.L
        self.loss = torch.compile(self._loss) if compiled else self._loss

    @staticmethod
    def _rope(x):
        t, k = x.shape[1], x.shape[-1]
        half = k // 2
        freq = 10_000.0 ** (-torch.arange(half, dtype=torch.float32) * 2.0 / k)
        angle = torch.arange(t, dtype=torch.float32)[:, None] * freq[None, :]
        cos, sin = angle.cos()[None, :, None, :], angle.sin()[None, :, None, :]
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

    def _loss(self, tokens):
        p, h_ = self.p, self.heads
        inp, target = tokens[:, :-1], tokens[:, 1:]
        b, t = inp.shape
        x = p["emb.w"][inp]
        d = x.shape[-1]
        k = d // h_
        causal = torch.ones(t, t, dtype=torch.bool).tril()

        def ln(name, x):
            return F.layer_norm(x, (d,), p[name + ".scale"], p[name + ".shift"], eps=1e-5)

        for i in range(self.layers):
            pre = f"blocks.{i}."
            h = ln(pre + "ln1", x)
            q = self._rope((h @ p[pre + "attn.q.w"]).reshape(b, t, h_, k))
            kk = self._rope((h @ p[pre + "attn.k.w"]).reshape(b, t, h_, k))
            v = (h @ p[pre + "attn.v.w"]).reshape(b, t, h_, k)
            s = torch.einsum("bnhk,bshk->bhns", q, kk) / math.sqrt(k)
            s = s.masked_fill(~causal, torch.finfo(s.dtype).min)
            a = torch.einsum("bhns,bshk->bnhk", s.softmax(-1), v).reshape(b, t, d)
            x = x + a @ p[pre + "attn.o.w"]
            h = ln(pre + "ln2", x) @ p[pre + "mlp.up.w"] + p[pre + "mlp.up.b"]
            x = x + F.gelu(h, approximate="tanh") @ p[pre + "mlp.down.w"] + p[pre + "mlp.down.b"]
        logits = ln("ln_f", x) @ p["emb.w"].T
        return F.cross_entropy(logits.reshape(b * t, -1), target.reshape(-1))

    def __call__(self, tokens):
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss(tokens)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(self.p.values()), CLIP)
        self.opt.step()
        self.sched.step()
        return loss.detach()


def _tokens(b: int, t: int, seed: int) -> jax.Array:
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.integers(0, DIMS["V"], (b, t + 1)), jnp.int32)


# -- fairness check -----------------------------------------------------------------------------
def check_same_trajectory(dims: dict, b: int, t: int, steps: int = 5) -> None:
    """Trains each contender `steps` steps from the same weights; the losses must agree."""
    m = GPT.init(seed=0, T=t, **dims)
    cfg = dict(lr=1e-2, warmup=2, cosine=20)  # a short warmup, so the weights move
    runs = {"shapeml": shapeml_step(m, **cfg), "jax": RawStep(m, **cfg)}
    if torch is not None:
        runs["torch"] = TorchStep(m, **cfg)
    losses = {k: [] for k in runs}
    for i in range(steps):
        tokens = _tokens(b, t, seed=100 + i)
        for name, run in runs.items():
            arg = torch.tensor(np.asarray(tokens)).long() if name == "torch" else tokens
            losses[name].append(float(run(arg)))
    for name, traj in losses.items():
        np.testing.assert_allclose(traj, losses["shapeml"], rtol=2e-4, err_msg=name)
    pretty = ", ".join(f"{v:.4f}" for v in losses["shapeml"])
    print(
        f"{_name(m.dims.L, m.dims.D, b, t)}: same loss trajectory over {steps} steps ({' / '.join(runs)}): {pretty}"
    )


# -- timing ---------------------------------------------------------------------------------------
def measure(dims: dict, b: int, t: int, rounds: int) -> dict[str, float]:
    m = GPT.init(seed=0, T=t, **dims)
    tokens = _tokens(b, t, seed=1)
    sm_step, raw_step = shapeml_step(m), RawStep(m)
    fns = {"shapeml": lambda: sm_step(tokens), "jax": lambda: raw_step(tokens)}
    if torch is not None:
        t_tokens = torch.tensor(np.asarray(tokens)).long()
        eager, compiled = TorchStep(m), TorchStep(m, compiled=True)
        fns["torch"] = lambda: eager(t_tokens)
        fns["torch_compile"] = lambda: compiled(t_tokens)
    number = max(2, 256 // b // (m.dims.D // 128) ** 2)
    times = interleaved(fns, rounds=rounds, number=number)
    assert sm_step.compiled_count() == 1
    return times


def same_validation_loss(steps: int = 100, b: int = 16, t: int = 64) -> None:
    """Trains the GPT in shapeml and in PyTorch for the same steps on the same character batches;
    their validation losses must agree within 2%."""
    from char_gpt import Corpus

    corpus = Corpus()
    m = GPT.init(seed=0, T=t, **{**DIMS, "V": len(corpus.chars)})  # the text's own vocabulary
    runs = {"shapeml": shapeml_step(m, cosine=steps), "torch": TorchStep(m, cosine=steps)}
    for s in range(steps):
        tokens = corpus.batch("train", b, t + 1, 0, s)
        runs["shapeml"](jnp.asarray(tokens))
        runs["torch"](torch.tensor(tokens).long())
    val = [corpus.batch("val", b, t + 1, 0, s) for s in range(8)]
    ours = float(np.mean([loss(runs["shapeml"].model, jnp.asarray(v)) for v in val]))
    with torch.no_grad():
        theirs = float(np.mean([float(runs["torch"].loss(torch.tensor(v).long())) for v in val]))
    gap = abs(ours - theirs) / theirs
    print(
        f"validation loss after {steps} steps: shapeml {ours:.4f}, torch {theirs:.4f} "
        f"(gap {gap:.2%}, budget 2%)"
    )
    assert gap < 0.02, "the two trainings diverged"


def _name(layers: int, width: int, b: int, t: int) -> str:
    return f"L={layers} D={width} b={b} T={t}"


def measure_scan(dims: dict, b: int, t: int, rounds: int) -> dict[str, float]:
    """The shapeml step with the blocks stacked and scanned, and as a tuple in a Python loop."""
    tokens = _tokens(b, t, seed=1)
    steps = {
        "loop": shapeml_step(GPT.init(seed=0, T=t, **dims)),
        "scan": shapeml_step(GPT.init(seed=0, T=t, scan=True, **dims)),
    }
    first = {k: [float(s(tokens)) for _ in range(3)] for k, s in steps.items()}
    np.testing.assert_allclose(first["scan"], first["loop"], rtol=2e-4)  # the same computation
    fns = {k: (lambda s=s: s(tokens)) for k, s in steps.items()}
    number = max(2, 256 // b // (dims["D"] // 128) ** 2)
    times = interleaved(fns, rounds=rounds, number=number)
    assert all(s.compiled_count() == 1 for s in steps.values())
    return times


def main_scan(quick: bool) -> None:
    worst = 0.0
    for dims, b, t in DEEP:
        times = measure_scan(dims, b, t, rounds=5 if quick else 11)
        name = _name(dims["L"], dims["D"], b, t)
        ratio = times["scan"] / times["loop"]
        worst = max(worst, ratio)
        print(f"{name}: loop {times['loop']:,.0f} us, scan {times['scan']:,.0f} us")
        print(f"gpt_scan_vs_loop[{name}]: ratio={ratio:.3f} (budget 1.15)")
    print(f"gpt_scan_vs_loop: ratio={worst:.3f} (budget 1.15)")


def main() -> None:
    sm.use_cpu_devices()  # first, before JAX starts, as examples/char_gpt.py does
    quick = "--quick" in sys.argv
    print(f"shapeml's TrainStep splits each batch over {jax.local_device_count()} CPU device(s)")
    if "--scan" in sys.argv:
        main_scan(quick)
        return
    if torch is None:
        print("PyTorch is not installed: the torch eager and torch.compile contenders are skipped")
    worst_jax, worst_torch = 0.0, 0.0
    for dims, b, t in SIZES:
        check_same_trajectory(dims, b, t)
        times = measure(dims, b, t, rounds=5 if quick else 15)
        name = _name(dims["L"], dims["D"], b, t)
        ratio = times["shapeml"] / times["jax"]
        worst_jax = max(worst_jax, ratio)
        parts = ", ".join(f"{k} {v:,.0f} us" for k, v in times.items())
        print(f"{name}: {parts}")
        print(f"gpt_step_vs_jax[{name}]: ratio={ratio:.3f} (budget 1.02)")
        if torch is not None:
            r_torch = times["shapeml"] / min(times["torch"], times["torch_compile"])
            worst_torch = max(worst_torch, r_torch)
            print(f"gpt_step_vs_torch[{name}]: ratio={r_torch:.3f} (budget 1.0)")
    print(f"gpt_step_vs_jax: ratio={worst_jax:.3f} (budget 1.02)")
    if torch is None:
        print("gpt_step_vs_torch: not measured (PyTorch is not installed)")
    else:
        same_validation_loss(steps=30 if quick else 200)
        print(f"gpt_step_vs_torch: ratio={worst_torch:.3f} (budget 1.0)")


if __name__ == "__main__":
    main()
