"""Meshes and rule tables from text, as the command line spells them.

`--mesh data=2,model=2` is `make_mesh("data=2,model=2")`, a 2 x 2 mesh over the first four devices;
`--shard D=data --shard F=data+model` is `parse_rules(["D=data", "F=data+model"])`,
`{"D": "data", "F": ("data", "model")}`.

A mesh's axes are Auto (GSPMD places what the rules do not) unless `axis_types="explicit"` asks
for JAX's sharding in types; shapeml's placement and compiled steps take either (`docs/scaling.md`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from .._traceback import api_boundary
from .._validate import shorten
from ._errors import MeshSpecError, RuleTableError
from ._table import rules_table

__all__ = ["make_mesh", "mesh_shape", "parse_rules"]


def _pairs(text: str, what: str, error: type) -> list[tuple[str, str]]:
    out = []
    for part in text.split(","):
        name, eq, value = part.partition("=")
        if not eq or not name.strip() or not value.strip():
            raise error(
                f"{what} `{shorten(text)}`: `{part}` is not NAME=VALUE",
                fix="write e.g. data=2,model=2" if what == "mesh" else "write e.g. D=model",
            )
        out.append((name.strip(), value.strip()))
    return out


@api_boundary
def mesh_shape(spec: str | Mapping[str, int]) -> dict[str, int]:
    """Named axis sizes from `"data=2,model=2"` (or a mapping), checked.

    Raises:
        MeshSpecError: (E1906) for a malformed spec, a repeated or invalid name, a size < 1.
    """
    if isinstance(spec, str):
        items = _pairs(spec, "mesh", MeshSpecError)
    elif isinstance(spec, Mapping):
        items = list(spec.items())
    else:
        raise MeshSpecError(
            f"a mesh shape is a string or a mapping, got {shorten(spec)}",
            fix='write "data=2,model=2" or {"data": 2, "model": 2}',
        )
    out: dict[str, int] = {}
    for name, size in items:
        if not isinstance(name, str) or not name.isidentifier() or name in out:
            raise MeshSpecError(
                f"mesh axis name {shorten(name)} is "
                + ("used twice" if name in out else "not an identifier"),
                fix="name each axis once, e.g. data=2,model=2",
            )
        text = str(size)
        if isinstance(size, bool) or not text.isdigit() or int(text) < 1:
            raise MeshSpecError(
                f"mesh axis `{name}` has size {shorten(size)}, not a positive whole number",
                fix=f"write e.g. {name}=2",
            )
        out[name] = int(text)
    if not out:
        raise MeshSpecError("the mesh has no axes", fix="write e.g. data=2")
    return out


_KINDS = {"auto": AxisType.Auto, "explicit": AxisType.Explicit}


def _axis_types(axis_types: Any, names: Sequence[str]) -> tuple[AxisType, ...]:
    """One `AxisType` per axis from "auto", "explicit", an `AxisType`, or one of those per axis."""

    def one(value: Any) -> AxisType:
        if isinstance(value, AxisType) and value in _KINDS.values():
            return value
        if isinstance(value, str) and value.lower() in _KINDS:
            return _KINDS[value.lower()]
        raise MeshSpecError(
            f'mesh axis type {shorten(value)} is neither "auto" nor "explicit"',
            fix='pass axis_types="auto" (the default), "explicit", or one per axis, e.g. '
            '("explicit", "auto")',
        )

    if isinstance(axis_types, (str, AxisType)):
        return (one(axis_types),) * len(names)
    if isinstance(axis_types, Sequence) and len(axis_types) == len(names):
        return tuple(one(v) for v in axis_types)
    raise MeshSpecError(
        f"axis_types={shorten(axis_types)} does not give one type for each of the mesh's "
        f"{len(names)} axes ({', '.join(names)})",
        fix='pass one type for all axes ("explicit") or one per axis',
    )


@api_boundary
def make_mesh(
    spec: str | Mapping[str, int], devices: Sequence | None = None, *, axis_types: Any = "auto"
) -> Mesh:
    """A mesh with these named axis sizes over the first devices (all of `jax.devices()` by
    default), in row-major order.

    In a job of several processes `jax.devices()` lists every process's devices, process by
    process, so the first axis spans the processes: name the data axis first
    (`"data=4,model=2"`) and the batch is split by process (`sharding.batch_part`).

    Args:
        spec: named axis sizes, `"data=2,model=2"` or `{"data": 2, "model": 2}`.
        devices: the devices to lay out (default `jax.devices()`).
        axis_types: `"auto"` (the default: GSPMD propagates shardings through the computation),
            `"explicit"` (JAX's sharding in types: every array's type carries its sharding, as
            `jax.make_mesh` makes by default), or one of those (or a `jax.sharding.AxisType`)
            per axis. shapeml places models and runs its compiled steps on either kind.

    Example:
        >>> mesh = make_mesh("data=2,model=2")    # 4 devices: data splits pairs, model within
        >>> mesh = make_mesh("data=4", axis_types="explicit")

    Raises:
        MeshSpecError: (E1906) for a bad spec or axis type, or one needing more devices than
            there are.
    """
    shape = mesh_shape(spec)
    types = _axis_types(axis_types, tuple(shape))
    devices = list(jax.devices() if devices is None else devices)
    n = int(np.prod(list(shape.values()), dtype=np.int64))
    if n > len(devices):
        raise MeshSpecError(
            f"mesh {','.join(f'{k}={v}' for k, v in shape.items())} needs {n} devices, "
            f"there are {len(devices)}",
            fix=f"use smaller axes; on CPU call sm.use_cpu_devices({n}) first, before any JAX "
            "computation",
        )
    grid = np.array(devices[:n], dtype=object).reshape(tuple(shape.values()))
    return Mesh(grid, tuple(shape), axis_types=types)


@api_boundary
def parse_rules(specs: str | Sequence[str]) -> dict[str, str | tuple[str, ...]]:
    """A rule table from `"D=model,F=model"` or `["D=model", "F=data+model"]` (`+` joins axes).

    Raises:
        RuleTableError: (E1905) for an entry that is not DIM=AXIS[+AXIS...], or a dim twice.
    """
    texts = [specs] if isinstance(specs, str) else list(specs)
    out: dict[str, str | tuple[str, ...]] = {}
    for text in texts:
        if not isinstance(text, str):
            raise RuleTableError(
                f"a rule is DIM=AXIS text, got {shorten(text)}", fix="write e.g. D=model"
            )
        for dim, value in _pairs(text, "rule", RuleTableError):
            if dim in out:
                raise RuleTableError(f"dim `{dim}` is ruled twice", fix="give each dim one rule")
            axes = tuple(a.strip() for a in value.split("+"))
            if not all(a.isidentifier() for a in axes):
                raise RuleTableError(
                    f"rule `{dim}={value}`: each mesh axis must be a name",
                    fix="write e.g. D=model or D=data+model",
                )
            out[dim] = axes[0] if len(axes) == 1 else axes
    rules_table(out)
    return out
