"""The errors of GPT-2's Hugging Face checkpoints (codes E2004, E2005), each with its long form."""

from __future__ import annotations

from ..._errors import ShapemlError

__all__ = ["HFCheckpointError", "HFConfigError"]


class HFConfigError(
    ShapemlError,
    ValueError,
    code="E2004",
    title="a Hugging Face config.json that is not a GPT-2 shapeml can hold",
    explanation="""
`gpt2.from_hf` reads the checkpoint folder's `config.json` for the model's dims: `vocab_size` (V),
`n_positions` (T), `n_embd` (D), `n_head` (H), `n_layer` (L) and `n_inner` (F, null for 4 * D).
Each must be a whole number >= 1 with `n_head` dividing `n_embd`, `model_type` must be "gpt2",
and the options must be the ones shapeml's GPT-2 computes: a tanh GELU (`activation_function`
"gelu_new", "gelu_pytorch_tanh" or "gelu_fast"), `layer_norm_epsilon` 1e-5, scaled attention
(`scale_attn_weights` true, `scale_attn_by_inverse_layer_idx` false), no cross-attention and a
head tied to the token table (`tie_word_embeddings` true). Every problem is listed at once; the
folder is not read further.

    gpt2.from_hf("gpt2/")        # E2004: config.json has n_head=5, which does not divide 768

A config of another architecture (`model_type` "llama") needs a model of its own.
""",
):
    pass


class HFCheckpointError(
    ShapemlError,
    ValueError,
    code="E2005",
    title="a Hugging Face checkpoint does not match its config",
    explanation="""
The tensors of a GPT-2 checkpoint (`model.safetensors`, or the shards its
`model.safetensors.index.json` names) must be exactly the ones its `config.json` declares, by name
and shape: `wte.weight [V D]`, `wpe.weight [T D]`, per block `h.<i>.ln_1`, `attn.c_attn`
(`[D 3*D]`: queries, keys and values side by side), `attn.c_proj`, `ln_2`, `mlp.c_fc`, `mlp.c_proj`
(weights stored `[in out]`, GPT-2's Conv1D layout, which is `nn.Linear`'s), and `ln_f`, all with
or without the `transformer.` prefix. Every missing, unexpected, misshapen or non-float tensor
is listed at once, with the dims the config gave; nothing is loaded.

Old checkpoints' attention-mask buffers (`attn.bias`, `attn.masked_bias`) are skipped, and a
`lm_head.weight` must equal `wte.weight` (the head is tied). Half-precision tensors are loaded
as float32.

    gpt2.from_hf("ckpt/")   # E2005: missing `transformer.h.1.mlp.c_fc.weight` [768 3072]

A checkpoint fine-tuned to another vocabulary or context loads into a model of its dims with
`from_hf(path, like=GPT2.init(...), missing="keep", mismatched="overlap")`.
""",
):
    pass
