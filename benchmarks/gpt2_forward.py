"""GPT-2 forward, shapeml vs `transformers`, on CPU: the logits of a batch of 8 x 128 tokens.

The model is the 2-layer, 128-wide GPT-2 with GPT-2's vocabulary (50257) and context (1024) that
`tests/test_gpt2_hf.py` checks. `transformers` builds it with random weights and writes it with
`save_pretrained`; shapeml reads that folder with `gpt2.from_hf`, so both run the same weights,
and their logits must agree within 1e-4 before anything is timed.

Contenders, measured in one run, in interleaved rounds (median per call):
  shapeml       `jax.jit(gpt2.forward)`;
  transformers  `GPT2LMHeadModel` in eval mode under `torch.no_grad()`, PyTorch eager (its
                default attention, SDPA).
Needs `pip install -e '.[hf]'` (torch 2.13.0 CPU and transformers).
Run: python benchmarks/gpt2_forward.py [--quick]
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

from shapeml.zoo import gpt2  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from _timing import interleaved  # noqa: E402

CONFIG = {"vocab_size": 50257, "n_positions": 1024, "n_embd": 128, "n_head": 4, "n_layer": 2}
BATCH, LENGTH = 8, 128


def main() -> None:
    quick = "--quick" in sys.argv
    import torch
    import transformers

    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(**CONFIG, bos_token_id=None, eos_token_id=None)
    ).eval()
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        m = gpt2.from_hf(folder)
    tokens = np.random.default_rng(0).integers(0, CONFIG["vocab_size"], (BATCH, LENGTH))
    ours, theirs = jnp.asarray(tokens), torch.from_numpy(tokens)
    forward = jax.jit(gpt2.forward)

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
    print(f"gpt2_forward_vs_hf: ratio={ratio:.3f} (budget < 1.0)")


if __name__ == "__main__":
    main()
