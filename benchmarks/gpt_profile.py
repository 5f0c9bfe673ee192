"""Where the char GPT's training step spends its time: XLA's per-fusion profile of shapeml's step
next to PyTorch's per-op profile of the same step (`benchmarks/gpt_step.py`'s contenders).

Run: python benchmarks/gpt_profile.py [--batch 32] [--ctx 64] [--width 128] [--layers 2]
     [--devices 1] [--scan] [--no-torch]
Each table lists the busiest ops with their busy time per step summed over threads; the wall time
per step is in its title (the profilers add some overhead to both).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _profile import table, torch_ops, xla_fusions  # noqa: E402
from gpt_step import GPT, TorchStep, _tokens, shapeml_step, torch  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--ctx", type=int, default=64)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--devices", type=int, default=None, help="shapeml's devices (default: all)")
    p.add_argument("--scan", action="store_true", help="blocks stacked, one lax.scan")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--top", type=int, default=20)
    args = p.parse_args()
    dims = dict(V=96, D=args.width, H=4, L=args.layers, T=args.ctx)
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
