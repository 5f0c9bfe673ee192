"""Which arrays hold NaN or inf, asked in one compiled program whose answer every process reads.

In a job of several processes (or on several CPU devices) every program over split arrays holds
collectives, and two such programs in flight at once can deadlock gloo's collectives: checking
each array with its own eager `jnp.all(jnp.isfinite(x))` queued dozens of them at once, the cause
of the jobs that hung at a checkpoint under load. So the check is one program, replicated out,
waited for before anything else is queued.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = ["finite_flags"]


def _flags(leaves: list) -> jax.Array:
    return jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])


@functools.lru_cache(maxsize=64)
def _program(out: NamedSharding | None):
    return jax.jit(_flags, out_shardings=out)


def _auto(x: jax.Array) -> jax.Array:
    """`x` seen on its mesh's Auto view (the same buffers): the check is written for Auto axes."""
    s = x.sharding
    if not isinstance(s, NamedSharding) or not isinstance(s.mesh, Mesh):
        return x
    if all(t == AxisType.Auto for t in s.mesh.axis_types):
        return x
    mesh = Mesh(s.mesh.devices, s.mesh.axis_names, axis_types=(AxisType.Auto,) * s.mesh.ndim)
    return jax.device_put(x, NamedSharding(mesh, s.spec))


def finite_flags(arrays: Sequence[jax.Array]) -> np.ndarray:
    """Whether each array holds only finite values: one program, its answer on every process.

    Args:
        arrays: floating arrays, all on the same devices (a model's and its optimizer's).

    Returns:
        a bool array, one entry per array.
    """
    if not arrays:
        return np.ones(0, bool)
    arrays = [_auto(x) if isinstance(x, jax.Array) else jnp.asarray(x) for x in arrays]
    s = arrays[0].sharding
    out = NamedSharding(s.mesh, P()) if isinstance(s, NamedSharding) else None
    if out is None and len(s.device_set) > 1:
        devices = sorted(s.device_set, key=lambda d: d.id)
        out = NamedSharding(Mesh(np.array(devices), ("all",)), P())
    flags = _program(out)(list(arrays))
    return np.asarray(jax.device_get(flags)).astype(bool)
