"""Scripts run in a subprocess on N forced CPU devices: how the suite tests several devices (the
XLA flag must be set before JAX starts, and never globally in the suite).

The subprocesses use XLA's cheaper CPU compile: their programs are small, so compiling them is
most of their time, and each script computes its reference (one device, the unsplit model) in the
same process, under the same flags.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

# No LLVM optimisation and XLA CPU's older elemental emitters, which compile small fusions in about
# half the time of its MLIR fusion emitters (a 3-block GPT-2 step with remat: 2.9 s -> 1.3 s).
FAST_COMPILE = (
    "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    " --xla_cpu_use_fusion_emitters=false"
)


def forced_env(devices: int | None = None) -> dict[str, str]:
    """This process's environment for a JAX subprocess on the CPU, with `devices` devices (none
    of this process's JAX, XLA or shapeml settings: the subprocess's are its own)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHAPEML_", "XLA_", "JAX_"))}
    env["JAX_PLATFORMS"] = "cpu"
    env["XLA_FLAGS"] = FAST_COMPILE
    if devices:
        env["XLA_FLAGS"] += f" --xla_force_host_platform_device_count={devices}"
    return env


def run_forced(script: str, devices: int, timeout: float = 600) -> subprocess.CompletedProcess:
    """Runs the Python source `script` on `devices` devices; fails the test if it fails."""
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env=forced_env(devices),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def result_of(script: str, devices: int, timeout: float = 600) -> dict:
    """The JSON the script printed after `RESULT`, run on `devices` devices."""
    out = run_forced(script, devices, timeout).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("RESULT"))
    return json.loads(line[len("RESULT") :])
