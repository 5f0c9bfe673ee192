"""How the char GPT's training step grows with depth: compile time, and memory with remat and bf16.

Measured in one run, on `examples/char_gpt.py`'s model and loss through `TrainStep` (AdamW +
clipping), batch 8 x context 64, width 128:
  compile   the time to trace, lower and compile the whole step (`TrainStep.compiled`) at 16 blocks
            over 2 blocks, with the blocks stored stacked and run by `nn.scan` (`--scan` in the
            example) and, for contrast, as a tuple run by a Python loop (the minimum of 3 builds
            each, interleaved);
  remat     the peak temporary memory of the 16-block step (`memory_analysis().temp_size_in_bytes`
            of the compiled program: activations kept for the backward pass, gradients and
            scratch) with `TrainStep(remat="full")` over the step with `remat="none"` (and, for
            reference, `nn.scan`'s own default for stacked blocks);
  precision the same figure for `TrainStep(precision="bfloat16")` over float32, the activation
            memory of the mixed-precision policy.
Run: python benchmarks/gpt_depth.py [--quick]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from shapeml import optim
from shapeml.training import TrainStep

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
from char_gpt import GPT, loss  # noqa: E402

DIMS = dict(V=96, D=128, H=4, T=64)
B = 8


def _step(layers: int, scan: bool = True, **options) -> tuple[TrainStep, np.ndarray]:
    m = GPT.init(seed=0, L=layers, scan=scan, **DIMS)
    opt = optim.adamw(m, lr=1e-3, transforms=[optim.clip_norm(1.0)], skip_nonfinite=False)
    tokens = np.random.default_rng(0).integers(0, DIMS["V"], (B, DIMS["T"] + 1), dtype=np.int32)
    return TrainStep(loss, m, opt, **options), tokens


def compile_seconds(layers: int, scan: bool) -> float:
    step, tokens = _step(layers, scan)
    start = time.perf_counter()
    step.compiled(tokens)
    return time.perf_counter() - start


def temp_mib(layers: int, **options) -> float:
    step, tokens = _step(layers, **options)
    return step.compiled(tokens).memory_analysis().temp_size_in_bytes / 2**20


def main() -> None:
    repeats = 1 if "--quick" in sys.argv else 3
    times: dict[tuple[int, bool], list[float]] = {}
    for _ in range(repeats):
        for scan in (True, False):
            for layers in (2, 16):
                times.setdefault((layers, scan), []).append(compile_seconds(layers, scan))
    best = {k: min(v) for k, v in times.items()}
    for scan, how in ((True, "stacked + nn.scan"), (False, "tuple + Python loop")):
        print(
            f"compile, {how}: 2 blocks {best[2, scan]:.2f} s, 16 blocks {best[16, scan]:.2f} s "
            f"({best[16, scan] / best[2, scan]:.2f}x)"
        )
    plain, remat = temp_mib(16, remat="none"), temp_mib(16, remat="full")
    default = temp_mib(16)  # nn.scan's own policy for stacked blocks: the projections kept
    f32, bf16 = default, temp_mib(16, precision="bfloat16")
    print(
        f"16-block step, peak temporary memory: no remat {plain:.1f} MiB, remat full "
        f"{remat:.1f} MiB, nn.scan's default (dots_no_batch) {default:.1f} MiB"
    )
    print(
        f"16-block step, activation memory of the precision policy: float32 {f32:.1f} MiB, "
        f"bfloat16 {bf16:.1f} MiB ({bf16 / f32:.2f}x)"
    )
    print(f"gpt_compile_depth_ratio: ratio={best[16, True] / best[2, True]:.3f} (budget 1.5)")
    print(f"gpt_remat_memory_ratio: ratio={remat / plain:.3f} (budget 0.5)")


if __name__ == "__main__":
    main()
