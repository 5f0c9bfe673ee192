"""The `shapeml` command: `explain` an error code, `train` and `eval` the Spotter, `int8` tools."""

from __future__ import annotations

import argparse
import sys

from ._errors import ShapemlError, explain, registry

__all__ = ["main"]


def _explain(args: argparse.Namespace) -> int:
    if args.list or not args.code:
        for code, e in registry().items():
            print(f"{code}  {e.title}")
        return 0
    print(explain(args.code))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every `shapeml` subcommand."""
    parser = argparse.ArgumentParser(
        prog="shapeml", description="Shape-typed models on JAX: training, evaluation and tools."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("explain", help="print the long explanation of an error or warning code")
    p.add_argument("code", nargs="?", help="a code such as E0901 or W1101")
    p.add_argument("--list", action="store_true", help="list every code with its title")
    p.set_defaults(func=_explain)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the `shapeml` command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ShapemlError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
