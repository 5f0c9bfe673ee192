"""Every core by default: on a CPU host, shapeml makes each core a JAX device before JAX's backend
starts, and `TrainStep` (so `train` and the examples) splits each batch over them.

XLA:CPU runs one program's operations mostly one after another, each using the host's threads only
when it is large, so a small model's training step keeps about one core busy (`docs/performance.md`).
Several devices each run their part of the batch at the same time: data parallelism across cores,
with the same gradients (an average over the whole batch). XLA reads its flags once, when the
backend starts; so `import shapeml` sets `--xla_force_host_platform_device_count` then, and only
if all of these hold:

- JAX's backend has not started yet (import shapeml before running any JAX computation);
- `XLA_FLAGS` does not already choose a device count (the user's setting always wins);
- the process is not one of a job of several processes (`shapeml.distributed.launch` sets
  `SHAPEML_PROCESSES`): there the launcher's `devices_per_process` (or the user's XLA_FLAGS) says
  how many devices each process has, and N processes each taking every core would oversubscribe;
- the environment variable `SHAPEML_CPU_DEVICES` is not `1` (or `0`, `off`): the opt-out. A number
  `N > 1` asks for N devices instead of the default (one per usable core, at most 8).

`cpu_devices()` says what was decided and why. Nothing else changes: a computation placed on one
device runs there, and `TrainStep(..., devices=1)` (or `train(..., devices=1)`) keeps one device.
"""

from __future__ import annotations

import dataclasses
import os

from ._traceback import api_boundary

__all__ = ["CPU_DEVICES_ENV", "CpuDevices", "configure", "cpu_devices"]

CPU_DEVICES_ENV = "SHAPEML_CPU_DEVICES"
_FLAG = "--xla_force_host_platform_device_count"
# Set by `shapeml.distributed.launch` in each process it starts (`distributed/_init.py`; named
# here, not imported: this module runs first, before any other part of shapeml).
_PROCESSES_ENV = "SHAPEML_PROCESSES"
_MAX_DEFAULT = 8  # past a few devices, the all-reduce of every gradient costs more than it saves


@api_boundary
@dataclasses.dataclass(frozen=True)
class CpuDevices:
    """What `import shapeml` decided about the CPU devices.

    Attributes:
        count: the devices shapeml asked XLA for (None: it set nothing).
        reason: why, in words.
    """

    count: int | None
    reason: str


_DECISION = CpuDevices(None, "shapeml has not been imported")


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _decide(env: dict, started: bool, cores: int) -> tuple[CpuDevices, str | None]:
    """The decision and the new XLA_FLAGS (None: leave them), from the environment."""
    flags = env.get("XLA_FLAGS", "")
    asked = env.get(CPU_DEVICES_ENV, "").strip().lower()
    if asked in ("0", "1", "off", "false", "no"):
        return CpuDevices(None, f"{CPU_DEVICES_ENV}={asked}: opted out"), None
    if "xla_force_host_platform_device_count" in flags:
        return CpuDevices(None, "XLA_FLAGS already sets the device count"), None
    if env.get(_PROCESSES_ENV, "").strip() not in ("", "1"):
        return CpuDevices(None, f"one process of {env[_PROCESSES_ENV]}: the launcher decides"), None
    if started:
        return CpuDevices(None, "JAX's backend started before shapeml was imported"), None
    if asked:
        if not asked.isdigit():
            return CpuDevices(None, f"{CPU_DEVICES_ENV}={asked!r} is not a count: ignored"), None
        n = int(asked)
    else:
        n = min(cores, _MAX_DEFAULT)
    if n < 2:
        return CpuDevices(None, f"{cores} usable core(s): nothing to split"), None
    new = f"{flags} {_FLAG}={n}".strip()
    return CpuDevices(n, f"{n} devices, one per core ({cores} usable)"), new


def configure() -> CpuDevices:
    """Decides and, when it applies, sets XLA_FLAGS (once, at `import shapeml`)."""
    global _DECISION
    from ._jax_internals import backend_started

    decision, flags = _decide(dict(os.environ), backend_started(), _usable_cores())
    if flags is not None:
        os.environ["XLA_FLAGS"] = flags
    _DECISION = decision
    return decision


@api_boundary
def cpu_devices() -> CpuDevices:
    """What `import shapeml` decided: how many CPU devices it asked for (or None), and why.

    Example:
        >>> sm.cpu_devices()
        CpuDevices(count=2, reason='2 devices, one per core (2 usable)')
    """
    return _DECISION


# At import: `shapeml/__init__.py` imports this module first, before anything can start JAX's
# backend (XLA reads its flags once, then).
configure()
