"""The names of a Llama-family model's tensors in a Hugging Face checkpoint, each paired with the
shapeml field that holds it. `torch.nn.Linear` stores its weight `[out in]`, the transpose of
`nn.Linear`'s `w [In Out]`: those tensors are transposed on the way in and out, the others
(embeddings, norms, biases, the head `[V D]`) map as they are."""

from __future__ import annotations

__all__ = ["HEAD", "hf_to_field"]

HEAD = "lm_head.weight"

_TOP = {"model.embed_tokens.weight": "embed.w", "model.norm.weight": "norm.scale"}
_LINEARS = {
    "self_attn.q_proj": "attn.q",
    "self_attn.k_proj": "attn.k",
    "self_attn.v_proj": "attn.v",
    "self_attn.o_proj": "attn.o",
    "mlp.gate_proj": "mlp.gate",
    "mlp.up_proj": "mlp.up",
    "mlp.down_proj": "mlp.down",
}
_NORMS = {
    "input_layernorm.weight": "attn_norm.scale",
    "post_attention_layernorm.weight": "mlp_norm.scale",
}


def hf_to_field(layers: int, tied: bool) -> dict[str, tuple[str, bool]]:
    """Each Hugging Face name of a model of `layers` blocks -> `(field, transposed)`; biases are
    listed for every projection (a model without them has no such field)."""
    out = {k: (v, False) for k, v in _TOP.items()}
    if not tied:
        out[HEAD] = ("head", False)
    for i in range(layers):
        hf, mine = f"model.layers.{i}.", f"layers.{i}."
        for k, v in _LINEARS.items():
            out[f"{hf}{k}.weight"] = (f"{mine}{v}.w", True)
            out[f"{hf}{k}.bias"] = (f"{mine}{v}.b", False)
        out.update({hf + k: (mine + v, False) for k, v in _NORMS.items()})
    return out
