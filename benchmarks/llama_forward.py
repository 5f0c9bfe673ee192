"""Llama-family forward, shapeml vs `transformers`, on CPU: the logits of a batch of 8 x 128
tokens.

The model is a 4-layer, 256-wide Llama with grouped-query attention (8 query heads, 4 key/value
heads), a SwiGLU width of 688 and a 32000-token vocabulary (Llama 2's). `transformers` builds it
with random weights and writes it with `save_pretrained`; shapeml reads that folder with
`llama.from_hf`, so both run the same weights, and their logits must agree within 1e-4 before
anything is timed.

Contenders, measured in one run, in interleaved rounds (median per call):
  shapeml       `jax.jit(llama.forward)`;
  transformers  `LlamaForCausalLM` in eval mode under `torch.no_grad()`, PyTorch eager (its
                default attention, SDPA).
Needs `pip install -e '.[hf]'` (torch 2.13.0 CPU and transformers).
Run: python benchmarks/llama_forward.py [--quick]
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch's idle threads must not spin
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is local

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from shapeml.zoo import llama  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from _timing import interleaved  # noqa: E402

CONFIG = dict(
    vocab_size=32000,
    hidden_size=256,
    intermediate_size=688,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=512,
    bos_token_id=None,
    eos_token_id=None,
)
BATCH, LENGTH = 8, 128


def main() -> None:
    quick = "--quick" in sys.argv
    import torch
    import transformers

    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        m = llama.from_hf(folder)
    tokens = np.random.default_rng(0).integers(0, CONFIG["vocab_size"], (BATCH, LENGTH))
    ours, theirs = jnp.asarray(tokens), torch.from_numpy(tokens)
    forward = jax.jit(llama.forward)

    def hf_forward():
        with torch.no_grad():
            return hf(theirs).logits

    gap = float(np.abs(np.asarray(forward(m, ours)) - hf_forward().numpy()).max())
    print(f"max |logits difference| = {gap:.2e}")
    assert gap < 1e-4, "the two forwards disagree"
    times = interleaved(
        {"shapeml": lambda: forward(m, ours), "transformers": hf_forward},
        rounds=3 if quick else 9,
        number=2,
    )
    print(", ".join(f"{k} {v / 1e3:,.1f} ms" for k, v in times.items()))
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, jax {jax.__version__}"
    )
    ratio = times["shapeml"] / times["transformers"]
    print(f"llama_forward_vs_hf: ratio={ratio:.3f} (budget 1.0)")


if __name__ == "__main__":
    main()
