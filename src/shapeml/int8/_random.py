"""Random valid int8 models, with requant pairs sized so activations use the int8 range."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._validate import integer
from ._numerics import exp_table, requant_pair
from ._schema import FILE_DIMS, FORMAT, check_dims, check_sizes, model_dims, weight_names

__all__ = ["random_model_dict"]


def random_model_dict(
    cls, seed: int, *, d: int, heads: int, d_ff: int, vocab: int, ctx: int, table_len: int = 64
) -> dict[str, Any]:
    """A model file (as a dict) for the model class `cls`, with uniform random int8 weights and
    requant pairs that map a typical accumulator to a spread int8 output (some saturation
    included, on purpose)."""
    seed = integer("seed", seed, low=0)
    # the file's checks on the sizes, before anything of those sizes is drawn
    dims = check_dims(dict(zip(FILE_DIMS, (d, heads, d_ff, vocab, ctx), strict=True)))
    table = exp_table(0.1, length=table_len)
    mdims = model_dims(cls, dims, table_len)
    check_sizes(cls, mdims, table[0])
    rng = np.random.default_rng(seed)
    specs = cls.__shapeml_fields__
    shapes = {n: specs[n].shape_in(mdims) for n in weight_names(cls)}
    tensors = {n: rng.integers(-128, 128, size=s) for n, s in shapes.items()}
    tensors["embed"] = rng.integers(-64, 64, size=shapes["embed"])
    tensors["positions"] = rng.integers(-64, 64, size=shapes["positions"])
    sw = 74.0  # std of uniform int8
    dh = d // heads
    scales = {
        "q": 45 / (math.sqrt(d) * 50 * sw),
        "k": 45 / (math.sqrt(d) * 50 * sw),
        "v": 45 / (math.sqrt(d) * 50 * sw),
        "score": 10 / (math.sqrt(dh) * 45 * 45),
        "attn": 1 / 127,
        "wo": 40 / (math.sqrt(d) * 40 * sw),
        "w1": 45 / (math.sqrt(d) * 55 * sw),
        "w2": 40 / (math.sqrt(d_ff / 2) * 40 * sw),
        "res1": 0.9,
        "res2": 0.9,
    }
    return {
        "format": FORMAT,
        "dims": dims,
        "tokens": [f"t{i}" for i in range(vocab)],
        "requant": {k: list(requant_pair(v * rng.uniform(0.8, 1.25))) for k, v in scales.items()},
        "exp_table": table,
        "tensors": {n: a.reshape(-1).tolist() for n, a in tensors.items()},
        "meta": {"random_seed": seed},
    }
