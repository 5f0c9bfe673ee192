"""Where the shell's values live: the Auto view of a mesh, and whether its steps run one at a time.

**Both mesh kinds.** A mesh's axes are Auto (GSPMD propagates shardings through the program) or
Explicit (JAX's sharding in types: every value's type carries its sharding, and an operation
whose output sharding JAX cannot infer, such as most reshapes of a split axis, is an error until
the code says where its output goes). shapeml's layers, the zoo and most user losses are written
once, for Auto axes. So a compiled step is traced with each value seen through the *Auto view*
of its mesh (the same devices and axis names, every axis Auto): the code runs unchanged, and
each value is still compiled for the placement it has. The shell keeps such values on the Auto
view (`device_put` to it is free: the two views differ only in type, never in where the bytes
are) and gives the carry back with the shardings it came with (Explicit ones included), so the
values keep their types between calls.

**One step at a time on CPU devices.** On CPU, the collectives of a program split over several
devices (forced host devices in one process, or gloo across processes) block worker threads
while they wait for every participant. Left unbounded, asynchronous dispatch queues step after
step; under load, the participants of one collective can then wait on threads held by another
step's, until XLA's 40 s rendezvous timeout aborts the process (`Termination timeout for all
gather`) or gloo waits forever. A shell whose carry spans several CPU devices therefore waits for
its previous step before it dispatches the next (`paced`); it still prepares the next inputs
meanwhile, and a single device or an accelerator is never paced.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import AxisType, Mesh, NamedSharding

__all__ = ["auto_mesh", "auto_view", "is_auto", "paced"]


def auto_mesh(mesh: Mesh) -> Mesh:
    """`mesh` with every axis Auto (itself when it has no other kind)."""
    if all(t == AxisType.Auto for t in mesh.axis_types):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


def auto_view(sharding: Any) -> Any:
    """A `NamedSharding` on its mesh's Auto view (same devices, axes and spec); any other
    sharding as it is."""
    if isinstance(sharding, NamedSharding) and isinstance(sharding.mesh, Mesh):
        mesh = auto_mesh(sharding.mesh)
        if mesh is not sharding.mesh:
            return NamedSharding(mesh, sharding.spec, memory_kind=sharding.memory_kind)
    return sharding


def is_auto(x) -> bool:
    """Whether `x` is anything but an array on a mesh with an axis that is not Auto."""
    sharding = getattr(x, "sharding", None)
    if not isinstance(sharding, NamedSharding) or not isinstance(sharding.mesh, Mesh):
        return True
    return all(t == AxisType.Auto for t in sharding.mesh.axis_types)


def paced(leaves: list) -> bool:
    """Whether a carry with these leaves must run one step at a time: some leaf is split or
    replicated over several CPU devices (its programs hold collectives)."""
    for x in leaves:
        if isinstance(x, jax.Array):
            devices = x.sharding.device_set
            if len(devices) > 1 and next(iter(devices)).platform == "cpu":
                return True
    return False
