"""Batches in a job of several processes: which part of each batch a process feeds, and the global
batch built from the parts (`jax.make_array_from_process_local_data`).

A batch's leading dim is split over the mesh's data axis. The devices of one process hold a
contiguous run of that axis's blocks (a mesh whose first axis is the data axis, as `make_mesh`
lays out `jax.devices()`, gives each process its own run), so each process feeds only those rows:
its *part* of the global batch. Processes whose devices hold the same blocks (a model axis across
processes) feed the same rows. In one process the part is the whole batch.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .._traceback import api_boundary
from .._validate import instance
from ..models._introspect import dotted_name
from ._errors import IndivisibleDimError, ProcessLayoutError
from ._place import _check_axis as check_batch_axis
from ._place import place_batch

__all__ = ["batch_part", "place_local_batch"]


@api_boundary
def batch_part(mesh: Mesh, batch_axis: str | None = "data") -> tuple[int, int]:
    """`(index, count)`: this process feeds part `index` of `count` equal parts of each batch.

    The global batch is split over `batch_axis`; the devices of this process hold a contiguous
    run of its blocks, the `index`-th of `count` runs. `(0, 1)` in a single process, without a
    batch axis, or when the axis lies within each process (every process feeds the whole batch).

    Example:
        >>> part = sharding.batch_part(mesh)             # (process_index, 2) on data=4 over 2
        >>> data = batches(x, y, batch_size=64, part=part)   # 32 rows of each 64-row batch

    Raises:
        UnknownMeshAxisError: (E1902) for an axis the mesh does not have.
        ProcessLayoutError: (E1907) when a process's devices hold blocks of the axis that are
            not one contiguous run of the same length as every other process's.
    """
    instance("mesh", mesh, Mesh, "a jax.sharding.Mesh")
    check_batch_axis(batch_axis, mesh)
    if batch_axis is None or jax.process_count() == 1:
        return 0, 1
    axis = mesh.axis_names.index(batch_axis)
    size = mesh.devices.shape[axis]
    runs: dict[int, list[int]] = {}  # process index -> the axis blocks its devices hold
    for position, device in np.ndenumerate(mesh.devices):
        runs.setdefault(device.process_index, []).append(position[axis])
    runs = {p: sorted(set(blocks)) for p, blocks in runs.items()}
    mine = runs.get(jax.process_index())
    length = len(mine) if mine else 0
    for p, blocks in sorted(runs.items()):
        contiguous = blocks == list(range(blocks[0], blocks[0] + len(blocks)))
        if not contiguous or len(blocks) != length or blocks[0] % length:
            raise ProcessLayoutError(
                f"the devices of process {p} hold blocks {blocks} of the `{batch_axis}` axis "
                f"({size} blocks), not one aligned run of {length or 'some'} like process "
                f"{jax.process_index()}'s {mine}",
                fix="make the mesh with sharding.make_mesh (the data axis first), which lays "
                "each process's devices out together",
            )
    if mine is None:
        raise ProcessLayoutError(
            f"the mesh ({', '.join(f'{k}={v}' for k, v in mesh.shape.items())}) holds no device "
            f"of process {jax.process_index()}",
            fix="make the mesh over every process's devices (jax.devices())",
        )
    return mine[0] // length, size // length


@api_boundary
def place_local_batch(batch: Any, mesh: Mesh, batch_axis: str | None = "data"):
    """The global batch from this process's part of it: every array of `batch` (a pytree) split
    along its leading dim over `batch_axis`, each process giving only its rows.

    In a single process it is `place_batch`. In several, each leaf holds this process's rows
    (part `batch_part(mesh, batch_axis)` of the global batch) and becomes one global array
    (`jax.make_array_from_process_local_data`); a leaf that is already a global array (not
    fully addressable) is taken as it is, and a scalar must be the same in every process.

    Raises:
        UnknownMeshAxisError: (E1902), ProcessLayoutError (E1907) as `batch_part`.
        IndivisibleDimError: (E1903) for a global batch that does not split evenly over the axis.
    """
    if jax.process_count() == 1:
        return place_batch(batch, mesh, batch_axis)
    index, count = batch_part(mesh, batch_axis)
    parts = mesh.shape[batch_axis] if batch_axis is not None else 1
    split = NamedSharding(mesh, P(batch_axis))

    def one(path, x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return x  # already global
        x = np.asarray(x)
        if x.ndim == 0:
            return jax.make_array_from_process_local_data(NamedSharding(mesh, P()), x, ())
        rows = x.shape[0] * count
        if rows % parts:
            raise IndivisibleDimError(
                f"batch entry `{dotted_name(path) or 'batch'}` has {x.shape[0]} rows in this "
                f"process (part {index} of {count}), {rows} in all, which do not split evenly "
                f"over `{batch_axis}`={parts}",
                fix=f"feed each process a multiple of {max(parts // count, 1)} rows",
            )
        return jax.make_array_from_process_local_data(split, x, (rows, *x.shape[1:]))

    return jax.tree_util.tree_map_with_path(one, batch)
