"""`Tokenizer`: text to token ids and back, from the strings each id spells."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ._errors import Int8TokenError

__all__ = ["Tokenizer"]


@dataclasses.dataclass(frozen=True)
class Tokenizer:
    """The strings a model's token ids spell, and the two conversions.

    When every token is one character, each character of a text is a token; otherwise the text
    is split on whitespace and each word is a token (and `decode` joins with spaces).

    Example:
        >>> tok = Tokenizer(("a", "b", ">"))
        >>> tok.encode("ba>"), tok.decode([0, 1])
        ([1, 0, 2], 'ab')
    """

    tokens: tuple[str, ...]

    def __post_init__(self):
        object.__setattr__(self, "tokens", tuple(self.tokens))

    @property
    def by_characters(self) -> bool:
        """Whether each character is a token (else each whitespace-separated word)."""
        return all(len(t) == 1 for t in self.tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`.

        Raises:
            Int8TokenError: (E1608) naming the first piece no token spells.
        """
        ids = {t: i for i, t in enumerate(self.tokens)}
        pieces = list(text) if self.by_characters else text.split()
        out = []
        for i, piece in enumerate(pieces):
            if piece not in ids:
                raise Int8TokenError(
                    f"piece {i} of the prompt, {piece!r}, is not in the vocabulary",
                    fix=f"use only these tokens: {''.join(self.tokens)!r}"
                    if len(self.tokens) < 80
                    else "see the model's `tokens`",
                )
            out.append(ids[piece])
        return out

    def decode(self, ids: Sequence[int]) -> str:
        """The text the token ids spell."""
        sep = "" if self.by_characters else " "
        return sep.join(self.tokens[int(i)] for i in ids)
