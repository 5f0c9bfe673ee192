"""A character-level GPT of `shapeml.nn` blocks, trained on the text that ships with Python.

The corpus is `pydoc_data.topics` (the help texts of `help("topics")`, about 465k characters;
nothing is downloaded), split 90/10 into training and validation text. Pre-norm decoder blocks
(LayerNorm, causal rotary attention, GELU MLP), a head tied to the embedding, AdamW with warmup +
cosine and clipping. Shows a tqdm bar with the training and validation loss at every step, saves
a checkpoint that `--resume` continues exactly, and samples text with the KV-cache decode.

It runs the fast path by default: the blocks run by `nn.scan` (a Python loop over a tuple of
blocks, the simplest to read; `--scan` stores them stacked and runs one `lax.scan`, compiled once
whatever the depth and at 4-6 blocks no slower per step, see docs/performance.md), the fused
`nn.cross_entropy`, and each batch split over every CPU core: run as a script, it first calls
`sm.use_cpu_devices()` (each core a JAX device), and `TrainStep` splits each batch over the
process's devices.
`--remat full` and `--precision bfloat16` trade compute for memory.

Run: python examples/char_gpt.py [--steps 500] [--checkpoint char_gpt.safetensors] [--resume]
"""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Float, Int

import shapeml as sm
from shapeml import nn, optim
from shapeml.state import KVCache
from shapeml.training import TrainStep


class Block(sm.Model):
    """`x + attn(ln1(x))`, then `x + mlp(ln2(x))`: the dims D, H, T are the GPT's."""

    dims = sm.Dims(D=128, H=4, T=128)
    ln1: nn.LayerNorm = sm.submodel(nn.LayerNorm)
    attn: nn.MultiHeadAttention = sm.submodel(
        nn.MultiHeadAttention, causal=True, positions="rotary"
    )
    ln2: nn.LayerNorm = sm.submodel(nn.LayerNorm)
    mlp: nn.MLP = sm.submodel(nn.MLP, F="4 * D")


class GPT(sm.Model):
    """`V` characters, `L` blocks of width `D` with `H` heads, context `T`. The blocks are a tuple
    unless `scan=True`, which stores them stacked (one `Block` whose tensors have a leading `L`):
    `nn.scan` then compiles one block for all `L`. Checkpoints name them `blocks.0.*`,
    `blocks.1.*` either way."""

    dims = sm.Dims(V=96, D=128, H=4, T=128, L=4)
    emb: nn.Embedding = sm.submodel(nn.Embedding)
    blocks: Block | tuple[Block, ...] = sm.submodels(Block, "L", stacked="scan")
    ln_f: nn.LayerNorm = sm.submodel(nn.LayerNorm)
    scan: bool = sm.static(default=False)


def block(blk: Block, x: Float[Array, "b t D"]) -> Float[Array, "b t D"]:
    """One pre-norm block: `x + attn(ln1(x))`, then `x + mlp(ln2(x))`."""
    x = x + blk.attn(blk.ln1(x))
    return x + blk.mlp(blk.ln2(x))


@sm.shaped
def forward(m: GPT, tokens: Int[Array, "b t"]) -> Float[Array, "b t V"]:
    """Next-character logits at every position (position `i` sees `0..i`)."""
    x = nn.scan(block, m.blocks, m.emb(tokens))  # a loop, or a `lax.scan` over stacked blocks
    return m.emb.logits(m.ln_f(x))


@sm.shaped
def loss(m: GPT, tokens: Int[Array, "b t"]) -> Float[Array, ""]:
    """Mean cross-entropy of `tokens[:, 1:]` given the characters before them."""
    return nn.cross_entropy(forward(m, tokens[:, :-1]), tokens[:, 1:])


def step(m: GPT, cache: KVCache, tokens, pos) -> tuple[jax.Array, KVCache]:
    """`n` new characters at positions `pos ..` against the cache: a prefill or a decode step."""
    x = m.emb(tokens)
    for layer, blk in enumerate(nn.unstack(m.blocks)):
        a, cache = blk.attn.step(blk.ln1(x), cache, layer, pos)
        x = x + a
        x = x + blk.mlp(blk.ln2(x))
    return m.emb.logits(m.ln_f(x)), cache


@functools.partial(jax.jit, static_argnames="steps")
def generate(m: GPT, prompt: Int[Array, " n"], steps: int, key, temperature: float = 0.8):
    """`steps` characters sampled after `prompt`, the whole loop in one compiled call."""
    n = prompt.shape[0]
    if n + steps > m.dims.T:  # the model was trained on windows of T characters
        raise sm.ArgumentError(
            f"a prompt of {n} characters and {steps} more exceed the context T={m.dims.T}",
            fix=f"sample at most {m.dims.T - n} characters",
        )
    cache = nn.unstack(m.blocks)[0].attn.new_cache(layers=m.dims.L, batch=1)
    logits, cache = step(m, cache, prompt[None], 0)

    def body(i, carry):
        cache, last, out = carry
        tok = jax.random.categorical(jax.random.fold_in(key, i), last / temperature)
        logits, cache = step(m, cache, tok.astype(jnp.int32)[None, None], n + i)
        return cache, logits[0, -1], out.at[i].set(tok)

    out = jnp.zeros(steps, jnp.int32)
    return lax.fori_loop(0, steps, body, (cache, logits[0, -1], out))[2]


