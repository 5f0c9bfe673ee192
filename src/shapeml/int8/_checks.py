"""Host-side checks: of a model's invariants when it is built, and of every decode input (token,
position, prompt) before a call, so the compiled programs never see an out-of-range index."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from .. import _jax_internals as jxi
from .._errors import ArgumentTypeError
from .._validate import integer, shorten
from ._errors import (
    Int8PositionError,
    Int8PromptError,
    Int8SizeError,
)
from ._numerics import REQUANT_POINTS
from ._schema import check_exp_table, check_requant, check_sizes, check_tokens
from ._tokenizer import check_id

__all__ = ["check_model", "check_pos", "check_prompt", "check_rows", "check_token"]


def check_model(m) -> None:
    """What the field declarations cannot say, on every build (constructor, `init`, `replace`,
    `sm.load`, `from_json`): H divides D, the int32 accumulator bounds and size caps hold,
    `tokens` spells V distinct non-empty strings, and (when the tables are concrete, i.e. not
    while JAX traces) the exp table and requant pairs are valid. The file validation
    (`_schema.validate`) runs the same helpers, in an order that reads no tensor it has not sized.

    Raises:
        Int8SizeError (E1607), Int8AccumulatorError (E1606), Int8FileError (E1601),
        Int8ShapeError (E1602), Int8ExpTableError (E1604), Int8RequantError (E1605).
    """
    dims = m.dims  # a property that resolves the dims: read it once
    if dims.D % dims.H:
        raise Int8SizeError(
            f"heads H = {dims.H} does not divide the width D = {dims.D}",
            fix="choose heads so that d / heads is an integer (the head width)",
        )
    concrete = not (jxi.is_tracer(m.exp_table) or jxi.is_tracer(m.requant_pairs))
    # Traced (e.g. `Int8Model.init` under jit): the bounds that do not read the table's values.
    table0 = check_exp_table(np.asarray(m.exp_table).tolist())[0] if concrete else 1
    check_sizes(type(m), dims, int(table0))
    check_tokens(m.tokens, dims.V)
    if concrete:
        pairs = np.asarray(m.requant_pairs).tolist()
        check_requant(dict(zip(REQUANT_POINTS, pairs, strict=True)))


def _exact(value: Any, name: str, error: type, fix: str) -> int:
    """`value`'s exact integer (checked before any conversion), or `error` naming it."""
    try:
        return integer(name, value, fix=fix)
    except ArgumentTypeError as e:
        raise error(e.message, fix=e.fix) from None


def check_token(dims, tok: Any, where: str) -> int:
    """`tok` as an int in 0..V-1, or Int8TokenError (E1608) (`_tokenizer.check_id`; `dims`: the
    model's, `m.dims`)."""
    return check_id(dims.V, tok, where)


def check_pos(dims, pos: Any) -> int:
    """`pos` as an int in 0..ctx-1, or Int8PositionError (E1610); 2.5 is refused, not read as 2."""
    ctx = dims.T
    p = _exact(pos, "pos", Int8PositionError, f"pass an integer position in 0..{ctx - 1}")
    if not 0 <= p < ctx:
        raise Int8PositionError(
            f"pos = {p} is outside 0..{ctx - 1} (ctx = {ctx})",
            fix=f"decode at most ctx = {ctx} positions",
        )
    return p


def check_rows(dims, rows: Any, name: str) -> None:
    """Int8PositionError (E1610) unless `rows` is a reference cache: int8 [T D]."""
    shape, dtype = np.shape(rows), getattr(rows, "dtype", None)
    if shape != (dims.T, dims.D) or dtype != np.int8:
        raise Int8PositionError(
            f"{name} is {dtype}{shape}, expected int8{(dims.T, dims.D)}",
            fix="start from zeros: np.zeros((ctx, d), np.int8), or `model.cache_rows(cache)`",
        )


def check_prompt(dims, prompt: Any, n: Any) -> list[int]:
    """The prompt as ints, checked with `n` tokens to generate: a sequence of token ids, every one
    in the vocabulary (E1608), at least one token, n an integer >= 0, and len(prompt) + n - 1 <= ctx
    (E1609). Nothing is converted before it is checked."""
    array = isinstance(prompt, (np.ndarray, jax.Array))
    if (
        (array and prompt.ndim != 1)
        or not (array or isinstance(prompt, Sequence))
        or (isinstance(prompt, (str, bytes)))
    ):
        raise Int8PromptError(
            f"the prompt must be a sequence of token ids, got {shorten(prompt)}",
            fix="pass a list of ints (`model.encode(text)` turns text into one)",
        )
    ctx = dims.T
    if len(prompt) > ctx + 1:  # before reading it: a huge prompt is refused at once
        raise Int8PromptError(
            f"the prompt holds {len(prompt)} tokens: even with n = 0 it feeds more than "
            f"ctx = {ctx}",
            fix=f"keep len(prompt) + n - 1 <= {ctx}",
        )
    prompt = [check_token(dims, t, f"prompt[{i}]") for i, t in enumerate(prompt)]
    if not prompt:
        raise Int8PromptError("the prompt is empty", fix="give at least one token")
    n = _exact(n, "n", Int8PromptError, "ask for n >= 0 generated tokens (an integer)")
    if n < 0:
        raise Int8PromptError(f"n = {n} is negative", fix="ask for n >= 0 generated tokens")
    if len(prompt) + n - 1 > ctx:
        raise Int8PromptError(
            f"a prompt of {len(prompt)} tokens plus n = {n} generated tokens feeds "
            f"{len(prompt) + n - 1} tokens, more than ctx = {ctx}",
            fix=f"keep len(prompt) + n - 1 <= {ctx}",
        )
    return prompt
