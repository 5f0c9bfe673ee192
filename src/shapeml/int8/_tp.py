"""Tensor-parallel decode, Megatron's split, on JAX's engine (`Mesh` + `shard_map`), and its manifest.

The split is read from the model's field declarations: every axis that reads the heads dim H or
the FFN dim F is split over the devices, everything else is replicated. So device c of a
tp-device mesh owns heads c*H/tp .. (c+1)*H/tp (its columns of Wq, Wk, Wv, `[D H*Dh]`, and of the
KV cache, and the matching rows of Wo, `[H*Dh D]`), and FFN columns c*F/tp .. of W1 with the same
rows of W2. The row-split projections (Wo, W2) leave int32 partial sums that `project`
all-reduces (`psum`) *before* their requant, so the result is the unsplit step bit for bit.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import equinox as eqx
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .._validate import shorten
from ..models._dims import names_in
from ..models._introspect import dotted_name
from ..state import KVCache
from ._decode import Projection, generate_loop, project, step
from ._errors import Int8TensorParallelError

__all__ = [
    "AXIS",
    "CACHE_SPEC",
    "TensorPlacement",
    "TpManifest",
    "check_tp",
    "make_mesh",
    "manifest",
    "mesh",
    "place",
    "place_cache",
    "place_tables",
    "specs",
    "tp_generate",
    "tp_step",
]

AXIS = "tp"
_SPLIT_DIMS = {"H": "heads", "F": "FFN columns"}  # dim -> what a device owns a share of
_CACHE_HEADS_AXIS = 3  # KVCache arrays are [layers batch ctx heads head_dim]


@dataclasses.dataclass(frozen=True)
class TensorPlacement:
    """Where one tensor lives: its full shape, split axis (None: replicated) and per-device slices."""

    name: str
    shape: tuple[int, ...]
    split_axis: int | None
    spec: str
    slices: tuple[tuple[int, int], ...]  # per device: [start, stop) along split_axis
    role: str


@dataclasses.dataclass(frozen=True)
class TpManifest:
    """Where every tensor of a tp-way split lives, and which sums are all-reduced."""

    tp: int
    heads_per_device: int
    d_ff_per_device: int
    tensors: Mapping[str, TensorPlacement]
    all_reduce: tuple[str, ...] = ()

    def __str__(self) -> str:
        lines = [
            f"tensor parallel, tp={self.tp}: {self.heads_per_device} heads and "
            f"{self.d_ff_per_device} FFN columns per device"
        ]
        for t in self.tensors.values():
            where = (
                "replicated"
                if t.split_axis is None
                else "; ".join(f"dev{c}[{a}:{b}]" for c, (a, b) in enumerate(t.slices))
            )
            lines.append(f"  {t.name:13s} {str(t.shape):14s} {t.spec:18s} {where}  ({t.role})")
        lines += [f"  all-reduce: {a}" for a in self.all_reduce]
        return "\n".join(lines)


def _split(shape: tuple[int | str, ...]) -> tuple[int | None, str]:
    """The axis of a declared shape to split (the first that reads H or F) and what it holds."""
    for i, tok in enumerate(shape):
        names = names_in(str(tok))
        for dim, what in _SPLIT_DIMS.items():
            if dim in names:
                return i, what
    return None, ""


@functools.cache
def _field_splits(cls) -> dict[str, tuple[int | None, str]]:
    """Field name -> (split axis, what it holds), once per model class."""
    return {n: _split(s.shape) for n, s in cls.__shapeml_fields__.items()}


@functools.cache
def _pspec(ndim: int, axis: int | None) -> P:
    return P() if axis is None else P(*(AXIS if i == axis else None for i in range(ndim)))


# Every KVCache leaf (k, v: [layers batch ctx heads head_dim]) is split over its heads: one spec
# for the whole cache, a pytree prefix, so no cache has to be built to name its specs.
CACHE_SPEC = _pspec(5, _CACHE_HEADS_AXIS)


@functools.cache
def _sharding(mesh: Mesh, spec: P) -> NamedSharding:
    return NamedSharding(mesh, spec)


def specs(tree):
    """The `PartitionSpec` of every leaf of a model or a KVCache, paired with its field by name."""
    if isinstance(tree, KVCache):
        return jax.tree.map(lambda a: CACHE_SPEC, tree)
    splits = _field_splits(type(tree))
    return jax.tree_util.tree_map_with_path(
        lambda path, a: _pspec(np.ndim(a), splits[dotted_name(path)][0]), tree
    )


def check_tp(tp: Any, dims: Mapping[str, int], *, devices: bool = True) -> None:
    """Raises Int8TensorParallelError unless tp splits heads and d_ff evenly over enough devices."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise Int8TensorParallelError(
            f"tp must be a positive integer, got {shorten(tp)}",
            fix="pass tp=1, 2, 4, ... (a divisor of heads and d_ff)",
        )
    for name, dim in (("heads", "H"), ("d_ff", "F")):
        if dims[dim] % tp:
            raise Int8TensorParallelError(
                f"tp={tp} does not divide {name}={dims[dim]}",
                fix=f"choose tp among the common divisors of heads={dims['H']} and "
                f"d_ff={dims['F']}",
            )
    if devices and len(jax.devices()) < tp:
        raise Int8TensorParallelError(
            f"tp={tp} needs {tp} devices, this process sees {len(jax.devices())}",
            fix=f"run with XLA_FLAGS=--xla_force_host_platform_device_count={tp} (set before "
            "JAX starts) or on a machine with more devices",
        )


