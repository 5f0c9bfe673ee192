"""Shaped functions under a user's own `jax.jit` on an Explicit mesh (what `jax.make_mesh` makes).

With Explicit axes every value's type carries its sharding, and an operation whose output
sharding JAX cannot infer (most reshapes of a split axis, gathers from a split table) is an
error until the code names it. shapeml's layers and the zoo are written once, for Auto axes
(GSPMD propagates shardings). So a shaped function called with values typed on an Explicit mesh
runs its body with the mesh's axes Auto (`jax.sharding.auto_axes`), and names the output
sharding JAX asks for: each output axis that has the batch's size is split as the batch's
leading axis is, the rest replicated. Inside, nested shaped calls see Auto axes and run as
they are; outside an Explicit mesh nothing changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = ["on_explicit_mesh", "run_on_auto_axes"]


def _typed_sharding(x: Any) -> Any:
    """The sharding in `x`'s type: a concrete array's own (cheap), a tracer's from its aval."""
    if isinstance(x, jax.core.Tracer):
        try:
            return jax.typeof(x).sharding
        except (AttributeError, TypeError):
            return None
    return getattr(x, "sharding", None) if isinstance(x, jax.Array) else None


def _is_explicit(sharding: Any) -> bool:
    return isinstance(sharding, NamedSharding) and any(
        t == AxisType.Explicit for t in sharding.mesh.axis_types
    )


def _first_array(v: Any, depth: int = 0) -> Any:
    """The first JAX array in `v` (an array, a model, a tuple, list or dict of them), found
    without flattening all of it: a shaped call pays a few microseconds, not a model's flatten."""
    if isinstance(v, (jax.Array, jax.core.Tracer)):
        return v
    if depth > 16:
        return None
    if isinstance(v, (list, tuple)):
        items = v
    elif isinstance(v, dict):
        items = v.values()
    elif dataclasses.is_dataclass(v) and not isinstance(v, type):
        items = vars(v).values()  # a model's fields (equinox keeps them in the instance dict)
    else:
        return None
    for item in items:
        found = _first_array(item, depth + 1)
        if found is not None:
            return found
    return None


def on_explicit_mesh(values: list) -> Any:
    """The concrete mesh (eager arrays) or abstract mesh (under a trace) with an Explicit axis
    that some value (an argument, or the first array of a model argument) is typed on; None when
    there is none."""
    for v in values:
        first = _first_array(v)
        if first is None:
            continue
        typed = _typed_sharding(first)
        if _is_explicit(typed):
            concrete = getattr(first, "sharding", None)
            if isinstance(concrete, NamedSharding) and not isinstance(first, jax.core.Tracer):
                return concrete.mesh
            return typed.mesh
    return None


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic, jax.core.Tracer))


def _batch(arrays: list) -> tuple[int, Any] | None:
    """`(size, mesh axes)` of the first array argument whose leading axis is split."""
    for x in arrays:
        s = _typed_sharding(x)
        if np.ndim(x) >= 1 and isinstance(s, NamedSharding) and len(s.spec) and s.spec[0]:
            return int(np.shape(x)[0]), s.spec[0]
    return None


def run_on_auto_axes(call: Callable, args: tuple, kwargs: dict, inputs: list, mesh: Any) -> Any:
    """`call(*args, **kwargs)` with `mesh`'s axes Auto inside, its outputs split along the batch
    (`inputs`: the non-model arguments, where the batch is looked for)."""
    context = jax.set_mesh(mesh) if isinstance(mesh, Mesh) else jax.sharding.use_abstract_mesh(mesh)
    with context:
        return _auto_axes(call, args, kwargs, inputs)


def _auto_axes(call: Callable, args: tuple, kwargs: dict, inputs: list) -> Any:
    leaves, treedef = jax.tree.flatten((args, kwargs))
    where = [i for i, x in enumerate(leaves) if _is_array(x)]

    def body(arrays):
        full = list(leaves)
        for i, a in zip(where, arrays, strict=True):
            full[i] = a
        a, k = jax.tree.unflatten(treedef, full)
        return call(*a, **k)

    arrays = [leaves[i] for i in where]
    shapes = jax.eval_shape(jax.sharding.auto_axes(body, out_sharding=P()), arrays)
    batch = _batch([x for x in jax.tree.leaves(inputs) if _is_array(x)])

    def out_spec(s: Any) -> P:
        if batch is not None and len(s.shape) >= 1 and s.shape[0] == batch[0]:
            return P(batch[1])
        return P()

    specs = jax.tree.map(out_spec, shapes)
    return jax.sharding.auto_axes(body, out_sharding=specs)(arrays)
