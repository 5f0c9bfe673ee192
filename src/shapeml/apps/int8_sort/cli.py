"""`shapeml int8 ...`: train and export the tiny model, generate text with a model file, check one.

The lead's `shapeml` parser calls `add_parser(subparsers)`; `main(argv)` runs the same commands
on their own (`scripts/train_tiny_transformer.py` uses it). Every flag is checked when parsed, and
paths and flag combinations before any work (`.._flags`): a usage mistake is one coded line and
exit status 2, a failure (a bad model file, a prompt the model cannot encode) one coded line and 1.
"""

from __future__ import annotations

import argparse
import sys
import time

from .._flags import (
    CommandParser,
    UsageError,
    count,
    input_file,
    output_file,
    positive_real,
    run_guarded,
)

__all__ = ["add_parser", "main"]

_MAX_DIM = 8192  # the int8 file's caps on d, heads, d_ff and ctx (docs/int8.md)
_MAX_BATCH = 65536


def _train(args: argparse.Namespace) -> int:
    from .shipped import TINY_FLOAT_PATH, TINY_MODEL_PATH
    from .train import TrainConfig, train_int8

    if args.d % args.heads:
        raise UsageError(
            f"--heads {args.heads} does not divide --d {args.d}",
            fix="pick heads so that d / heads is a whole number (the head width)",
        )
    out = args.out or str(TINY_MODEL_PATH)
    float_out = (
        args.float_out
        if args.float_out is not None
        else (str(TINY_FLOAT_PATH) if args.out is None else None)
    )
    # The outputs as they will be written, defaults included (the shipped files live in the
    # installed package, which may be read-only), before any work.
    output_file(out, "--out" if args.out else "--out (default: the shipped model)")
    output_file(float_out or None, "--float-out" if args.float_out else "--float-out (default)")
    cfg = TrainConfig(
        d=args.d,
        heads=args.heads,
        d_ff=args.d_ff,
        ctx=args.ctx,
        steps=args.steps,
        batch=args.batch,
        lr=args.lr,
        seed=args.seed,
    )
    t0 = time.perf_counter()
    q, _ = train_int8(cfg, out=out, float_out=float_out or None, log=print)
    print(
        f"wrote {out}"
        + (f" and {float_out}" if float_out else "")
        + f" in {time.perf_counter() - t0:.1f} s"
    )
    return 0


