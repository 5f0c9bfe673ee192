"""The names of GPT-2's tensors in a Hugging Face checkpoint, each paired with the shapeml field
that holds it. GPT-2's `Conv1D` weights are stored `[in out]`, which is `nn.Linear`'s `w [In Out]`:
every tensor maps as it is, and the fused `c_attn` stays one `[D 3*D]` Linear."""

from __future__ import annotations

import re

__all__ = ["BUFFERS", "HEAD", "PREFIX", "hf_to_field", "split_prefix"]

# What `GPT2LMHeadModel.save_pretrained` writes before each name (a bare `GPT2Model`, as the hub's
# original `gpt2` files, writes none).
PREFIX = "transformer."
# The tied head: written by some tools, always equal to `wte.weight`.
HEAD = "lm_head.weight"
# The causal-mask buffers of old checkpoints: constants, not weights.
BUFFERS = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")

_TOP = {
    "wte.weight": "wte.w",
    "wpe.weight": "wpe.w",
    "ln_f.weight": "ln_f.scale",
    "ln_f.bias": "ln_f.shift",
}
_BLOCK = {
    "ln_1.weight": "ln_1.scale",
    "ln_1.bias": "ln_1.shift",
    "attn.c_attn.weight": "attn.c_attn.w",
    "attn.c_attn.bias": "attn.c_attn.b",
    "attn.c_proj.weight": "attn.c_proj.w",
    "attn.c_proj.bias": "attn.c_proj.b",
    "ln_2.weight": "ln_2.scale",
    "ln_2.bias": "ln_2.shift",
    "mlp.c_fc.weight": "mlp.up.w",
    "mlp.c_fc.bias": "mlp.up.b",
    "mlp.c_proj.weight": "mlp.down.w",
    "mlp.c_proj.bias": "mlp.down.b",
}


def hf_to_field(layers: int) -> dict[str, str]:
    """Each Hugging Face name (without the prefix) of a GPT-2 of `layers` blocks -> its field."""
    out = dict(_TOP)
    for i in range(layers):
        out.update({f"h.{i}.{k}": f"h.{i}.{v}" for k, v in _BLOCK.items()})
    return out


def split_prefix(names) -> str:
    """The prefix a checkpoint writes before its GPT-2 names: `transformer.` or none."""
    return PREFIX if any(n.startswith(PREFIX) for n in names) else ""
