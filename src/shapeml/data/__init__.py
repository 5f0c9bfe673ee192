"""Built-in data sets (generated, never downloaded) and batching."""

from . import shapes as shapes
from ._batches import batches as batches

__all__ = ["batches", "shapes"]