def _generate(args: argparse.Namespace) -> int:
    import jax

    from ..._jax_internals import backend_started
    from ...int8 import Int8Model
    from ...sharding import use_cpu_devices
    from .shipped import TINY_MODEL_PATH

    if args.tp is not None and args.tp > 1 and not backend_started():
        use_cpu_devices(args.tp)  # on CPU, the tensor-parallel devices; made before JAX starts
    if args.model is not None:
        input_file(args.model, "--model")
    if not args.prompt:
        raise UsageError("--prompt is empty", fix="give at least one token, e.g. --prompt 'fcak>'")
    m = Int8Model.from_json(args.model or TINY_MODEL_PATH)
    prompt = m.encode(args.prompt)
    if args.tp is not None:
        m = m.tp_params(args.tp)  # the tables placed on the mesh once, not on every call
    t0 = time.perf_counter()
    toks = m.generate(prompt, args.n, tp=args.tp)  # compiles once, then runs
    first = time.perf_counter() - t0
    runs = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        jax.block_until_ready(m.generate_arrays(prompt, args.n, tp=args.tp))
        runs.append(time.perf_counter() - t0)
    best = sorted(runs)[len(runs) // 2]
    fed = len(prompt) + args.n - 1
    print(args.prompt + m.decode(toks))
    print(
        f"{args.n} tokens ({fed} decode steps) in {best * 1e3:.2f} ms: "
        f"{args.n / best:.0f} tokens/s (median of {args.repeat} one-call traces"
        f"{'' if args.tp is None else f', tp={args.tp}'}; first call with compile "
        f"{first * 1e3:.0f} ms)"
    )
    return 0


def _check(args: argparse.Namespace) -> int:
    from ...int8 import Int8Model

    input_file(args.file, "FILE")
    m = Int8Model.from_json(args.file)
    print(f"{args.file}: valid")
    print(m.summary())
    return 0


def _guard(fn):
    """The command as `func(args) -> int`: a coded error is one line on stderr and exit status 2
    (usage) or 1 (failure), as `shapeml` itself reports them (`run_guarded`)."""

    def run(args: argparse.Namespace) -> int:
        return run_guarded(lambda: fn(args))

    return run


def add_parser(subparsers) -> None:
    """Registers `int8` with its subcommands `train`, `generate` and `check` on `subparsers`
    (from `argparse.ArgumentParser.add_subparsers`). Each sets `func(args) -> int`."""
    p = subparsers.add_parser(
        "int8",
        help="the integer-only int8 transformer (train, generate, check)",
        description="Integer-only one-layer transformer: train and export the tiny model, "
        "generate with a model file, validate a model file (docs/int8.md).",
    )
    sub = p.add_subparsers(dest="int8_command", required=True, metavar="{train,generate,check}")

    t = sub.add_parser(
        "train",
        help="train the float model, quantize it, export the JSON file",
        description="Trains the one-layer float transformer on the generated "
        "sorting corpus, quantizes it (post-training, calibrated on corpus "
        "samples) and writes the int8 model file. The defaults reproduce the "
        "shipped tiny_transformer.json.",
    )
    t.add_argument(
        "--out",
        default=None,
        help="where to write the int8 model file (default: the shipped "
        "shapeml/apps/int8_sort/tiny_transformer.json)",
    )
    t.add_argument(
        "--float-out",
        default=None,
        help="where to write the float weights (safetensors); default: next to the "
        "shipped model when --out is not given, else not written",
    )
    t.add_argument("--steps", type=count(), default=1500, help="training steps (default 1500)")
    t.add_argument(
        "--batch", type=count(high=_MAX_BATCH), default=64, help="sequences per step (default 64)"
    )
    t.add_argument(
        "--lr", type=positive_real(), default=3e-3, help="peak AdamW learning rate (default 3e-3)"
    )
    t.add_argument(
        "--seed", type=count(low=0), default=0, help="seed of data, init and batches (default 0)"
    )
    t.add_argument("--d", type=count(high=_MAX_DIM), default=32, help="model width d (default 32)")
    t.add_argument(
        "--heads", type=count(high=_MAX_DIM), default=4, help="attention heads (default 4)"
    )
    t.add_argument(
        "--d-ff", dest="d_ff", type=count(high=_MAX_DIM), default=64, help="FFN width (default 64)"
    )
    t.add_argument(
        "--ctx", type=count(high=_MAX_DIM), default=64, help="context length (default 64)"
    )
    t.set_defaults(func=_guard(_train))

    g = sub.add_parser(
        "generate",
        help="greedy generation with an int8 model file",
        description="Encodes TEXT, generates N tokens greedily in one compiled "
        "call, prints the text and the tokens per second.",
    )
    g.add_argument(
        "--model",
        default=None,
        help="the int8 model file (default: the shipped tiny_transformer.json)",
    )
    g.add_argument(
        "--prompt",
        required=True,
        help="the prompt text (the shipped model sorts letters a-l: try 'fcak>')",
    )
    g.add_argument(
        "-n", type=count(high=_MAX_DIM), default=32, help="how many tokens to generate (default 32)"
    )
    g.add_argument(
        "--tp",
        type=count(high=4096),
        default=None,
        help="tensor-parallel degree: split heads and FFN over N devices (on CPU, the cores are "
        "made N devices)",
    )
    g.add_argument(
        "--repeat",
        type=count(high=1_000_000),
        default=20,
        help="timed runs after the first (compiling) one; the median is reported",
    )
    g.set_defaults(func=_guard(_generate))

    c = sub.add_parser(
        "check",
        help="validate a model file, print its shapes and bounds",
        description="Validates an int8 model file (every check of "
        "Int8Model.from_json) and prints its shapes, requant pairs and int32 "
        "accumulator bounds.",
    )
    c.add_argument("file", help="the int8 model file (JSON)")
    c.set_defaults(func=_guard(_check))


def main(argv: list[str] | None = None) -> int:
    """Runs `shapeml int8 ARGS` on its own."""
    parser = CommandParser(prog="shapeml")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["int8", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)
