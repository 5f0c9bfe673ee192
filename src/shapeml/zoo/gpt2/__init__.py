"""GPT-2 in named dims from `shapeml.nn` layers, with pretrained weights from (and back to) the
Hugging Face format: `from_hf` reads a `transformers` checkpoint folder and `to_hf` writes one,
tensor for tensor; the logits and greedy tokens equal `transformers.GPT2LMHeadModel`'s.

Example:
    >>> from shapeml.zoo import gpt2
    >>> m = gpt2.from_hf("gpt2/")                 # config.json + model.safetensors
    >>> out = gpt2.generate(m, prompt, 20)        # greedy, through the KV cache
    >>> gpt2.to_hf(m, "finetuned/")
"""

from ._config import config_dims as config_dims
from ._decode import generate as generate
from ._decode import new_cache as new_cache
from ._decode import step as step
from ._errors import HFCheckpointError as HFCheckpointError
from ._errors import HFConfigError as HFConfigError
from ._hf import from_hf as from_hf
from ._hf import to_hf as to_hf
from ._model import GPT2 as GPT2
from ._model import Attention as Attention
from ._model import Block as Block
from ._model import attend as attend
from ._model import forward as forward
from ._model import hidden as hidden
from ._model import loss as loss

__all__ = [
    "GPT2",
    "Attention",
    "Block",
    "HFCheckpointError",
    "HFConfigError",
    "attend",
    "config_dims",
    "forward",
    "from_hf",
    "generate",
    "hidden",
    "loss",
    "new_cache",
    "step",
    "to_hf",
]
