"""The errors of LoRA adapters (codes E2301..E2303), each with its long form."""

from __future__ import annotations

from .._errors import ShapemlError

__all__ = ["LoRAFileError", "LoRATargetError"]


class LoRATargetError(
    ShapemlError,
    ValueError,
    code="E2301",
    title="a LoRA target pattern names no Linear layer",
    explanation="""
`lora.apply(m, targets, ...)` puts an adapter on every `nn.Linear` sub-model whose dotted name
matches one of the `targets` patterns (shell-style: `*` matches any run of characters, dots
included; `"*.attn.q"` matches `layers.0.attn.q`, `layers.1.attn.q`, ...). A pattern that matches
no layer, or that matches a sub-model that is not an `nn.Linear` (a norm, a whole block), is
refused with the layer names the model has: an adapter that silently lands nowhere would train
nothing.

    lora.apply(m, ["*.attn.query"])    # E2301: no Linear matches; names include layers.0.attn.q
    lora.apply(m, ["*.attn.q", "*.attn.v"], rank=8, alpha=16)

A model that already has adapters is merged first (`lora.merge`) before new ones are applied.
""",
):
    pass


class LoRAFileError(
    ShapemlError,
    ValueError,
    code="E2302",
    title="a LoRA adapter file does not fit the base model",
    explanation="""
`lora.load(path, base)` reads an adapters file written by `lora.save` and applies it to `base`:
the file names its targets, rank and alpha, and every adapter `<layer>.lora_a [In R]`,
`<layer>.lora_b [R Out]`. Each layer must exist in `base` as an `nn.Linear` with the same `In`
and `Out`, and the file must hold exactly the adapters its targets give on `base`. Every missing,
unexpected or misshapen adapter is listed at once; nothing is applied.

    lora.load("adapters.safetensors", base)   # E2302: layers.0.attn.q.lora_a: expected [64 8], got [128 8]

Load adapters into the base model they were trained on (the same dims).
""",
):
    pass
