"""LoRA as a declaration, on any model: `lora.apply(m, ["*.attn.q", "*.attn.v"], rank=8)` puts a
low-rank adapter on each matching `nn.Linear` and freezes every other weight, so the gradient,
the optimizer state and `TrainStep` cover the adapters only; `lora.save` / `lora.load` keep the
adapters alone in a small safetensors file checked against the base; `lora.merge` folds them into
a plain model. A hoisted forward (`sm.hoist`) computes each merged weight once per weights.

Example:
    >>> m = lora.apply(llama.from_hf("ckpt/"), ["*.attn.q", "*.attn.v"], rank=8, alpha=16)
    >>> step = TrainStep(llama.loss, m, optim.adamw(m, lr=1e-3))   # adapters only
    >>> lora.save("adapters.safetensors", step.model)
    >>> llama.to_hf(lora.merge(step.model), "finetuned/")
"""

from ._apply import adapters as adapters
from ._apply import apply as apply
from ._apply import merge as merge
from ._errors import LoRAFileError as LoRAFileError
from ._errors import LoRATargetError as LoRATargetError
from ._files import load as load
from ._files import save as save
from ._linear import Linear as Linear

__all__ = [
    "Linear",
    "LoRAFileError",
    "LoRATargetError",
    "adapters",
    "apply",
    "load",
    "merge",
    "save",
]
