"""Fine-tuning a pretrained GPT-2 (Hugging Face format) on the text that ships with Python.

The corpus is `pydoc_data.topics` (the help texts of `help("topics")`; nothing is downloaded),
read byte by byte. GPT-2's first 256 token ids are its 256 single bytes (in the order of its
byte-to-unicode table), so each byte maps to the id GPT-2 itself gives it, and the model keeps only
those 256 rows of the token table, and a context of `--ctx` positions: a partial load,
`gpt2.from_hf(folder, like=GPT2.init(V=256, T=ctx, ...), missing="keep", mismatched="overlap")`,
loads every tensor, cuts `wte` to its first 256 rows and `wpe` to the context (or keeps new rows
of a longer one from the template), and reports what it did. Then AdamW with warmup + cosine,
the validation loss before and after, a greedy sample through the KV cache, and the fine-tuned
model written back with `to_hf` (a GPT-2 of 256 tokens that `transformers` loads).

Run:
    huggingface-cli download gpt2 --local-dir gpt2     # once (any GPT-2 checkpoint folder works)
    python examples/gpt2_finetune.py --pretrained gpt2 [--steps 300] [--ctx 128] [--out gpt2-pydoc]

Run as a script it first calls `sm.use_cpu_devices()`: each CPU core a JAX device, each batch split
over them by `TrainStep` (a transformer's step gains from it, docs/performance.md).

Without `--pretrained` a randomly initialized GPT-2 of `--width`/`--heads`/`--layers` stands in
(written by `to_hf`), so the script runs offline, but only learns what its steps can teach.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np

import shapeml as sm
from shapeml import optim, training
from shapeml.training import TrainStep
from shapeml.zoo import gpt2

# GPT-2's byte-to-unicode table lists the printable bytes first, then the others: token id `i`
# (i < 256) is the single byte `_GPT2_BYTES[i]`.
_PRINTABLE = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
_PRINTABLE += range(ord("®"), ord("ÿ") + 1)
_GPT2_BYTES = np.array(_PRINTABLE + [b for b in range(256) if b not in _PRINTABLE], np.int32)
BYTE_TO_ID = np.argsort(_GPT2_BYTES).astype(np.int32)  # byte value -> GPT-2 token id


def encode(text: str) -> np.ndarray:
    """GPT-2's token ids of the UTF-8 bytes of `text`."""
    return BYTE_TO_ID[np.frombuffer(text.encode(), np.uint8)]


def decode(ids) -> str:
    return bytes(_GPT2_BYTES[np.asarray(ids)].astype(np.uint8)).decode(errors="replace")


class Corpus:
    """`pydoc_data.topics` as GPT-2 byte tokens, split 90/10 into training and validation."""

    def __init__(self):
        from pydoc_data.topics import topics

        ids = encode("\n\n".join(topics[k] for k in sorted(topics)))
        cut = int(0.9 * len(ids))
        self.train, self.val = ids[:cut], ids[cut:]

    def batch(self, split: str, size: int, length: int, seed: int, step: int) -> np.ndarray:
        """`[size, length]` windows of one split, drawn from `(seed, step)`."""
        ids = self.train if split == "train" else self.val
        rng = np.random.default_rng([seed, step, split == "val"])
        starts = rng.integers(0, len(ids) - length, size)
        return np.stack([ids[s : s + length] for s in starts])


def stand_in(folder: Path, width: int, heads: int, layers: int, seed: int) -> Path:
    """A randomly initialized GPT-2 (GPT-2's vocabulary and context) in the Hugging Face format."""
    m = gpt2.GPT2.init(seed=seed, D=width, H=heads, L=layers)
    return gpt2.to_hf(m, folder)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pretrained", help="a GPT-2 checkpoint folder (config.json + safetensors)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--ctx", type=int, default=128, help="the fine-tuned model's context T")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--width", type=int, default=128, help="D of the stand-in (no --pretrained)")
    p.add_argument("--heads", type=int, default=4, help="H of the stand-in")
    p.add_argument("--layers", type=int, default=2, help="L of the stand-in")
    p.add_argument("--eval-batches", type=int, default=4, help="validation batches per estimate")
    p.add_argument("--sample", type=int, default=80, help="bytes to generate greedily (0: none)")
    p.add_argument("--out", help="write the fine-tuned model here with to_hf")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    from tqdm import tqdm

    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(args.pretrained) if args.pretrained else None
        if folder is None:
            folder = stand_in(Path(scratch) / "gpt2", args.width, args.heads, args.layers, 1)
            print(f"no --pretrained: a random GPT-2 (D={args.width}) stands in")
        config = json.loads((folder / "config.json").read_text())
        dims = gpt2.config_dims(config, str(folder / "config.json"))
        # The fine-tuned model: GPT-2's dims, but 256 byte tokens and a context of --ctx.
        template = gpt2.GPT2.init(seed=args.seed, **{**dims, "V": 256, "T": args.ctx})
        m, report = gpt2.from_hf(
            folder, like=template, missing="keep", mismatched="overlap", report=True
        )
    print(report)

    corpus = Corpus()
    length = args.ctx + 1  # `loss` predicts tokens 1.. from the ctx tokens before them

    def validate(model) -> float:
        batches = [
            corpus.batch("val", args.batch_size, length, 0, i) for i in range(args.eval_batches)
        ]
        # on the devices the model is placed on (the step's, after training), each batch split
        # over them as the step splits its own
        return float(np.mean([training.evaluate(gpt2.loss, model, b) for b in batches]))

    before = validate(m)
    print(f"validation loss before fine-tuning: {before:.3f}")
    warm = max(1, args.steps // 10)
    schedule = optim.warmup(warm, optim.cosine(args.lr, max(1, args.steps - warm)))
    opt = optim.adamw(m, lr=schedule, weight_decay=0.01, transforms=[optim.clip_norm(1.0)])
    train = TrainStep(gpt2.loss, m, opt)
    history: list[tuple[int, float]] = []
    start = time.perf_counter()
    bar = tqdm(range(args.steps), disable=args.no_progress)
    for s in bar:
        value = train(corpus.batch("train", args.batch_size, length, args.seed, s))
        history.append((s, float(value)))
        bar.set_postfix(train=f"{history[-1][1]:.3f}")
    bar.close()
    m = train.model
    after = validate(m)
    print(
        f"validation loss after {args.steps} steps: {after:.3f} ({time.perf_counter() - start:.0f} s)"
    )

    sample = ""
    if args.sample:
        prompt = "The "
        n = min(args.sample, args.ctx - len(prompt.encode()))
        out = gpt2.generate(m, jnp.asarray(encode(prompt))[None], n)  # greedy, KV cache
        sample = decode(out[0])
        print("sample:", sample, sep="\n")
    if args.out:
        print(f"written: {gpt2.to_hf(m, args.out)} (transformers loads it)")
    return {
        "model": m,
        "report": report,
        "history": history,
        "val_before": before,
        "val_after": after,
        "sample": sample,
    }


if __name__ == "__main__":
    sm.use_cpu_devices()  # first, before JAX starts: every core a device
    main()
