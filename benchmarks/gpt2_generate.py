"""GPT-2 greedy generation, shapeml vs `transformers`' `generate`, on CPU: 64 new tokens after a
32-token prompt, at batch 1 and batch 8.

The models are GPT-2s with GPT-2's vocabulary (50257) and context (1024): the 2-layer, 128-wide
one `benchmarks/gpt2_forward.py` times, and a 6-layer, 384-wide one. `transformers` builds each
with random weights (std 0.1, so greedy decoding wanders rather than repeating one token) and
writes it with `save_pretrained`; shapeml reads that folder with `gpt2.from_hf`, so both run the
same weights, and the tokens must be equal before anything is timed.

Contenders, measured in one run, in interleaved rounds (median per call):
  shapeml       `gpt2.generate(m, prompt, 64)`: prefill and the whole token loop through the KV
                cache in one compiled call (compiled once per prompt shape and length);
  transformers  `GPT2LMHeadModel.generate(prompt, max_new_tokens=64, min_new_tokens=64,
                do_sample=False)` in eval mode under `torch.no_grad()` (its KV cache, PyTorch
                eager), at PyTorch's default threading and at one thread (the faster counts:
                on a busy machine one thread can win).
The ratio is shapeml's time over the faster transformers', the worst over batch sizes and models.
Needs `pip install -e '.[hf]'` (torch 2.13.0 CPU and transformers).
Run: python benchmarks/gpt2_generate.py [--quick]
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is local

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from shapeml.zoo import gpt2  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from _timing import interleaved  # noqa: E402

CONFIGS = {
    "L2 D128": {"vocab_size": 50257, "n_positions": 1024, "n_embd": 128, "n_head": 4, "n_layer": 2},
    "L6 D384": {"vocab_size": 50257, "n_positions": 1024, "n_embd": 384, "n_head": 6, "n_layer": 6},
}
PROMPT, NEW = 32, 64
BATCHES = (1, 8)


def measure(name: str, hf, m, batch: int, quick: bool) -> float:
    """Checks the tokens equal, times both, prints the figures; returns shapeml's time over the
    faster transformers (at PyTorch's default threading, or one thread)."""
    import torch

    vocab = m.dims.V
    prompt = np.random.default_rng(batch).integers(0, vocab, (batch, PROMPT))
    ours, theirs = jnp.asarray(prompt), torch.from_numpy(prompt)
    attention = torch.ones_like(theirs)
    threads = torch.get_num_threads()

    def hf_generate(n=threads):
        torch.set_num_threads(n)
        with torch.no_grad():
            return hf.generate(
                theirs,
                attention_mask=attention,
                max_new_tokens=NEW,
                min_new_tokens=NEW,
                do_sample=False,
                pad_token_id=0,
            )

    def sm_generate():
        return gpt2.generate(m, ours, NEW)

    got, want = np.asarray(sm_generate()), hf_generate().numpy()
    assert got.shape == want.shape == (batch, PROMPT + NEW)
    assert np.array_equal(got, want), f"{name} batch {batch}: the tokens differ"
    assert len(set(got[0, PROMPT:].tolist())) > 3  # a wandering sequence, not one token
    fns = {"shapeml": sm_generate, "transformers": hf_generate}
    if threads > 1:
        fns["transformers 1 thread"] = lambda: hf_generate(1)
    times = interleaved(fns, rounds=3 if quick else 5, number=1)
    torch.set_num_threads(threads)
    best = min((k for k in times if k != "shapeml"), key=times.get)
    ratio = times["shapeml"] / times[best]
    shown = ", ".join(
        f"{k} {v / 1e3:,.1f} ms ({NEW * batch / v * 1e6:,.0f} tokens/s)" for k, v in times.items()
    )
    print(f"{name} batch {batch}: tokens equal; {shown}; ratio {ratio:.3f}")
    return ratio


def main() -> None:
    quick = "--quick" in sys.argv
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    ratios = {}
    for name, config in CONFIGS.items():
        torch.manual_seed(0)
        hf = transformers.GPT2LMHeadModel(
            transformers.GPT2Config(
                **config, initializer_range=0.1, bos_token_id=None, eos_token_id=None
            )
        ).eval()
        with tempfile.TemporaryDirectory() as folder:
            hf.save_pretrained(folder)
            m = gpt2.from_hf(folder)
        for batch in BATCHES:
            ratios[(name, batch)] = measure(name, hf, m, batch, quick)
    print(
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"transformers {transformers.__version__}, jax {jax.__version__}"
    )
    worst = max(ratios, key=ratios.get)
    print(f"worst: {worst[0]} batch {worst[1]}")
    print(f"gpt2_generate_vs_hf: ratio={ratios[worst]:.3f} (budget 1.0)")


if __name__ == "__main__":
    main()
