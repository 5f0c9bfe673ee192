"""Shuffled mini-batches over arrays that share their first axis, whole or split by process."""

from __future__ import annotations

import typing
from collections.abc import Iterator

import numpy as np

from .._errors import ArgumentError, ArgumentTypeError
from .._traceback import api_boundary
from .._validate import instance, integer, shorten

__all__ = ["batches"]


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def batches(
    *arrays: np.ndarray,
    batch_size: int,
    seed: int = 0,
    epochs: int | None = None,
    drop_last: bool = True,
    part: tuple[int, int] = (0, 1),
) -> Iterator[tuple[np.ndarray, ...]]:
    """Yields tuples of same-index batches, reshuffled every epoch (deterministic per seed).

    Every argument is checked when `batches` is called, before the first batch is asked for.

    In a job of several processes every process draws the same shuffle and yields only its part
    of each batch: with `part=(i, n)`, rows `i * batch_size // n` up to `(i + 1) * batch_size // n`
    of every `batch_size`-row batch, so the parts of the `n` processes put together are the batch
    one process would draw. `sharding.batch_part(mesh)` gives the part of this process.

    Args:
        *arrays: arrays `[n ...]` with the same length `n` along axis 0 (e.g. images and labels).
        batch_size: examples per batch, `1 .. n`.
        seed: shuffling seed (>= 0); epoch `e` uses the permutation drawn from `(seed, e)`.
        epochs: how many passes (>= 1); None repeats forever.
        drop_last: drop a final short batch so every batch has the same shape (no recompiles).
        part: `(index, count)`: yield only part `index` of `count` equal parts of each batch
            (`batch_size` a multiple of `count`; with `drop_last=False` the final short batch
            is split as evenly as it goes). `(0, 1)`, the default, is the whole batch.

    Raises:
        ArgumentTypeError: (E0003) for an argument that is not an array with a first axis, or a
            size, seed or epoch count that is not a whole number.
        ArgumentError: (E0002) for no arrays, empty arrays, arrays of different lengths, a
            batch size, seed or epoch count out of range, or a part that is not `(index,
            count)` with `0 <= index < count` and `count` dividing `batch_size`.
    """
    if not arrays:
        raise ArgumentError(
            "batches() needs at least one array", fix="call batches(x, y, batch_size=64)"
        )
    for i, a in enumerate(arrays):
        if not (hasattr(a, "shape") and hasattr(a, "__getitem__")) or len(a.shape) == 0:
            raise ArgumentTypeError(
                f"batches(): argument {i} is {shorten(a)} ({type(a).__name__}), not an array "
                "with a first axis to batch over",
                fix="pass numpy arrays [n ...], e.g. np.asarray(data)",
            )
    n = arrays[0].shape[0]
    lengths = [a.shape[0] for a in arrays]
    if any(length != n for length in lengths):
        raise ArgumentError(
            f"batches(): arrays differ in length along axis 0 ({', '.join(map(str, lengths))})",
            fix="pass arrays that pair up example by example (same first axis)",
        )
    if n == 0:
        raise ArgumentError(
            "batches(): the arrays are empty (length 0)", fix="pass at least one example"
        )
    batch_size = integer("batch_size", batch_size, low=1, high=n)
    seed = integer("seed", seed, low=0)
    if epochs is not None:
        epochs = integer("epochs", epochs, low=1, fix="pass epochs >= 1, or None to repeat forever")
    instance("drop_last", drop_last, bool, "True or False")
    index, count = _part(part, batch_size)
    return _batches(arrays, n, batch_size, seed, epochs, drop_last, index, count)


def _part(part, batch_size: int) -> tuple[int, int]:
    fix = "pass part=(index, count), e.g. part=sharding.batch_part(mesh)"
    if not (isinstance(part, (tuple, list)) and len(part) == 2):
        raise ArgumentTypeError(
            f"batches(): part={shorten(part)} is not an (index, count) pair", fix=fix
        )
    count = integer("part count", part[1], low=1, high=batch_size, fix=fix)
    index = integer("part index", part[0], low=0, high=count - 1, fix=fix)
    if batch_size % count:
        raise ArgumentError(
            f"batches(): batch_size={batch_size} does not split into {count} equal parts",
            fix=f"use a batch size that is a multiple of {count}",
        )
    return index, count


def _batches(arrays, n, batch_size, seed, epochs, drop_last, index=0, count=1):
    epoch = 0
    while epochs is None or epoch < epochs:
        order = np.random.default_rng((seed, epoch)).permutation(n)
        stop = n - n % batch_size if drop_last else n
        for start in range(0, stop, batch_size):
            idx = order[start : start + batch_size]
            if count > 1:  # this process's rows of the batch every process draws alike
                idx = np.array_split(idx, count)[index]
            yield tuple(a[idx] for a in arrays)
        epoch += 1
