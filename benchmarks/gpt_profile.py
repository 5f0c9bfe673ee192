"""Where the char GPT's training step spends its time: XLA's per-fusion profile of shapeml's step
next to PyTorch's per-op profile of the same step (`benchmarks/gpt_step.py`'s contenders).

Run: python benchmarks/gpt_profile.py [--batch 32] [--ctx 64] [--width 128] [--layers 2]
     [--heads 4] [--devices 1] [--scan] [--no-torch] [--forms]
Each table lists the busiest ops with their busy time per step summed over threads; the wall time
per step is in its title (the profilers add some overhead to both).

`--forms` instead races formulations of the attention (`_forms.py`: the layer's own
tokens-major einsums, heads-major projections, `jax.nn.dot_product_attention`, one fused q/k/v
projection) and of the MLP (tanh-GELU between the two products, alone or with the LayerNorm before
it), each as a jitted forward + backward at the given size, interleaved, after checking that
every formulation gives the same output and gradients.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _forms import ATTENTION, MLP  # noqa: E402
from _profile import table, torch_ops, xla_fusions  # noqa: E402
from _timing import interleaved  # noqa: E402
from gpt_step import GPT, TorchStep, _tokens, shapeml_step, sm, torch  # noqa: E402


def _race(kind: str, forms: dict, params: dict, x, size: str, rounds: int, number: int) -> None:
    import jax
    import jax.numpy as jnp

    fns, outs = {}, {}
    for name, form in forms.items():
        grad = jax.jit(jax.value_and_grad(lambda p, x, f=form: jnp.sum(f(p, x) ** 2), (0, 1)))
        outs[name] = grad(params, x)
        fns[name] = lambda g=grad: g(params, x)
    first = next(iter(forms))
    for name, out in outs.items():  # the same numbers, or the race is meaningless
        for a, ref in zip(jax.tree.leaves(out), jax.tree.leaves(outs[first])):
            np.testing.assert_allclose(
                a, ref, rtol=2e-3, atol=2e-3 * float(jnp.abs(ref).max()), err_msg=name
            )
    times = interleaved(fns, rounds=rounds, number=number)
    for name, us in times.items():
        print(f"{kind} {name:17s} [{size}]: {us:9,.0f} us  ({us / times[first]:.3f}x {first})")


def race_forms(args) -> None:
    """Times each formulation's forward + backward, interleaved, at one size."""
    import jax.numpy as jnp

    d, h, b, t = args.width, args.heads, args.batch, args.ctx
    rng = np.random.default_rng(0)

    def w(*shape, scale=1.0):
        return jnp.asarray(rng.normal(size=shape) * scale, jnp.float32)

    x = w(b, t, d)
    size = f"D={d} H={h} b={b} T={t}"
    number = max(2, 2048 // (b * t // 16))
    attn = {n: w(d, d, scale=d**-0.5) for n in "qkvo"}
    forms = {k: (lambda p, x, f=f: f(p, x, h)) for k, f in ATTENTION.items()}
    _race("attention", forms, attn, x, size, args.rounds, number)
    mlp = dict(scale=w(d), bias=w(d), up=w(d, 4 * d, scale=d**-0.5), b_up=w(4 * d))
    mlp.update(down=w(4 * d, d, scale=(4 * d) ** -0.5), b_down=w(d))
    _race("mlp", MLP, mlp, x, size, args.rounds, number)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--ctx", type=int, default=64)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument(
        "--devices", type=int, default=None, help="shapeml's devices (default: every core)"
    )
    p.add_argument("--scan", action="store_true", help="blocks stacked, one lax.scan")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--forms", action="store_true", help="race attention formulations")
    p.add_argument("--rounds", type=int, default=9)
    args = p.parse_args()
    if args.forms:
        race_forms(args)
        return
    sm.use_cpu_devices(args.devices)  # as examples/char_gpt.py does, before JAX starts
    dims = dict(V=96, D=args.width, H=args.heads, L=args.layers, T=args.ctx)
    m = GPT.init(seed=0, scan=args.scan, **dims)
    tokens = _tokens(args.batch, args.ctx, seed=1)
    step = shapeml_step(m, devices=args.devices)
    compiled = step.compiled(tokens)
    wall, rows = xla_fusions(compiled, lambda: step(tokens))
    size = f"L={args.layers} D={args.width} b={args.batch} T={args.ctx}"
    print(table(f"shapeml TrainStep, {size}", wall, rows, args.top))
    if torch is not None and not args.no_torch:
        eager = TorchStep(m)
        t_tokens = torch.tensor(np.asarray(tokens)).long()
        wall, rows = torch_ops(lambda: eager(t_tokens))
        print(table(f"PyTorch eager, {size}", wall, rows, args.top))


if __name__ == "__main__":
    main()
