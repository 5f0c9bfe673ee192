"""Optimizers typed by their model, open to all of optax: `from_optax`, `sgd`, `adamw`, `adam`,
`lion`, `adafactor`, `rmsprop`, `update`, masks, schedules, transforms, checkpoints."""

from ._aliases import adafactor as adafactor
from ._aliases import adam as adam
from ._aliases import adamw as adamw
from ._aliases import lion as lion
from ._aliases import rmsprop as rmsprop
from ._aliases import sgd as sgd
from ._checkpoint import load_checkpoint as load_checkpoint
from ._checkpoint import save_checkpoint as save_checkpoint
from ._from_optax import from_optax as from_optax
from ._masks import Mask as Mask
from ._masks import decay_mask as decay_mask
from ._masks import mask as mask
from ._optimizer import SGD as SGD
from ._optimizer import AdamW as AdamW
from ._optimizer import Optimizer as Optimizer
from ._optimizer import averaged as averaged
from ._optimizer import update as update
from ._schedules import Schedule as Schedule
from ._schedules import constant as constant
from ._schedules import cosine as cosine
from ._schedules import warmup as warmup
from ._transforms import clip_norm as clip_norm

__all__ = [
    "SGD",
    "AdamW",
    "Mask",
    "Optimizer",
    "Schedule",
    "adafactor",
    "adam",
    "adamw",
    "averaged",
    "clip_norm",
    "constant",
    "cosine",
    "decay_mask",
    "from_optax",
    "lion",
    "load_checkpoint",
    "mask",
    "rmsprop",
    "save_checkpoint",
    "sgd",
    "update",
    "warmup",
]
