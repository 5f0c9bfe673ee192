"""What every `shapeml` command shares: flag types checked by the validation layer, coded usage
errors on one line, and output paths checked before any work starts.

A usage mistake exits with status 2 and one coded line (no traceback); a failure during the run
exits with status 1. Flags are validated when parsed, so a bad value never starts a run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

from .._errors import ShapemlError
from .._io import FileMissingError, FolderMissingError, as_path, unwritable
from .._validate import integer, real

__all__ = [
    "CommandParser",
    "before_the_run",
    "NothingTrainedError",
    "OutputPathError",
    "UsageError",
    "count",
    "decay",
    "mesh_flag",
    "rule_flag",
    "input_file",
    "one_line",
    "output_file",
    "positive_real",
    "run_guarded",
]

USAGE = 2  # exit status of a usage mistake (as argparse uses)
FAILURE = 1  # exit status of a run that failed


class UsageError(
    ShapemlError,
    ValueError,
    code="E2101",
    title="invalid command-line flag",
    explanation="""
A `shapeml` command was given a flag value it cannot use: a step count, size or device count that
is not a positive whole number, a learning rate that is not a positive finite number, an unknown
flag. Nothing was run and no file was touched. The message names the flag and the value; run the
command with `--help` for every flag and its range.
""",
):
    pass


class OutputPathError(
    ShapemlError,
    ValueError,
    code="E2102",
    title="output path cannot be written",
    explanation="""
A `shapeml` command was asked to write a file where it cannot: the folder does not exist, the path
is a folder, or the folder is not writable. The path is checked before the run starts, so no work
is lost; create the folder or pick another path.
""",
):
    pass


class NothingTrainedError(
    ShapemlError,
    RuntimeError,
    code="E2103",
    title="the run trained nothing; the output was not written",
    explanation="""
A training run ended without a single applied step (every gradient was non-finite and skipped, or
no step ran), so its model is no better than its initialization. shapeml refuses to write it over
`--out`: an earlier trained model there is kept as it was. Check the data and the learning rate
(a too-large rate makes every gradient overflow), then run again.
""",
):
    pass


class CommandParser(argparse.ArgumentParser):
    """An `ArgumentParser` whose usage errors are one coded line on stderr and exit status 2.

    Subcommands made by `add_subparsers().add_parser` are of this class too.
    """

    def error(self, message: str):  # argparse calls this for every usage mistake
        err = UsageError(message, fix=f"run `{self.prog} --help` for every flag and its range")
        self.exit(USAGE, one_line(err) + "\n")


def _flag_type(name: str, check: Callable[[str], object]) -> Callable[[str], object]:
    def parse(text: str):
        try:
            return check(text)
        except ShapemlError as e:
            raise argparse.ArgumentTypeError(e.message.replace("`value`", "the value")) from e

    parse.__name__ = name
    return parse


def _number(text: str, kind: type):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a {'whole number' if kind is int else 'number'}"
        ) from None


def count(low: int = 1, high: int = 2**31 - 1) -> Callable[[str], int]:
    """A flag type: a whole number in `[low, high]` (`--steps`, `--batch-size`, `--devices`)."""
    return _flag_type("count", lambda t: integer("value", _number(t, int), low=low, high=high))


def positive_real(*, allow_zero: bool = False) -> Callable[[str], float]:
    """A flag type: a finite number > 0 (or >= 0 with `allow_zero`)."""
    return _flag_type(
        "number",
        lambda t: real("value", _number(t, float), low=0.0, low_open=not allow_zero),
    )


def decay() -> Callable[[str], float]:
    """A flag type: a decay rate in [0, 1) (`--ema 0.99`)."""
    return _flag_type(
        "decay", lambda t: real("value", _number(t, float), low=0.0, high=1.0, high_open=True)
    )


def mesh_flag() -> Callable[[str], dict[str, int]]:
    """A flag type: named mesh axis sizes, `data=2,model=2`."""
    from ..sharding import mesh_shape

    return _flag_type("mesh", mesh_shape)


def rule_flag() -> Callable[[str], str]:
    """A flag type: one `DIM=AXIS[+AXIS]` rule (checked now, joined into a table later)."""
    from ..sharding import parse_rules

    def check(text: str) -> str:
        parse_rules([text])
        return text

    return _flag_type("rule", check)


def output_file(path: str | os.PathLike | None, flag: str) -> None:
    """Checks, before any work, that `path` can be written (the file layer's `unwritable`): its
    folder exists and is a writable folder, and it is not itself a folder.

    Raises:
        OutputPathError: (E2102) naming the flag, the path and what is wrong.
    """
    if path is None:
        return
    problem = unwritable(as_path(path, flag))
    if problem:
        raise OutputPathError(
            f"{flag} {str(path)!r} {problem[1]}; nothing was run",
            fix=f"create the folder first or pass another {flag}",
        )


def input_file(path: str | os.PathLike, flag: str) -> None:
    """Checks that `path` is an existing, readable file before any work.

    Raises:
        FileMissingError: (E1304) when there is no such file.
        UsageError: (E2101) when it is a folder or not readable.
    """
    p = Path(path)
    problem = None
    if not p.exists():
        raise FileMissingError(
            f"{flag} {str(path)!r} does not exist", fix=f"pass an existing file as {flag}"
        )
    if p.is_dir():
        problem = "is a folder, not a file"
    elif not os.access(p, os.R_OK):
        problem = "is not readable"
    if problem:
        raise UsageError(f"{flag} {str(path)!r} {problem}", fix=f"pass an existing file as {flag}")


def one_line(e: ShapemlError) -> str:
    """An error as the one line a command prints: code, message and fix."""
    fix = " ".join((e.fix or "").split())
    return f"error: [{e.code}] {e.message}" + (f" (help: {fix})" if fix else "")


@contextlib.contextmanager
def before_the_run():
    """Marks the checks a command makes before its work: an error there is a usage mistake
    (exit status 2) whatever its code, since nothing has run yet."""
    try:
        yield
    except ShapemlError as e:
        e.usage = True
        raise


def run_guarded(run: Callable[[], int]) -> int:
    """Runs a command: a shapeml error prints one coded line and returns exit status 1 (2 for a
    usage error found before the run), an interrupt returns 130; real bugs keep their traceback."""
    try:
        return run()
    except ShapemlError as e:
        print(one_line(e), file=sys.stderr)
        usage = (UsageError, OutputPathError, FileMissingError, FolderMissingError)
        return USAGE if isinstance(e, usage) or getattr(e, "usage", False) else FAILURE
    except KeyboardInterrupt:
        print("interrupted: nothing more was written", file=sys.stderr)
        return 130
