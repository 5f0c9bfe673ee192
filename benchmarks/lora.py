"""LoRA on a Llama, on CPU: the hoisted LoRA forward against the hand-merged model, and the LoRA
training step against `transformers` + `peft`.

The model is a 4-layer, 256-wide Llama with grouped-query attention (8 query heads, 4 key/value
heads), a SwiGLU width of 688 and an 8192-token vocabulary, built by `transformers` with random
weights and written with `save_pretrained`; shapeml reads it with `llama.from_hf`. Adapters of
rank 8 (alpha 16) go on the query and value projections (`peft`'s default for Llama), batch
8 x 128 tokens.

1. `lora_hoisted_vs_merged`: `sm.hoist(llama.forward)` on the LoRA model (each merged weight
   computed once per weights) against `jax.jit(llama.forward)` on `lora.merge(m)`, whose logits
   must agree within 1e-5 first. Budget 1.05. (Hoisting also takes the rotary tables and the
   head's transpose out of the per-call path, so an info line compares with the merged model
   hoisted too.)
2. `lora_step_vs_peft`: shapeml's `TrainStep(llama.loss, m, optim.adamw(...))` against the same
   step in PyTorch: `peft.get_peft_model` on the `LlamaForCausalLM`, `torch.optim.AdamW` over the
   adapters, `loss.backward()`, eager and `torch.compile` (the faster counts). Both start from
   the same adapters (peft's `lora_A`/`lora_B` copied in) and the same AdamW settings; their
   loss trajectories over 6 steps must agree (within 1e-4) before anything is timed. Budget 1.0.

Contenders are measured in one run, in interleaved rounds (median per call); the ratio printed
last is `lora_step_vs_peft`. Needs `pip install -e '.[hf]'` (torch, transformers, peft).
Run: python benchmarks/lora.py [--quick]
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch's idle threads must not spin
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is local

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import shapeml as sm  # noqa: E402
from shapeml import lora, optim  # noqa: E402
from shapeml.training import TrainStep  # noqa: E402
from shapeml.zoo import llama  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from _timing import interleaved  # noqa: E402

CONFIG = dict(
    vocab_size=8192,
    hidden_size=256,
    intermediate_size=688,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=512,
    bos_token_id=None,
    eos_token_id=None,
)
BATCH, LENGTH, RANK, ALPHA, LR = 8, 128, 8, 16.0, 1e-3
TARGETS = {"attn.q": "self_attn.q_proj", "attn.v": "self_attn.v_proj"}
TRAJECTORY = 6


def _peft_name(layer: str, ab: str) -> str:
    parts = layer.split(".")
    return f"base_model.model.model.layers.{parts[1]}.{TARGETS['.'.join(parts[2:])]}.lora_{ab}.default.weight"


def _copy_adapters(ours, theirs):
    """`ours` with every adapter set to peft's (`lora_a = lora_A.T`, `lora_b = lora_B.T`)."""
    state = dict(theirs.named_parameters())
    layers = lora.adapters(ours)

    def where(m):
        found = lora.adapters(m)
        return [getattr(found[n], f"lora_{ab}") for n in layers for ab in "ab"]

    values = [
        jnp.asarray(state[_peft_name(n, ab.upper())].detach().numpy().T.copy())
        for n in layers
        for ab in "ab"
    ]
    return eqx.tree_at(where, ours, values)


