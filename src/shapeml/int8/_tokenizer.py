"""`Tokenizer`: text to token ids and back, from the strings each id spells.

The vocabulary rules (docs/int8.md, "Text"): every token is a non-empty string, no two are equal,
and in a word vocabulary no token holds whitespace. Under them `encode(decode(ids)) == ids` for
every list of valid ids, which is why they are errors (E1613) rather than warnings.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .._errors import ArgumentTypeError
from .._traceback import api_boundary
from .._validate import instance, integer, shorten
from ._errors import Int8FileError, Int8TokenError, Int8VocabularyError

__all__ = ["IntLike", "TokenIds", "Tokenizer", "check_id", "check_vocabulary"]

# What a token id, position, count or tp degree may be at a public boundary: an int, a numpy integer
# or a 0-d integer array (e.g. the `next` a step returns); and a sequence (list, tuple, numpy or JAX
# array) of those. Typed loosely on purpose: the validation layer checks the exact value and raises
# a coded error (E1608-E1611), which an annotation checker would pre-empt with an uncoded one.
IntLike = Any
TokenIds = Any


def check_id(vocab: int, tok: IntLike, where: str, error: type = Int8TokenError) -> int:
    """`tok` as an int in 0..vocab-1, or Int8TokenError (E1608) naming `where`.

    The type comes first, on the exact value: 3.7, "5", True, arrays and tracers are refused, never
    read as 3, 5, 1; np.int64(2**40) stays 2**40 (out of range), it does not wrap."""
    fix = f"pass token ids: integers in 0..{vocab - 1}"
    try:
        t = integer(where, tok, fix=fix)
    except ArgumentTypeError as e:
        raise error(e.message, fix=e.fix) from None
    if not 0 <= t < vocab:
        raise error(f"`{where}` = {t} is outside the vocabulary 0..{vocab - 1}", fix=fix)
    return t


def check_vocabulary(tokens: Any) -> tuple[str, ...]:
    """`tokens` as a tuple, after the vocabulary rules.

    Raises:
        Int8FileError: (E1601) not a list or tuple of strings.
        Int8VocabularyError: (E1613) an empty token, two equal tokens, or whitespace inside a
            token of a word vocabulary; naming the first bad token and its id.
    """
    if not isinstance(tokens, (list, tuple)) or not all(isinstance(t, str) for t in tokens):
        raise Int8FileError(
            f"`tokens` must be a list of strings (one per vocab entry), got {shorten(tokens)}",
            fix="write `tokens` as the string each token id spells",
        )
    by_characters = all(len(t) == 1 for t in tokens)
    seen: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if not t:
            raise Int8VocabularyError(
                f"`tokens[{i}]` is the empty string", fix="give every token id a non-empty string"
            )
        if t in seen:
            raise Int8VocabularyError(
                f"`tokens` spells two ids the same way: ids {seen[t]} and {i} are both "
                f"{shorten(t)}",
                fix="give every token a distinct string",
            )
        if not by_characters and any(c.isspace() for c in t):
            raise Int8VocabularyError(
                f"`tokens[{i}]` = {shorten(t)} holds whitespace in a word vocabulary (text is "
                "split on whitespace, so no text can encode to it)",
                fix="remove the whitespace, or use one-character tokens only",
            )
        seen[t] = i
    return tuple(tokens)


@api_boundary
@dataclasses.dataclass(frozen=True)
class Tokenizer:
    """The strings a model's token ids spell, and the two conversions.

    When every token is one character (a *character vocabulary*), each character of a text is a
    token and `decode` concatenates; otherwise (a *word vocabulary*) the text is split on runs of
    whitespace (`str.split()`) and `decode` joins with one space. The tokens follow the vocabulary
    rules (`check_vocabulary`), so `encode(decode(ids)) == ids`.

    Example:
        >>> tok = Tokenizer(("a", "b", ">"))
        >>> tok.encode("ba>"), tok.decode([0, 1])
        ([1, 0, 2], 'ab')

    Raises:
        Int8FileError (E1601), Int8VocabularyError (E1613): tokens breaking the rules.
    """

    tokens: tuple[str, ...]

    def __post_init__(self):
        object.__setattr__(self, "tokens", check_vocabulary(self.tokens))

    @property
    def by_characters(self) -> bool:
        """Whether each character is a token (else each whitespace-separated word)."""
        return all(len(t) == 1 for t in self.tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (`[]` for an empty text).

        Raises:
            Int8TokenError: (E1608) naming the first piece no token spells.
            ArgumentTypeError: (E0003) `text` is not a string.
        """
        instance("text", text, str, "a string")
        ids = {t: i for i, t in enumerate(self.tokens)}
        pieces = list(text) if self.by_characters else text.split()
        out = []
        for i, piece in enumerate(pieces):
            if piece not in ids:
                raise Int8TokenError(
                    f"piece {i} of the prompt, {shorten(piece)}, is not in the vocabulary",
                    fix=f"use only these tokens: {''.join(self.tokens)!r}"
                    if len(self.tokens) < 80
                    else "see the model's `tokens`",
                )
            out.append(ids[piece])
        return out

    def decode(self, ids: TokenIds) -> str:
        """The text the token ids spell: concatenated (character vocabulary) or joined with one
        space (word vocabulary).

        Raises:
            Int8TokenError: (E1608) `ids` is not a sequence of integers in 0..V-1 (checked before
                any conversion: -1 is refused, never Python's last element).
        """
        v = len(self.tokens)
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__"):
            raise Int8TokenError(
                f"`ids` must be a sequence of token ids, got {shorten(ids)}",
                fix="pass a list of ints (e.g. what `generate` returns)",
            )
        arr = np.asarray(ids) if hasattr(ids, "dtype") else None
        if arr is not None and arr.ndim == 1 and arr.dtype.kind in "iu":  # arrays: checked at once
            bad = np.flatnonzero((arr < 0) | (arr >= v))
            if bad.size:
                i = int(bad[0])
                raise Int8TokenError(
                    f"`ids[{i}]` = {int(arr[i])} is outside the vocabulary 0..{v - 1}",
                    fix=f"pass token ids in 0..{v - 1}",
                )
            ids = arr.tolist()
        else:
            ids = [check_id(v, t, f"ids[{i}]") for i, t in enumerate(ids)]
        sep = "" if self.by_characters else " "
        return sep.join(self.tokens[i] for i in ids)
