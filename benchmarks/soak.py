"""The soak: multi-process jobs on a loaded machine finish or fail coded in bounded time, all of them.

Runs `--runs` jobs (default 12) of `tests/soak_worker.py` under `distributed.launch`, alternating
2 processes x 2 devices and 2 processes x 1 device and the zoo models (GPT-2, the transformer,
the Spotter), each training with an `eval_fn` and a `CheckpointManager` (what hung in the field),
its params and optimizer state split by `sharding.fsdp`, then `sm.save` from every process. Two
busy-looping processes hog the CPU throughout (on top of whatever else loads the machine). A run
counts when it finished, or when it failed cleanly: a coded error (E2207, the watchdog; E2203,
a peer stopped) within the bound, never the launcher's timeout. The budget is all of them.

    python benchmarks/soak.py [--runs 12] [--steps 12]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from test_soak import BOUND, HOG, run_job  # noqa: E402

LAYOUTS = [(2, "gpt2"), (1, "transformer"), (2, "spotter"), (1, "gpt2"), (2, "transformer"),
           (1, "spotter")]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(2)]
    ok = 0
    try:
        for i in range(args.runs):
            devices, model = LAYOUTS[i % len(LAYOUTS)]
            with tempfile.TemporaryDirectory() as tmp:
                seconds, log, error = run_job(Path(tmp), model, args.steps, devices)
                finished = error is None and (Path(tmp) / "model.safetensors").exists()
            clean = (
                error is not None
                and error.exit_code != 124
                and ("E2207" in log or "E2203" in log)
                and seconds < BOUND
            )
            ok += finished or clean
            what = "finished" if finished else "failed coded" if clean else "HUNG OR FAILED"
            print(f"run {i + 1:2d}: 2 x {devices} {model:11s} {what} in {seconds:.0f} s"
                  + ("" if finished else f": {error}"), flush=True)  # fmt: skip
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    print(f"soak_completed: ratio={ok / args.runs:.2f} (budget 1.0)")


if __name__ == "__main__":
    main()
