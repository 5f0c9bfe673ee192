"""Shared timing helper for the benchmarks: median per-call time after warm-up."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable

import jax


def median_us(
    fn: Callable[[], object], *, warmup: int = 5, repeats: int = 7, number: int = 50
) -> float:
    """Median over `repeats` rounds of the mean time of `number` calls, in microseconds."""
    for _ in range(warmup):
        jax.block_until_ready(fn())
    rounds = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            out = fn()
        jax.block_until_ready(out)
        rounds.append((time.perf_counter() - start) / number * 1e6)
    return statistics.median(rounds)


def interleaved(
    fns: dict[str, Callable[[], object]], *, rounds: int = 9, number: int = 50
) -> dict[str, float]:
    """Median per-call microseconds of each function over `rounds` rounds of `number` calls.

    Every round runs the contenders in a freshly shuffled (seeded) order, each after one untimed
    call, so machine noise hits them alike and none always pays for following another (cold
    caches, sleeping thread pools): a fixed or merely rotated order biased results by 10-20%.
    """
    order = random.Random(0)
    for fn in fns.values():
        for _ in range(3):
            jax.block_until_ready(fn())
    names = list(fns)
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name in order.sample(names, len(names)):
            fn = fns[name]
            jax.block_until_ready(fn())
            start = time.perf_counter()
            for _ in range(number):
                out = fn()
            jax.block_until_ready(out)
            samples[name].append((time.perf_counter() - start) / number * 1e6)
    return {k: statistics.median(v) for k, v in samples.items()}
