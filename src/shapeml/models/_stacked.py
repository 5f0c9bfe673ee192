"""Stacked sub-models: `count` layers stored as one sub-model whose every tensor has a leading axis
of `count` (`sm.submodels(Block, "L", stacked=True)`), as `jax.lax.scan` consumes them.

A stacked value is an instance of the layer's class, with its per-layer dims and options; only its
tensors are taller. It is built by stacking checked layers (`stack`), or checked as given
(`check_stacked`); `layer(v, i)` and `unstack(v)` give the layers back. Name-based views (params,
checkpoints) list each layer under `name.i.`, exactly as the unstacked tuple does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["check_stacked", "count_of", "is_stacked", "layer", "stack", "unstack"]


def is_stacked(spec: Any, value: Any) -> bool:
    """Whether the value of a `submodels` field is stored stacked (one model, not a tuple)."""
    return spec.kind == "submodels" and isinstance(value, spec.model)


def stack(layers: Sequence[Any]) -> Any:
    """One model of the layers' class whose every tensor is the layers' tensors stacked on a new
    leading axis. The layers must share their dims, options and which optional tensors they hold
    (checked by the caller against the declaration)."""
    if not layers:
        raise ValueError("no layers to stack")  # the caller reports a count of 0 first
    return jax.tree.map(lambda *xs: jnp.stack(xs), *layers)


def layer(stacked: Any, i: int | jax.Array) -> Any:
    """Layer `i` of a stacked model: each tensor's row `i` (a plain slice, no checks, no copy of
    the other layers)."""
    return jax.tree.map(lambda x: x[i], stacked)


def count_of(stacked: Any, default: int) -> int:
    """How many layers a stacked model holds (the leading axis of its tensors)."""
    leaves = jax.tree.leaves(stacked)
    return int(np.shape(leaves[0])[0]) if leaves else default


def unstack(stacked: Any, count: int) -> tuple:
    """The layers of a stacked model, as a tuple."""
    return tuple(layer(stacked, i) for i in range(count))


def check_stacked(name: str, value: Any, count: int) -> str | None:
    """A problem with the tensors of a stacked model of `count` layers, or None: every tensor
    must be its declared shape (in the model's own dims) and dtype with a leading `count`."""
    problems = _leaf_problems(value, (count,), f"{name}.")
    if not problems:
        return None
    shown = "; ".join(problems[:4]) + (
        f" (and {len(problems) - 4} more)" if len(problems) > 4 else ""
    )
    return f"{name}: stacked {count} x {type(value).__name__}, but {shown}"


def _leaf_problems(m: Any, lead: tuple[int, ...], prefix: str) -> list[str]:
    out: list[str] = []
    statics = {k: getattr(m, k) for k in type(m).__shapeml_statics__}
    for fname, spec in type(m).__shapeml_fields__.items():
        value = getattr(m, fname)
        path = prefix + fname
        if spec.kind == "submodel":
            out += _leaf_problems(value, lead, path + ".")
        elif spec.kind == "submodels":
            n = spec.count_in(m.dims)
            if is_stacked(spec, value):
                out += _leaf_problems(value, (*lead, n), path + ".")
            else:
                for i, child in enumerate(value):
                    out += _leaf_problems(child, lead, f"{path}.{i}.")
        elif value is None:
            if spec.present(statics):
                out.append(f"{path} is None")
        else:
            want = (*lead, *spec.shape_in(m.dims))
            got = tuple(np.shape(value))
            dtype = np.dtype(value.dtype) if hasattr(value, "dtype") else None
            if got != want or dtype != spec.dtype:
                out.append(
                    f"{path} is [{' '.join(map(str, got))}] {getattr(dtype, 'name', '?')}, "
                    f"expected [{' '.join(map(str, want))}] {spec.dtype.name}"
                )
    return out
