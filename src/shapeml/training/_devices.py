"""The devices a `TrainStep` without a mesh trains on: every device of the process (several CPU
devices after `sm.use_cpu_devices()`), each batch split over them, the model and optimizer
replicated.

Each device computes the loss and gradient of its rows; XLA averages the gradients across devices
(an all-reduce), so every replica applies the same update and the result is the step of the whole
batch, up to the order of a float sum. A batch whose rows the devices do not divide is replicated
instead (each device computes it all: the same numbers, no speed-up).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .._errors import ArgumentError
from .._validate import integer

__all__ = ["DataParallel", "default_devices"]


@dataclasses.dataclass(frozen=True)
class DataParallel:
    """A 1-D mesh `data=n`: batches split over it, everything else replicated (or any mesh,
    batches split over its `axis`)."""

    mesh: Mesh
    axis: str = "data"

    @property
    def size(self) -> int:
        return self.mesh.size

    def replicate(self, tree: Any) -> Any:
        return jax.device_put(tree, NamedSharding(self.mesh, P()))

    def place_batch(self, batch: tuple) -> tuple:
        """Each array split by rows over the devices (replicated when they do not divide its
        rows, or it has none)."""
        split, whole = NamedSharding(self.mesh, P(self.axis)), NamedSharding(self.mesh, P())

        def one(x):
            x = x if isinstance(x, jax.Array) else np.asarray(x)
            rows = np.shape(x)[0] if np.ndim(x) else 0
            parts = self.mesh.shape[self.axis]
            return jax.device_put(x, split if rows and rows % parts == 0 else whole)

        return jax.tree.map(one, batch)


def default_devices(devices: int | None) -> DataParallel | None:
    """The data-parallel placement of a `TrainStep` given no mesh: `devices=None` uses every
    device of this process (in a job of several processes, one: a job spans processes through a
    mesh), `devices=1` one device, `devices=N` the first N devices.

    Raises:
        ArgumentError: (E0002) for more devices than JAX has.
    """
    if devices is None:
        if jax.process_count() > 1:
            return None
        chosen = jax.local_devices()
    else:
        n = integer("devices", devices, low=1)
        if n > jax.device_count():
            raise ArgumentError(
                f"devices={n}, but JAX has {jax.device_count()} device(s)",
                fix="pass at most that many; on CPU, call sm.use_cpu_devices(N) first, before "
                "any JAX computation, to make N devices",
            )
        chosen = jax.devices()[:n]
    if len(chosen) < 2:
        return None
    return DataParallel(Mesh(np.array(chosen), ("data",)))
