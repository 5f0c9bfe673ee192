"""`shapeml launch`: run a training script as N local processes of one job (`distributed.launch`).

    shapeml launch --processes 2 --devices-per-process 2 -- python train.py --steps 100

The lead's `shapeml` parser calls `add_parser(subparsers)`. The exit status is 0 when every
process succeeds, else the first failed process's (128 + N for a signal N, 124 past --timeout),
after one coded line naming it.
"""

from __future__ import annotations

import argparse
import sys

from ..distributed import launch
from ..distributed._errors import LaunchError
from ._flags import UsageError, count, one_line, positive_real

__all__ = ["add_parser"]


def _launch(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError(
            "shapeml launch got no command to run",
            fix="put the command after `--`: shapeml launch --processes 2 -- python train.py",
        )
    try:
        return launch(
            command,
            processes=args.processes,
            devices_per_process=args.devices_per_process,
            port=args.port,
            grace=args.grace,
            timeout=args.timeout,
        )
    except LaunchError as e:
        print(one_line(e), file=sys.stderr)
        return getattr(e, "exit_code", 1) or 1


def add_parser(subparsers) -> None:
    """Registers `launch` on `subparsers` (from `ArgumentParser.add_subparsers`)."""
    p = subparsers.add_parser(
        "launch",
        help="run a script as N local processes of one job (jax.distributed, like torchrun)",
        description="Start N processes of one job on this machine, each with the coordinator's "
        "address (127.0.0.1 and a free port), the process count and its index in its "
        "environment; `shapeml.distributed.initialize()` in the script reads them. Output lines "
        "are tagged [i]. When one process fails the others are stopped after --grace seconds.",
        epilog="example: shapeml launch --processes 2 --devices-per-process 2 -- python "
        "train.py --steps 100. On a cluster (SLURM, Open MPI, Kubernetes, Cloud TPU) run the "
        "script itself the cluster's way (srun python train.py): initialize() reads the "
        "cluster's settings. See docs/scaling.md, 'Several processes'.",
    )
    p.add_argument(
        "--processes", type=count(high=4096), default=2, metavar="N", help="processes (default 2)"
    )
    p.add_argument(
        "--devices-per-process",
        type=count(high=4096),
        default=1,
        metavar="N",
        help="CPU devices in each process (default 1), whatever this environment's "
        "JAX_NUM_CPU_DEVICES or XLA_FLAGS say",
    )
    p.add_argument(
        "--port",
        type=count(high=65535),
        default=None,
        help="the coordinator's port on 127.0.0.1 (default: a free one)",
    )
    p.add_argument(
        "--grace",
        type=positive_real(),
        default=30.0,
        metavar="SECONDS",
        help="how long the others may run after one fails before they are killed (default 30)",
    )
    p.add_argument(
        "--timeout",
        type=positive_real(),
        default=None,
        metavar="SECONDS",
        help="kill every process after this long (default: no limit)",
    )
    p.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        help="the command each process runs, after `--` (e.g. -- python train.py)",
    )
    p.set_defaults(func=_launch)  # `shapeml`'s main runs it guarded (a usage error exits 2)
