"""Optimizers typed by their model, built on optax: `sgd`, `adamw`, `update`, schedules, transforms."""

from ._checkpoint import load_checkpoint as load_checkpoint
from ._checkpoint import save_checkpoint as save_checkpoint
from ._optimizer import SGD as SGD
from ._optimizer import AdamW as AdamW
from ._optimizer import Optimizer as Optimizer
from ._optimizer import adamw as adamw
from ._optimizer import sgd as sgd
from ._optimizer import update as update
from ._schedules import Schedule as Schedule
from ._schedules import constant as constant
from ._schedules import cosine as cosine
from ._schedules import warmup as warmup
from ._transforms import clip_norm as clip_norm

__all__ = [
    "SGD",
    "AdamW",
    "Optimizer",
    "Schedule",
    "adamw",
    "clip_norm",
    "constant",
    "cosine",
    "load_checkpoint",
    "save_checkpoint",
    "sgd",
    "update",
    "warmup",
]
