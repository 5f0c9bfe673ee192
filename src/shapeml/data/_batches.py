"""Shuffled mini-batches over arrays that share their first axis."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from .._errors import ArgumentError

__all__ = ["batches"]


def batches(
    *arrays: np.ndarray,
    batch_size: int,
    seed: int = 0,
    epochs: int | None = None,
    drop_last: bool = True,
) -> Iterator[tuple[np.ndarray, ...]]:
    """Yields tuples of same-index batches, reshuffled every epoch (deterministic per seed).

    Args:
        *arrays: arrays with the same length along axis 0 (e.g. images and labels).
        batch_size: examples per batch.
        seed: shuffling seed; epoch `e` uses the permutation drawn from `(seed, e)`.
        epochs: how many passes; None repeats forever.
        drop_last: drop a final short batch so every batch has the same shape (no recompiles).
    """
    if not arrays:
        raise ArgumentError("batches() needs at least one array")
    n = len(arrays[0])
    for a in arrays:
        if len(a) != n:
            raise ArgumentError(f"batches(): arrays differ in length ({n} vs {len(a)})")
    if not 0 < batch_size <= n:
        raise ArgumentError(f"batch_size must be in 1..{n}, got {batch_size}")
    epoch = 0
    while epochs is None or epoch < epochs:
        order = np.random.default_rng((seed, epoch)).permutation(n)
        stop = n - n % batch_size if drop_last else n
        for start in range(0, stop, batch_size):
            idx = order[start : start + batch_size]
            yield tuple(a[idx] for a in arrays)
        epoch += 1
