"""The errors of the Llama family's Hugging Face checkpoints (codes E2006, E2007), each with its
long form."""

from __future__ import annotations

from ..._errors import ShapemlError

__all__ = ["LlamaCheckpointError", "LlamaConfigError"]


class LlamaConfigError(
    ShapemlError,
    ValueError,
    code="E2006",
    title="a Hugging Face config.json that is not a Llama-family model shapeml can hold",
    explanation="""
`llama.from_hf` reads the checkpoint folder's `config.json` for the model's dims and options:
`vocab_size` (V), `max_position_embeddings` (T), `hidden_size` (D), `num_attention_heads` (H),
`num_key_value_heads` (K, default H, dividing H), `head_dim` (Dh, default D // H, even),
`intermediate_size` (F) and `num_hidden_layers` (L), each a whole number >= 1; `rms_norm_eps`
(> 0) and the rotary base (`rope_parameters.rope_theta`, or `rope_theta` in older files).

`model_type` must be "llama", "qwen2" or "mistral" with the options shapeml computes: the SiLU
gate (`hidden_act` "silu"), plain rotary positions (no `rope_scaling` other than "default"), no MLP
biases (`mlp_bias` false), and for Qwen2 no per-layer sliding window (`use_sliding_window`
false). Llama's `attention_bias`, Qwen2's query/key/value biases, Mistral's `sliding_window` and
`tie_word_embeddings` are options the model holds. Every problem is listed at once; the folder is
not read further.

    llama.from_hf("ckpt/")   # E2006: num_key_value_heads=3 does not divide num_attention_heads=8
""",
):
    pass


class LlamaCheckpointError(
    ShapemlError,
    ValueError,
    code="E2007",
    title="a Llama-family checkpoint does not match its config",
    explanation="""
The tensors of a Llama, Qwen2 or Mistral checkpoint (`model.safetensors`, or the shards its
`model.safetensors.index.json` names) must be exactly the ones its `config.json` declares, by name
and shape: `model.embed_tokens.weight [V D]`; per layer `model.layers.<i>.self_attn.q_proj`
(`[H*Dh D]`), `k_proj` and `v_proj` (`[K*Dh D]`), `o_proj` (`[D H*Dh]`) with the biases the config
declares, `mlp.gate_proj`, `mlp.up_proj` (`[F D]`), `mlp.down_proj` (`[D F]`),
`input_layernorm` and `post_attention_layernorm` (`[D]`); `model.norm.weight [D]`; and
`lm_head.weight [V D]` unless the head is tied to the embeddings. Every missing, unexpected,
misshapen or non-float tensor is listed at once, with the dims the config gave; nothing is loaded.

    llama.from_hf("ckpt/")   # E2007: `model.layers.1.self_attn.k_proj.weight`: expected [64 256], got [256 256]

A checkpoint fine-tuned to other dims loads into a model of its own dims with
`from_hf(path, like=Llama.init(...), missing="keep", mismatched="overlap")`.
""",
):
    pass
