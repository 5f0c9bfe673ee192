"""The int8 transformer's errors and warnings (codes E1601..E1615)."""

from __future__ import annotations

from .._errors import ShapemlError

__all__ = [
    "Int8AccumulatorError",
    "Int8ExpTableError",
    "Int8FileError",
    "Int8FormatError",
    "Int8JsonError",
    "Int8PositionError",
    "Int8PromptError",
    "Int8RequantError",
    "Int8ScaleError",
    "Int8ShapeError",
    "Int8SizeError",
    "Int8TensorParallelError",
    "Int8TokenError",
    "Int8ValueError",
    "Int8VocabularyError",
]


class Int8FileError(
    ShapemlError,
    KeyError,
    code="E1601",
    title="int8 model file: bad key",
    explanation="""
An int8 model file (JSON, schema in docs/int8.md) is missing a key the schema requires, has a key
it does not define, or holds a value of the wrong JSON type (e.g. a string where a list of integers
belongs). Every key is checked before any array is built, and the error names the field.

Fix the exporter that wrote the file, or regenerate it with `shapeml int8 train`.
""",
):
    def __str__(self) -> str:  # KeyError would otherwise quote the whole message
        return ShapemlError.__str__(self)


class Int8ShapeError(
    ShapemlError,
    ValueError,
    code="E1602",
    title="int8 model file: wrong length",
    explanation="""
A tensor in an int8 model file does not have the number of elements its dims imply, e.g. `wq` must
hold d*d integers (row-major) and `positions` ctx*d. The message names the tensor, the expected and
the actual count.
""",
):
    pass


class Int8ValueError(
    ShapemlError,
    ValueError,
    code="E1603",
    title="int8 model file: value out of range",
    explanation="""
A weight of an int8 model file lies outside the int8 range [-128, 127], or is not an integer. The
message names the tensor, the first offending index and its value. Quantize (clip) before export.
""",
):
    pass


class Int8ExpTableError(
    ShapemlError,
    ValueError,
    code="E1604",
    title="bad softmax exp table",
    explanation="""
The softmax exp table must hold 1..128 integers, start with a positive entry, never increase
(table[i+1] <= table[i]), and stay within [0, 32767]. A table that grows with the distance from the
row maximum would weigh far-away scores more than the maximum, and an empty table has nothing to
look up.
""",
):
    pass


class Int8RequantError(
    ShapemlError,
    ValueError,
    code="E1605",
    title="requant pair out of range",
    explanation="""
A requant pair (M, S) computes `clip((x*M + 2**(S-1)) >> S, -128, 127)` in int64. The multiplier
must satisfy 1 <= M <= 2**31 - 1 and the shift 1 <= S <= 62, so that x*M + 2**(S-1) cannot
overflow int64 for any int32 accumulator x. (A missing requant point is E1601.)
""",
):
    pass


class Int8AccumulatorError(
    ShapemlError,
    ValueError,
    code="E1606",
    title="int32 accumulator could overflow",
    explanation="""
The decode step accumulates int8 x int8 products in int32. For the model's sizes, the worst-case
magnitude of some accumulator (listed in docs/int8.md, "Overflow bounds") would exceed 2**31 - 1, so
the integer pipeline could wrap silently. Reduce the named dimension (or the exp table's first
entry, for the softmax sum).
""",
):
    pass


class Int8SizeError(
    ShapemlError,
    ValueError,
    code="E1607",
    title="bad int8 model dims",
    explanation="""
The dims of an int8 model must be positive integers within sane limits (d, d_ff <= 8192,
vocab <= 65536, ctx <= 8192, at most 2**26 weights in all), and heads must divide d. The check runs
before any tensor is read, so an absurd size is refused without allocating it.
""",
):
    pass


class Int8TokenError(
    ShapemlError,
    IndexError,
    code="E1608",
    title="token outside the vocabulary",
    explanation="""
A token id is not an index of the model's vocabulary: not an integer (a float such as 3.7, a string
such as "5", a bool), or outside 0 <= token < vocab; or a prompt text holds a piece that no token
spells. Ids are checked on their exact value before any conversion, so they are never truncated,
wrapped or clamped, and `decode([-1])` is refused rather than read as the last token.
""",
):
    pass


