"""The `shapeml` command: `explain` an error code, `train` and `eval` the Spotter, `int8` tools,
`launch` a multi-process job."""

from __future__ import annotations

import argparse
import math
import sys

import jax

from . import sharding
from ._errors import UnknownCodeError, errors_markdown, explain, registry
from ._io import same_file
from ._jax_internals import backend_started
from .apps._flags import (
    USAGE,
    CommandParser,
    UsageError,
    before_the_run,
    count,
    decay,
    input_file,
    mesh_flag,
    one_line,
    output_file,
    positive_real,
    rule_flag,
    run_guarded,
)
from .apps.int8_sort.cli import add_parser as add_int8_parser
from .apps.launch_cli import add_parser as add_launch_parser
from .data.shapes import MAX_IMAGES
from .sharding import parse_rules, use_cpu_devices

__all__ = ["main"]

_MAX_IMAGES = MAX_IMAGES  # what the shapes data set draws at most


def _explain(args: argparse.Namespace) -> int:
    if args.markdown:
        print(errors_markdown(), end="")
        return 0
    if args.list or not args.code:
        for code, e in registry().items():
            print(f"{code}  {e.title}")
        return 0
    try:
        print(explain(args.code))
    except UnknownCodeError as e:
        print(one_line(e), file=sys.stderr)
        return USAGE
    return 0


def _devices_asked(args: argparse.Namespace) -> int | None:
    if args.mesh is not None:
        return int(math.prod(args.mesh.values()))
    return args.devices


def _use_devices_asked(args: argparse.Namespace) -> None:
    """`--devices N` (or a `--mesh` of N devices) makes the CPU N JAX devices, before JAX starts;
    none asked: one device, the Spotter's fastest on CPU (`docs/performance.md`). A process whose
    JAX has already started (`cli.main` called from a program) keeps its devices: the run then
    checks it has enough."""
    n = _devices_asked(args)
    if n and n > 1 and not backend_started():
        use_cpu_devices(n)


@before_the_run()
def _check_train_flags(args: argparse.Namespace) -> None:
    """Everything a run needs, checked before it starts: no work is lost to a late mistake."""
    output_file(args.out, "--out")
    output_file(args.checkpoint, "--checkpoint")
    if args.out and args.checkpoint and same_file(args.out, args.checkpoint):
        raise UsageError(
            f"--out and --checkpoint are the same file {args.out!r}: the model would overwrite "
            "the checkpoint and its optimizer state",
            fix="pass two different paths",
        )
    if args.resume and not args.checkpoint:
        raise UsageError(
            "--resume was given without --checkpoint", fix="pass --checkpoint PATH to resume from"
        )
    if args.mesh is not None and args.devices is not None:
        raise UsageError(
            "--mesh and --devices were both given", fix="--devices N is --mesh data=N: pass one"
        )
    if args.shard and args.mesh is None:
        raise UsageError("--shard was given without --mesh", fix="pass --mesh data=2,model=2 too")
    if args.batch_size > args.train_size:
        raise UsageError(
            f"--batch-size {args.batch_size} is larger than --train-size {args.train_size}",
            fix="pass a batch size at most the number of training images",
        )
    data = args.devices or (args.mesh or {}).get("data", 1)
    if args.batch_size % data:
        raise UsageError(
            f"--batch-size {args.batch_size} does not split over {data} devices of the data axis",
            fix=f"pass a batch size that is a multiple of {data}",
        )
    if args.mesh is not None:  # the rules against the Spotter's dims and the mesh's axes
        from .zoo.spotter import Spotter

        sharding.shardings(
            jax.eval_shape(lambda: Spotter.init(seed=0)),
            sharding.make_mesh(args.mesh),
            parse_rules(args.shard or []),
        )