def main() -> None:
    quick = "--quick" in sys.argv
    import peft
    import torch
    import transformers

    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG))
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        base = llama.from_hf(folder)
    tokens = np.random.default_rng(0).integers(0, CONFIG["vocab_size"], (BATCH, LENGTH))
    ours_x, theirs_x = jnp.asarray(tokens), torch.from_numpy(tokens)

    # 1. the hoisted LoRA forward against the hand-merged model
    m = lora.apply(base, [f"*.{t}" for t in TARGETS], rank=RANK, alpha=ALPHA)
    keys = iter(jax.random.split(jax.random.key(1), 64))
    layers = lora.adapters(m)
    trained = eqx.tree_at(
        lambda t: [lora.adapters(t)[n].lora_b for n in layers],
        m,
        [0.05 * jax.random.normal(next(keys), layers[n].lora_b.shape) for n in layers],
    )
    merged = lora.merge(trained)
    hoisted = sm.hoist(llama.forward)
    plain = jax.jit(llama.forward)
    gap = float(
        np.abs(np.asarray(hoisted(trained, ours_x)) - np.asarray(plain(merged, ours_x))).max()
    )
    print(f"hoisted LoRA vs merged: max |logits difference| = {gap:.2e}")
    assert gap < 1e-5, "the hoisted LoRA forward and the merged model disagree"
    hoisted_merged = sm.hoist(llama.forward)  # for reference: the merged model, hoisted too
    times = interleaved(
        {
            "hoisted": lambda: hoisted(trained, ours_x),
            "merged": lambda: plain(merged, ours_x),
            "merged, hoisted": lambda: hoisted_merged(merged, ours_x),
        },
        rounds=3 if quick else 9,
        number=2,
    )
    print(", ".join(f"{k} {v / 1e3:,.1f} ms" for k, v in times.items()))
    print(
        f"(hoisted LoRA vs the merged model hoisted: {times['hoisted'] / times['merged, hoisted']:.3f})"
    )
    print(f"lora_hoisted_vs_merged: ratio={times['hoisted'] / times['merged']:.3f} (budget 1.05)")

    # 2. the LoRA training step against transformers + peft
    config = peft.LoraConfig(
        r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=list(TARGETS.values())
    )
    with warnings.catch_warnings():  # peft reads a property transformers 5 deprecates
        warnings.simplefilter("ignore", FutureWarning)
        theirs = peft.get_peft_model(hf, config).train()
    with torch.no_grad():  # a trained-looking start, so the trajectory moves every weight
        for name, p in theirs.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.02)
    ours = _copy_adapters(m, theirs)
    settings = dict(b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0)
    step = TrainStep(llama.loss, ours, optim.adamw(ours, lr=LR, **settings))
    trainable = [p for p in theirs.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)

    def torch_step(model):
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=theirs_x, labels=theirs_x).loss
        loss.backward()
        opt.step()
        return loss.detach()

    snapshot = {k: v.detach().clone() for k, v in theirs.named_parameters() if v.requires_grad}
    ours_losses = [float(step(ours_x)) for _ in range(TRAJECTORY)]
    theirs_losses = [float(torch_step(theirs)) for _ in range(TRAJECTORY)]
    print("loss trajectory, shapeml:", " ".join(f"{v:.5f}" for v in ours_losses))
    print("loss trajectory, peft:   ", " ".join(f"{v:.5f}" for v in theirs_losses))
    assert np.allclose(ours_losses, theirs_losses, rtol=0, atol=1e-4), "trajectories differ"
    assert ours_losses[-1] < ours_losses[0]
    with torch.no_grad():  # both contenders time from the same start
        for k, v in theirs.named_parameters():
            if k in snapshot:
                v.copy_(snapshot[k])
    compiled = torch.compile(theirs)
    contenders = {
        "shapeml": lambda: step(ours_x),
        "peft eager": lambda: torch_step(theirs),
        "peft compile": lambda: torch_step(compiled),
    }
    times = interleaved(contenders, rounds=3 if quick else 7, number=2)
    print(", ".join(f"{k} {v / 1e3:,.1f} ms" for k, v in times.items()))
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"peft {peft.__version__}, jax {jax.__version__}"
    )
    best = min(times["peft eager"], times["peft compile"])
    print(f"lora_step_vs_peft: ratio={times['shapeml'] / best:.3f} (budget 1.0)")


if __name__ == "__main__":
    main()
