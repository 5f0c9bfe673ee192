"""Host-side checks: of a model's invariants when it is built, and of every decode input (token,
position, prompt) before a call, so the compiled programs never see an out-of-range index."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import _jax_internals as jxi
from ._errors import (
    Int8PositionError,
    Int8PromptError,
    Int8ShapeError,
    Int8SizeError,
    Int8TokenError,
)
from ._numerics import REQUANT_POINTS
from ._schema import check_exp_table, check_requant

__all__ = ["check_model", "check_pos", "check_prompt", "check_token"]


def check_model(m) -> None:
    """What the field declarations cannot say: `tokens` spells V ids, H divides D, and (when the
    tables are concrete, i.e. not while JAX traces) the exp table and requant pairs are valid.

    Raises:
        Int8ShapeError (E1602), Int8SizeError (E1607), Int8ExpTableError (E1604),
        Int8RequantError (E1605).
    """
    if len(m.tokens) != m.dims.V:
        raise Int8ShapeError(
            f"`tokens` holds {len(m.tokens)} strings, but the vocabulary V = {m.dims.V}",
            fix="give exactly one string per token id",
        )
    if m.dims.D % m.dims.H:
        raise Int8SizeError(
            f"heads H = {m.dims.H} does not divide the width D = {m.dims.D}",
            fix="choose heads so that d / heads is an integer (the head width)",
        )
    if jxi.is_tracer(m.exp_table) or jxi.is_tracer(m.requant_pairs):
        return  # built inside a transformation (e.g. `Int8Model.init` under jit)
    check_exp_table(np.asarray(m.exp_table).tolist())
    pairs = np.asarray(m.requant_pairs).tolist()
    check_requant(dict(zip(REQUANT_POINTS, pairs, strict=True)))


def check_token(m, tok: Any, where: str, *, vocab: int | None = None) -> int:
    """`tok` as an int in 0..V-1, or Int8TokenError (E1608). (`vocab`: m.dims.V, if known.)"""
    t, v = int(tok), m.dims.V if vocab is None else vocab
    if not 0 <= t < v:
        raise Int8TokenError(
            f"{where} = {t} is outside the vocabulary 0..{v - 1}",
            fix=f"pass token ids in 0..{v - 1}",
        )
    return t


def check_pos(m, pos: Any) -> int:
    """`pos` as an int in 0..ctx-1, or Int8PositionError (E1610)."""
    p = int(pos)
    ctx = m.dims.T
    if not 0 <= p < ctx:
        raise Int8PositionError(
            f"pos = {p} is outside 0..{ctx - 1} (ctx = {ctx})",
            fix=f"decode at most ctx = {ctx} positions",
        )
    return p


def check_prompt(m, prompt: Sequence[int], n: int) -> list[int]:
    """The prompt as ints, checked with `n` tokens to generate: every token in the vocabulary
    (E1608), at least one token, n >= 0, and len(prompt) + n - 1 <= ctx (E1609)."""
    vocab = m.dims.V
    prompt = [check_token(m, t, f"prompt[{i}]", vocab=vocab) for i, t in enumerate(prompt)]
    if not prompt:
        raise Int8PromptError("the prompt is empty", fix="give at least one token")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise Int8PromptError(
            f"n = {n!r} must be a non-negative integer", fix="ask for n >= 0 generated tokens"
        )
    ctx = m.dims.T
    if len(prompt) + n - 1 > ctx:
        raise Int8PromptError(
            f"a prompt of {len(prompt)} tokens plus n = {n} generated tokens feeds "
            f"{len(prompt) + n - 1} tokens, more than ctx = {ctx}",
            fix=f"keep len(prompt) + n - 1 <= {ctx}",
        )
    return prompt