def make_mesh(tp: Any) -> Mesh:
    """A one-axis mesh (`"tp"`) over the first tp devices (one per tp: made once).

    Raises:
        Int8TensorParallelError: (E1611) tp not a positive int, or more than the devices seen.
    """
    if type(tp) is not int or not 1 <= tp <= len(jax.devices()):
        raise Int8TensorParallelError(
            f"tp = {shorten(tp)} is not a device count in 1..{len(jax.devices())}",
            fix="pass a positive int at most the number of devices (on CPU, set XLA_FLAGS="
            "--xla_force_host_platform_device_count=N before JAX starts)",
        )
    return _make_mesh(tp)


@functools.cache
def _make_mesh(tp: int) -> Mesh:
    return Mesh(np.asarray(jax.devices()[:tp]), (AXIS,))


def mesh(m, tp: Any) -> Mesh:
    """The mesh of a tp-way split of `m`, after checking tp (Int8TensorParallelError, E1611)."""
    check_tp(tp, m.dims)
    return make_mesh(tp)


def _put(x, sharding: NamedSharding):
    # device_put costs ~50 us per leaf even when nothing moves: skip placed leaves.
    return x if getattr(x, "sharding", None) == sharding else jax.device_put(x, sharding)


def place(tree, mesh: Mesh):
    """A model or KVCache with each leaf on the mesh as `specs` says (a no-op when already so)."""
    return jax.tree.map(lambda x, s: _put(x, _sharding(mesh, s)), tree, specs(tree))


def place_tables(cls, names: list[str], tables: list, tp: int) -> list:
    """A model's array leaves (`names`: their dotted paths) placed on the tp-device mesh."""
    splits, mesh = _field_splits(cls), make_mesh(tp)
    return [
        _put(x, _sharding(mesh, _pspec(np.ndim(x), splits[n][0])))
        for n, x in zip(names, tables, strict=True)
    ]


def place_cache(k, v, tp: int):
    """A KVCache's k and v placed on the tp-device mesh, split over heads."""
    sharding = _sharding(make_mesh(tp), CACHE_SPEC)
    return _put(k, sharding), _put(v, sharding)


def manifest(m, tp: Any) -> TpManifest:
    """The placement of every tensor of `m` (its fields, then the KV cache) for a tp-way split."""
    check_tp(tp, m.dims, devices=False)
    out, reduced = {}, []
    shapes = {n: s.shape_in(m.dims) for n, s in type(m).__shapeml_fields__.items()}
    cache_shape = (1, 1, m.dims.T, m.dims.H, m.dims.Dh)
    entries = [(n, shapes[n], *_split(s.shape)) for n, s in type(m).__shapeml_fields__.items()]
    entries += [(n, cache_shape, _CACHE_HEADS_AXIS, "heads") for n in ("k_cache", "v_cache")]
    for name, shape, ax, what in entries:
        if ax is None:
            spec, slices, role = "P()", (), "replicated: each device holds all of it"
        else:
            n = shape[ax] // tp
            spec = "P(" + ", ".join("'tp'" if i == ax else "None" for i in range(len(shape))) + ")"
            slices = tuple((i * n, (i + 1) * n) for i in range(tp))
            if name.endswith("_cache"):
                role = "KVCache [layer batch ctx heads dh]: this device's heads"
            elif ax == 0:  # rows: this device's share of a contraction, a partial sum
                role = f"rows of this device's {what}; int32 partial sum psum'ed before requant `{name}`"
                reduced.append(f"psum({name}_acc) then requant {name}")
            else:
                role = f"this device's {what}"
        out[name] = TensorPlacement(name, shape, ax, spec, slices, role)
    return TpManifest(tp, m.dims.H // tp, m.dims.F // tp, out, tuple(reduced))


def _split_model(m):
    """The model's arrays (through `shard_map`, split as `specs` says) and its host constants
    (numpy leaves: the requant pairs the compiled programs fold in), closed over."""
    return eqx.partition(m, lambda x: isinstance(x, jax.Array))


def tp_step(mesh: Mesh, *, project: Projection = project):
    """`(model, tok, pos, cache) -> (logits, next, cache)`, the step split over `mesh`, to jit
    (model and cache placed as `place` does); `project` as for `step`."""

    def run(m, tok, pos, cache):
        arrays, consts = _split_model(m)

        def local(arrays, tok, pos, cache):
            r = step(eqx.combine(arrays, consts), tok, pos, cache, axis=AXIS, project=project)
            return r["logits"], r["next"], r["cache"]

        f = jax.shard_map(
            local,
            mesh=mesh,
            in_specs=(specs(arrays), P(), P(), CACHE_SPEC),
            out_specs=(P(), P(), CACHE_SPEC),
        )
        return f(arrays, tok, pos, cache)

    return run


def tp_generate(mesh: Mesh, *, project: Projection = project):
    """`(model, buf, plen, steps) -> (buf, preds, cache)`, `generate_loop` split over `mesh`, to
    jit; `project` as for `step`."""

    def run(m, buf, plen, steps):
        arrays, consts = _split_model(m)

        def local(arrays, buf, plen, steps):
            m = eqx.combine(arrays, consts)
            return generate_loop(m, buf, plen, steps, axis=AXIS, project=project)

        f = jax.shard_map(
            local,
            mesh=mesh,
            in_specs=(specs(arrays), P(), P(), P()),
            out_specs=(P(), P(), CACHE_SPEC),
        )
        return f(arrays, buf, plen, steps)

    return run