def _train(args: argparse.Namespace) -> int:
    from .apps.spotter_job import format_report, train_spotter

    _use_devices_asked(args)
    _check_train_flags(args)
    result, report = train_spotter(
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup=args.warmup,
        clip=args.clip,
        seed=args.seed,
        train_size=args.train_size,
        test_size=args.test_size,
        devices=args.devices,
        out=args.out,
        checkpoint=args.checkpoint,
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
        progress=not args.no_progress,
        accumulate=args.accumulate,
        ema=args.ema,
        mesh=None if args.mesh is None else ",".join(f"{k}={v}" for k, v in args.mesh.items()),
        rules=parse_rules(args.shard) if args.shard else None,
    )
    last = next((h for h in reversed(result.history) if "loss" in h), {})
    print(
        f"trained {args.steps} steps: final loss {last.get('loss', float('nan')):.4f}, "
        f"skipped steps (non-finite gradients): {result.skipped}"
    )
    print(format_report(report))
    if args.out:
        print(f"saved the model to {args.out}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from .apps.spotter_job import evaluate_file, format_report

    input_file(args.path, "PATH")
    print(format_report(evaluate_file(args.path, args.test_size)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every `shapeml` subcommand."""
    parser = CommandParser(
        prog="shapeml", description="Shape-typed models on JAX: training, evaluation and tools."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("explain", help="print the long explanation of an error or warning code")
    p.add_argument("code", nargs="?", help="a code such as E0901 or W1101")
    p.add_argument("--list", action="store_true", help="list every code with its title")
    p.add_argument(
        "--markdown",
        action="store_true",
        help="print every code's long form as Markdown (the source of docs/errors.md)",
    )
    p.set_defaults(func=_explain)

    p = sub.add_parser(
        "train",
        help="train the Spotter on the built-in shapes data set",
        description="Train the Spotter (an MLP-mixer) on generated 16x16 shapes with AdamW, "
        "warmup + cosine learning rate and gradient clipping; print the held-out per-class "
        "accuracy and confusion matrix, and save the model.",
    )
    p.add_argument("--steps", type=count(), default=1500, help="training steps (default 1500)")
    p.add_argument(
        "--batch-size",
        type=count(high=_MAX_IMAGES),
        default=64,
        help="images per step (default 64)",
    )
    p.add_argument(
        "--lr", type=positive_real(), default=3e-3, help="peak learning rate (default 3e-3)"
    )
    p.add_argument("--warmup", type=count(low=0), default=50, help="warmup steps (default 50)")
    p.add_argument(
        "--clip", type=positive_real(), default=1.0, help="gradient norm clip (default 1.0)"
    )
    p.add_argument(
        "--seed", type=count(low=0), default=0, help="seed of the data and the init (default 0)"
    )
    p.add_argument(
        "--train-size",
        type=count(high=_MAX_IMAGES),
        default=20_000,
        help="training images (default 20000)",
    )
    p.add_argument(
        "--test-size",
        type=count(high=_MAX_IMAGES),
        default=2_000,
        help="held-out images (default 2000)",
    )
    p.add_argument(
        "--devices",
        type=count(high=4096),
        default=None,
        help="shard each batch across N devices (data parallel; on CPU, the cores are made N "
        "devices; default: one device, the Spotter's fastest on CPU)",
    )
    p.add_argument(
        "--out",
        default="spotter.safetensors",
        help="where to save the trained model (default spotter.safetensors)",
    )
    p.add_argument(
        "--checkpoint",
        default=None,
        help="checkpoint path (model + optimizer), written periodically and at the end",
    )
    p.add_argument(
        "--checkpoint-every",
        type=count(),
        default=500,
        help="steps between checkpoints (default 500)",
    )
    p.add_argument("--resume", action="store_true", help="resume from --checkpoint if it exists")
    p.add_argument(
        "--accumulate",
        type=count(high=65_536),
        default=1,
        help="batches whose gradients are averaged per update (default 1)",
    )
    p.add_argument(
        "--ema",
        type=decay(),
        default=None,
        metavar="DECAY",
        help="keep a moving average of the weights with this decay in [0, 1), e.g. 0.99; "
        "it is what is evaluated and saved",
    )
    p.add_argument(
        "--mesh",
        type=mesh_flag(),
        default=None,
        metavar="AXES",
        help="train on a device mesh, e.g. data=2,model=2 (the batch is split over `data`; "
        "on CPU, host devices are made for it)",
    )
    p.add_argument(
        "--shard",
        action="append",
        type=rule_flag(),
        metavar="DIM=AXIS",
        help="place every field's DIM on a mesh axis, e.g. --shard Dc=model (repeatable; "
        "dims not named are replicated)",
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=_train)

    p = sub.add_parser(
        "eval",
        help="evaluate a saved Spotter on held-out shapes",
        description="Load a Spotter saved by `shapeml train` and print its held-out "
        "accuracy, per-class accuracy and confusion matrix.",
    )
    p.add_argument("path", help="a model file written by `shapeml train` (or sm.save)")
    p.add_argument(
        "--test-size",
        type=count(high=_MAX_IMAGES),
        default=2_000,
        help="held-out images (default 2000)",
    )
    p.set_defaults(func=_eval)

    add_int8_parser(sub)
    add_launch_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the `shapeml` command line; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    return run_guarded(lambda: args.func(args))


if __name__ == "__main__":
    sys.exit(main())