class Int8PromptError(
    ShapemlError,
    ValueError,
    code="E1609",
    title="prompt does not fit the context",
    explanation="""
Every token the decode feeds needs a row of the positional table, so a trace of a prompt of length
p plus n generated tokens feeds p + n - 1 tokens and needs p + n - 1 <= ctx. The prompt must also
hold at least one token. Shorten the prompt or ask for fewer tokens.
""",
):
    pass


class Int8PositionError(
    ShapemlError,
    IndexError,
    code="E1610",
    title="decode position out of range",
    explanation="""
`decode_step(tok, pos, cache)` writes row `pos` of the KV cache and reads the positional table's row
`pos`, so pos must be an integer (not 2.5, not a bool) with 0 <= pos < ctx; the cache must be the model's (`init_cache()`: a KVCache, int8
[1 1 ctx heads d/heads]). Indices are
never clamped.
""",
):
    pass


class Int8TensorParallelError(
    ShapemlError,
    ValueError,
    code="E1611",
    title="tensor-parallel degree does not fit",
    explanation="""
Tensor parallel decode splits the heads and the FFN columns evenly over tp devices, so tp must
divide both `heads` and `d_ff`, and the process must see at least tp JAX devices (on CPU, call
`sm.use_cpu_devices(N)` first, before any JAX computation).
""",
):
    pass


class Int8FormatError(
    ShapemlError,
    ValueError,
    code="E1612",
    title="int8 model file: unknown format",
    explanation="""
The `format` key of an int8 model file is not "shapeml.int8.v1", the one format this version reads.
The file may be from another tool or a newer shapeml. Re-export it with `Int8Model.to_json(path)`,
or set `"format": "shapeml.int8.v1"` if it follows the schema in docs/int8.md.
""",
):
    pass


class Int8VocabularyError(
    ShapemlError,
    ValueError,
    code="E1613",
    title="bad vocabulary token",
    explanation="""
The token strings of an int8 model (its `tokens`) must let text round-trip: every token is a
non-empty string, no two tokens are equal, and in a word vocabulary (some token longer than one
character, so text is split on whitespace) no token contains whitespace, which `encode` could never
produce. In a character vocabulary (every token one character) a whitespace character is a token
like any other. The message names the first bad token and its id; fix the exporter's vocabulary.
""",
):
    pass


class Int8JsonError(
    ShapemlError,
    ValueError,
    code="E1614",
    title="int8 model file: not readable JSON",
    explanation="""
An int8 model file could not be parsed as JSON: it is truncated or not JSON at all, nests arrays or
objects deeper than the parser allows, holds a number JSON cannot read (e.g. an integer of more than
4300 digits), repeats a key inside one object (JSON parsers disagree on which one wins, so the file
does not say one thing), or is larger than the 512 MiB cap (checked from the file's size, before it
is read).
The message says which and where. If the file was copied, check the copy finished; otherwise
re-export it with `Int8Model.to_json(path)`.
""",
):
    pass


class Int8ScaleError(
    ShapemlError,
    ValueError,
    code="E1615",
    title="int8 export: a degenerate scale",
    explanation="""
The int8 exporter (`shapeml.apps.int8_sort.quantize.quantize`, docs/int8.md "Post-training
quantization") gives every weight and every calibrated activation one scale, `max|.| / 127`, and
turns ratios of these scales into requant pairs. It refuses, naming the tensor and the cause:

- a float weight holding NaN or an infinity;
- a scale of 0: an all-zero weight (`wq`, `w1`, ...), or an activation that is zero at every
  calibration position: `x0` when the embedding rows of the calibration ids and the positional
  rows are zero, `q`/`k`/`v` when `x0 @ w` vanishes, `h` when the ReLU is dead on the calibration
  data (`x1 @ w1 <= 0` everywhere), ...; a ratio would divide by it;
- a scale or a requant ratio that is not a positive finite float64 (an overflow, or a magnitude so
  small that dividing it by 127 underflows).

A zero activation means the calibration data never exercises that part of the model: calibrate on
more (or more varied) sequences, or fix the model (a dead ReLU layer contributes nothing).
""",
):
    pass
