"""The Llama family (Llama, Qwen2, Mistral, SmolLM, TinyLlama) in named dims from `shapeml.nn`
layers, with pretrained weights from (and back to) the Hugging Face format: `from_hf` reads a
`transformers` checkpoint folder and `to_hf` writes one; the logits and greedy tokens equal
`transformers`' `LlamaForCausalLM` (`Qwen2ForCausalLM`, `MistralForCausalLM`).

Example:
    >>> from shapeml.zoo import llama
    >>> m = llama.from_hf("SmolLM2-135M/")          # config.json + model.safetensors
    >>> tok = llama.load_tokenizer("SmolLM2-135M/")  # its tokenizer.json
    >>> out = llama.generate(m, prompt, 20)          # greedy, through the KV cache
    >>> llama.to_hf(m, "finetuned/")
"""

from ._config import config_dims as config_dims
from ._decode import generate as generate
from ._decode import new_cache as new_cache
from ._decode import step as step
from ._errors import LlamaCheckpointError as LlamaCheckpointError
from ._errors import LlamaConfigError as LlamaConfigError
from ._hf import from_hf as from_hf
from ._hf import load_tokenizer as load_tokenizer
from ._hf import to_hf as to_hf
from ._model import MLP as MLP
from ._model import Attention as Attention
from ._model import Block as Block
from ._model import Llama as Llama
from ._model import attend as attend
from ._model import forward as forward
from ._model import hidden as hidden
from ._model import loss as loss
from ._model import options as options

__all__ = [
    "MLP",
    "Attention",
    "Block",
    "Llama",
    "LlamaCheckpointError",
    "LlamaConfigError",
    "attend",
    "config_dims",
    "forward",
    "from_hf",
    "generate",
    "hidden",
    "load_tokenizer",
    "loss",
    "new_cache",
    "options",
    "step",
    "to_hf",
]
