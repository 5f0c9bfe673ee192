"""Every core, explicitly: `use_cpu_devices` makes the host's CPU cores JAX devices, one call made
before JAX's backend starts (on JAX's own `jax_num_cpu_devices` option); importing shapeml never does.

XLA:CPU runs a small model's step mostly on one core; several devices each run their part of the
batch at once, so `TrainStep` and `train` (which split each batch over the process's devices)
train a transformer faster. A conv model such as the Spotter already spreads over the cores in
XLA's thread pool and gains nothing (`docs/performance.md`).
"""

from __future__ import annotations

import os
import re
import typing

import jax

from .._jax_internals import backend_started
from .._traceback import api_boundary
from .._validate import integer
from ._errors import CpuDevicesStartedError

__all__ = ["use_cpu_devices"]

# Past a few devices the all-reduce of every gradient costs more than the split saves.
MAX_DEFAULT = 8
_XLA_COUNT = re.compile(r"--xla_force_host_platform_device_count=(\d+)")


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _already_chosen() -> int | None:
    """A count the process was already given: JAX's option (set by JAX_NUM_CPU_DEVICES, as
    `shapeml launch` does for each process, or an earlier call), else XLA_FLAGS' own flag."""
    chosen = jax.config.jax_num_cpu_devices
    if chosen >= 1:
        return chosen
    found = _XLA_COUNT.findall(os.environ.get("XLA_FLAGS", ""))
    return int(found[-1]) if found and int(found[-1]) >= 1 else None


@typing.no_type_check  # validates its argument itself, with a coded error
@api_boundary
def use_cpu_devices(n: int | None = None) -> int:
    """Makes the CPU `n` JAX devices; call it first, before any JAX computation.

    JAX reads the count once, when its backend starts (the first array, computation or
    `jax.devices()` call), so the call changes the whole process from then on; it is
    `jax.config.update("jax_num_cpu_devices", n)`, checked. `TrainStep` and `train` then split
    each batch over the devices (data parallelism across cores: the same update as on one
    device). It wins for transformers and loses for a conv model such as the Spotter (figures in
    `docs/performance.md`).

    Args:
        n: how many CPU devices. None: the count the process was already given
            (`JAX_NUM_CPU_DEVICES`, which `shapeml launch` sets for each of its processes, or
            `--xla_force_host_platform_device_count` in `XLA_FLAGS`), else one device per
            usable core, at most 8.

    Returns:
        The number of CPU devices the process has (or will have when JAX starts).

    Raises:
        CpuDevicesStartedError: (E1908) when JAX has already started with another number of CPU
            devices (nothing changes); asking for the count it has returns quietly.
        ArgumentError, ArgumentTypeError: (E0002, E0003) for `n` not a positive whole number.

    Example:
        >>> import shapeml as sm
        >>> sm.use_cpu_devices()     # first, before any JAX computation
        2
        >>> step = sm.training.TrainStep(loss, m, opt)   # each batch split over 2 devices
    """
    if n is None:
        want = _already_chosen() or min(_usable_cores(), MAX_DEFAULT)
    else:
        want = integer("n", n, low=1, high=4096)
    if backend_started():
        have = len(jax.local_devices(backend="cpu"))
        if have != want:
            raise CpuDevicesStartedError(
                f"use_cpu_devices asked for {want} CPU device(s), but JAX has already started "
                f"with {have}: the count is read once, when JAX's backend starts, so nothing "
                "changed",
                fix="call sm.use_cpu_devices() first, right after the imports and before any "
                "JAX computation (creating an array or a model, or calling jax.devices())",
            )
        return have
    jax.config.update("jax_num_cpu_devices", want)
    return want
