"""The sampling arguments of the zoo's `generate` functions, checked the same way for each."""

from __future__ import annotations

import jax

from .._errors import ArgumentTypeError
from .._validate import real, shorten

__all__ = ["check_sampling"]


def check_sampling(key, temperature):
    """`temperature` checked when `key` samples (a number > 0), after checking `key` is one PRNG
    key or None (greedy decoding, where the temperature is unused)."""
    if key is None:
        return temperature
    is_key = isinstance(key, jax.Array) and jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    if not is_key or key.shape != ():
        raise ArgumentTypeError(
            f"`key` must be one PRNG key (jax.random.key(seed)) or None, got {shorten(key)}",
            fix="pass key=jax.random.key(0) to sample, or key=None for greedy decoding",
        )
    return real("temperature", temperature, low=0.0, low_open=True)
