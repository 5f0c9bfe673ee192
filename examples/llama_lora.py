"""LoRA fine-tuning of a Llama-architecture model (Hugging Face format) on the text that ships with
Python.

The corpus is `pydoc_data.topics` (the help texts of `help("topics")`; nothing is downloaded).
Without `--pretrained`, `transformers` builds a small Llama from a config (a byte vocabulary of
256 tokens, grouped-query attention) and saves it offline with `save_pretrained`, as a released
checkpoint would be; with `--pretrained FOLDER` (e.g. SmolLM2-135M) its own `tokenizer.json`
encodes the text. Then:

1. `llama.from_hf` reads the checkpoint;
2. `lora.apply` puts rank-`--rank` adapters on the Linears `--targets` names and freezes every
   other weight: the optimizer and `TrainStep` see the adapters only;
3. AdamW trains them (the loss falls; the validation loss before and after is printed);
4. `lora.save` writes the adapters alone (a small file), `lora.load` puts them back on the base;
5. `lora.merge` folds them into a plain model, which generates greedily through the KV cache
   and, with `--out`, is written back with `llama.to_hf` (a checkpoint `transformers` loads).

Run as a script it first calls `sm.use_cpu_devices()`: each CPU core a JAX device, each batch split
over them by `TrainStep`.

Run:
    python examples/llama_lora.py [--steps 200] [--rank 8] [--out llama-pydoc]
    huggingface-cli download HuggingFaceTB/SmolLM2-135M --local-dir smol   # optional
    python examples/llama_lora.py --pretrained smol --steps 100
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import shapeml as sm
from shapeml import lora, optim
from shapeml.training import TrainStep
from shapeml.zoo import llama


def stand_in(folder: Path, width: int, layers: int, seed: int) -> Path:
    """A small random Llama over 256 byte tokens, built and saved by `transformers` (offline)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=width,
        intermediate_size=int(width * 8 / 3) // 8 * 8,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=None,
        eos_token_id=None,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


class Corpus:
    """`pydoc_data.topics` as token ids, split 90/10 into training and validation."""

    def __init__(self, encode):
        from pydoc_data.topics import topics

        ids = np.asarray(encode("\n\n".join(topics[k] for k in sorted(topics))), np.int32)
        cut = int(0.9 * len(ids))
        self.train, self.val = ids[:cut], ids[cut:]

    def batch(self, split: str, size: int, length: int, seed: int, step: int) -> np.ndarray:
        """`[size, length]` windows of one split, drawn from `(seed, step)`."""
        ids = self.train if split == "train" else self.val
        rng = np.random.default_rng([seed, step, split == "val"])
        starts = rng.integers(0, len(ids) - length, size)
        return np.stack([ids[s : s + length] for s in starts])


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pretrained", help="a Llama/Qwen2/Mistral folder with tokenizer.json")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--ctx", type=int, default=128, help="tokens per training window")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=float, default=16.0)
    p.add_argument("--targets", default="*.attn.*,*.mlp.*", help="comma-separated patterns")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--width", type=int, default=128, help="D of the stand-in (no --pretrained)")
    p.add_argument("--layers", type=int, default=2, help="L of the stand-in")
    p.add_argument("--eval-batches", type=int, default=4, help="validation batches per estimate")
    p.add_argument("--sample", type=int, default=60, help="tokens to generate greedily (0: none)")
    p.add_argument("--out", help="write the merged model here with llama.to_hf")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory() as scratch:
        if args.pretrained:
            folder = Path(args.pretrained)
            tok = llama.load_tokenizer(folder)
            encode, decode = (lambda s: tok.encode(s).ids), (lambda ids: tok.decode(list(ids)))
        else:
            folder = stand_in(Path(scratch) / "llama", args.width, args.layers, 1)
            print(f"no --pretrained: a random Llama (D={args.width}) over bytes stands in")
            encode = lambda s: list(s.encode())  # noqa: E731
            decode = lambda ids: bytes(int(i) for i in ids).decode(errors="replace")  # noqa: E731
        base = llama.from_hf(folder)
        adapters_file = Path(scratch) / "adapters.safetensors"

        m = lora.apply(
            base, args.targets.split(","), rank=args.rank, alpha=args.alpha, seed=args.seed
        )
        print(
            f"{len(lora.adapters(m))} adapters: {sm.count_params(m):,} trained numbers, "
            f"{sum(int(a.size) for a in sm.buffers(m).values()):,} frozen"
        )
        corpus = Corpus(encode)
        length = args.ctx + 1  # `loss` predicts tokens 1.. from the ctx tokens before them
        val_loss = jax.jit(llama.loss)

        def validate(model) -> float:
            batches = [
                corpus.batch("val", args.batch_size, length, 0, i) for i in range(args.eval_batches)
            ]
            return float(np.mean([val_loss(model, jnp.asarray(b)) for b in batches]))

        before = validate(m)
        print(f"validation loss before: {before:.3f}")
        warm = max(1, args.steps // 10)
        schedule = optim.warmup(warm, optim.cosine(args.lr, max(1, args.steps - warm)))
        train = TrainStep(llama.loss, m, optim.adamw(m, lr=schedule, weight_decay=0.0))
        history: list[tuple[int, float]] = []
        start = time.perf_counter()
        for s in range(args.steps):
            value = float(train(corpus.batch("train", args.batch_size, length, args.seed, s)))
            history.append((s, value))
            if s % max(1, args.steps // 10) == 0 or s == args.steps - 1:
                print(f"step {s:4d}  loss {value:.3f}")
        m = train.model
        after = validate(m)
        print(f"validation loss after {args.steps} steps: {after:.3f}", end=" ")
        print(f"({time.perf_counter() - start:.0f} s)")

        lora.save(adapters_file, m)
        print(f"adapters: {adapters_file.stat().st_size / 1024:.0f} KiB")
        m = lora.load(adapters_file, base)  # the same adapters, back on the base
        merged = lora.merge(m)

    sample = ""
    if args.sample:
        prompt = jnp.asarray([encode("The ")], jnp.int32)
        n = min(args.sample, merged.dims.T - prompt.shape[1])
        out = llama.generate(merged, prompt, n)  # greedy, through the KV cache
        sample = decode(np.asarray(out[0]))
        print("sample:", sample, sep="\n")
    if args.out:
        print(f"written: {llama.to_hf(merged, args.out)} (transformers loads it)")
    return {
        "model": m,
        "merged": merged,
        "history": history,
        "val_before": before,
        "val_after": after,
        "sample": sample,
    }


if __name__ == "__main__":
    sm.use_cpu_devices()  # first, before JAX starts: every core a device (docs/performance.md)
    main()
