"""The training corpus of the shipped model: sorting small sets of letters, generated, never downloaded.

One *example* is a set of 2 to 6 distinct letters from `a`..`l` in random order, then `>`, then the
same letters sorted, then `|`:

    fcak>acfk|

A *sequence* is examples written back to back from its first token, cut to the context length. The letters before `>`
are random, so nothing can predict them. Everything after `>`, up to and including `|`, follows
from the letters before it. Those are the *answer positions*, and accuracy is measured on them: the
model must predict, from the token at position t, the token at t+1 of the answer. A one-layer
transformer can learn this, because the next answer letter is the smallest input letter above the
current one, which one attention head can find. The generator is seeded, so the same seed gives the
same corpus on every machine.
"""

from __future__ import annotations

import typing

import numpy as np

from ..._validate import integer

__all__ = ["ALPHABET", "END", "SEP", "TOKENS", "answer_mask", "encode", "make_sequences"]

ALPHABET = "abcdefghijkl"
SEP = ">"
END = "|"
TOKENS = (*ALPHABET, SEP, END)
_ID = {t: i for i, t in enumerate(TOKENS)}
MIN_LEN, MAX_LEN = 2, 6


def encode(text: str) -> list[int]:
    """Token ids of a corpus string (one token per character)."""
    return [_ID[c] for c in text]


def _example(rng: np.random.Generator) -> str:
    n = int(rng.integers(MIN_LEN, MAX_LEN + 1))
    letters = rng.choice(len(ALPHABET), size=n, replace=False)
    return (
        "".join(ALPHABET[i] for i in letters)
        + SEP
        + "".join(ALPHABET[i] for i in sorted(letters))
        + END
    )


@typing.no_type_check  # validates its arguments itself, with coded errors
def make_sequences(n: int, length: int, seed: int) -> np.ndarray:
    """`n` sequences of `length` tokens, each examples back to back (cut at `length`).

    The generator is specified in docs/int8.md ("Corpus"): `numpy.random.default_rng(seed)`, and
    per example `rng.integers(2, 7)` letters drawn by `rng.choice(12, size=k, replace=False)`.

    Returns:
        int32 `[n length]` token ids.

    Raises:
        ArgumentTypeError, ArgumentError (E0003, E0002): `n` or `length` not an integer >= 1,
            `seed` not an integer >= 0.
    """
    n = integer("n", n, low=1)
    length = integer("length", length, low=1)
    seed = integer("seed", seed, low=0)
    rng = np.random.default_rng(seed)
    out = np.empty((n, length), np.int32)
    for i in range(n):
        text = ""
        while len(text) < length:
            text += _example(rng)
        out[i] = encode(text[:length])
    return out


def answer_mask(seqs: np.ndarray) -> np.ndarray:
    """`[n length-1]` booleans: whether the token at t+1 is an answer token (after a `>`, up to
    and including its `|`), i.e. whether predicting it from position t is determined."""
    sep, end = _ID[SEP], _ID[END]
    mask = np.zeros(seqs.shape, bool)
    for i, row in enumerate(seqs):
        inside = False
        for t, tok in enumerate(row):
            if tok == sep:
                inside = True
                continue
            mask[i, t] = inside
            if tok == end:
                inside = False
    return mask[:, 1:]
