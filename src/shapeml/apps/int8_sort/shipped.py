"""The small trained model that ships with shapeml (for demos and tests), and its float parent."""

from __future__ import annotations

from pathlib import Path

from ...int8 import Int8Model

__all__ = ["TINY_FLOAT_PATH", "TINY_MODEL_PATH", "tiny_model"]

TINY_MODEL_PATH = Path(__file__).with_name("tiny_transformer.json")
"""The shipped int8 letter-sorting model (`Int8Model.from_json` reads it; `tiny_model()` loads it)."""
TINY_FLOAT_PATH = Path(__file__).with_name("tiny_transformer_float.safetensors")
"""The float weights the shipped int8 model was quantized from (safetensors, as trained)."""


def tiny_model() -> Int8Model:
    """The shipped int8 model: a one-layer transformer that sorts sets of letters (`fcak>` ->
    `acfk|`), trained and exported by `scripts/train_tiny_transformer.py`."""
    return Int8Model.from_json(TINY_MODEL_PATH)