class Corpus:
    """`pydoc_data.topics` as one text, its characters as the vocabulary, split 90/10."""

    def __init__(self):
        from pydoc_data.topics import topics

        text = "\n\n".join(topics[k] for k in sorted(topics))
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}
        ids = np.array([self.index[c] for c in text], np.int32)
        cut = int(0.9 * len(ids))
        self.train, self.val = ids[:cut], ids[cut:]

    def batch(self, split: str, size: int, length: int, seed: int, step: int) -> np.ndarray:
        """`[size, length]` windows of one split, drawn from `(seed, step)`: a resumed run sees
        the same batches as an uninterrupted one."""
        ids = self.train if split == "train" else self.val
        rng = np.random.default_rng([seed, step, split == "val"])
        starts = rng.integers(0, len(ids) - length, size)
        return np.stack([ids[s : s + length] for s in starts])

    def encode(self, text: str) -> np.ndarray:
        return np.array([self.index[c] for c in text], np.int32)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--ctx", type=int, default=128, help="context T")
    p.add_argument("--width", type=int, default=128, help="D")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", default="char_gpt.safetensors")
    p.add_argument("--checkpoint-every", type=int, default=200)
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    p.add_argument("--until", type=int, help="stop after this step (the schedule spans --steps)")
    p.add_argument("--sample", type=int, default=120, help="characters to generate (0: none)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--scan", action="store_true", help="store the blocks stacked: lax.scan")
    p.add_argument("--remat", default=None, help='e.g. "full": recompute blocks in the backward')
    p.add_argument("--precision", default=None, help='"bfloat16" or "float16" compute')
    p.add_argument("--devices", type=int, default=None, help="1: one device (default: all)")
    args = p.parse_args(argv)
    from tqdm import tqdm

    corpus = Corpus()
    dims = dict(V=len(corpus.chars), D=args.width, H=args.heads, T=args.ctx, L=args.layers)
    m = GPT.init(seed=args.seed, scan=args.scan, **dims)
    warm = max(1, args.steps // 20)
    schedule = optim.warmup(warm, optim.cosine(args.lr, max(1, args.steps - warm)))
    opt = optim.adamw(
        m, lr=schedule, weight_decay=0.1, transforms=[optim.clip_norm(1.0)], skip_nonfinite=False
    )
    ckpt = Path(args.checkpoint)
    if args.resume and ckpt.exists():
        m, opt = sm.load_checkpoint(ckpt, GPT, like=opt)
        print(f"resumed from {ckpt} at step {int(opt.step)}")
    fast = dict(devices=args.devices, precision=args.precision, remat=args.remat)
    train = TrainStep(loss, m, opt, **fast)
    first = int(opt.step)
    history: list[tuple[int, float, float]] = []
    start = time.perf_counter()
    last = args.steps if args.until is None else min(args.until, args.steps)
    bar = tqdm(range(first, last), initial=first, total=args.steps, disable=args.no_progress)
    for s in bar:
        value = train(corpus.batch("train", args.batch_size, args.ctx + 1, args.seed, s))
        # on the step's devices, the batch split as the step's (never replicated on each)
        val = train.evaluate(corpus.batch("val", args.batch_size, args.ctx + 1, 0, s))
        history.append((s, float(value), float(val)))
        bar.set_postfix(train=f"{history[-1][1]:.3f}", val=f"{history[-1][2]:.3f}")
        if (s + 1) % args.checkpoint_every == 0 or s + 1 == last:
            sm.save_checkpoint(ckpt, train.model, train.opt)
    bar.close()
    m = train.model
    if history:
        took = time.perf_counter() - start
        print(f"steps {first}..{last}: val loss {history[-1][2]:.3f} ({took:.0f} s)")
    sample = ""
    if args.sample:
        prompt = "The "
        key = jax.random.key(args.seed)
        out = generate(m, jnp.asarray(corpus.encode(prompt)), args.sample, key)
        sample = prompt + corpus.decode(np.asarray(out))
        print("sample:", sample, sep="\n")
    return {"model": m, "history": history, "sample": sample, "checkpoint": ckpt}


if __name__ == "__main__":
    sm.use_cpu_devices()  # first, before JAX starts: every core a device (docs/performance.md)
    main()
