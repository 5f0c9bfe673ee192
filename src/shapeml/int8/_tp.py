"""Tensor-parallel decode, Megatron's split, on JAX's engine (`Mesh` + `shard_map`), and its manifest.

The split is the rule table `RULES = {"H": "tp", "F": "tp"}` placed through `shapeml.sharding`,
the library's one placement: an axis spelled by the heads dim H (`H*Dh`, through its first factor)
or the FFN dim F is split over the mesh axis `tp`, every other axis is replicated, and the KV cache,
whose axes `KVCache.AXES` names, is split over its heads by the same table. So device c of a
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
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .._traceback import api_boundary
from .._validate import shorten
from ..sharding import field_plans, partition_spec, partition_specs, shardings
from ..sharding import make_mesh as sharding_make_mesh
from ..state._kvcache import KVCache
from ._decode import Projection, generate_loop, project, step
from ._errors import Int8TensorParallelError

__all__ = [
    "AXIS",
    "RULES",
    "TensorPlacement",
    "TpManifest",
    "check_tp",
    "manifest",
    "mesh",
    "place",
    "place_cache",
    "place_tables",
    "specs",
    "tp_generate",
    "tp_mesh",
    "tp_step",
]

AXIS = "tp"
RULES = {"H": AXIS, "F": AXIS}  # Megatron's split: heads and FFN columns over the tp axis
_OWNS = {"H": "heads", "F": "FFN columns"}  # what a device owns a share of, by the splitting dim
# Every KVCache leaf (k, v: [L B T H Dh]) by the same table, split over its heads: one spec for
# the whole cache, a pytree prefix, so no cache has to be built to name its specs.
_CACHE_SPEC = partition_spec(KVCache.AXES, RULES)


@api_boundary
@dataclasses.dataclass(frozen=True)
class TensorPlacement:
    """Where one tensor lives: its full shape, split axis (None: replicated) and per-device slices."""

    name: str
    shape: tuple[int, ...]
    split_axis: int | None
    spec: str
    slices: tuple[tuple[int, int], ...]  # per device: [start, stop) along split_axis
    role: str


@api_boundary
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


@functools.cache
def _sharding(mesh: Mesh, spec: P) -> NamedSharding:
    return NamedSharding(mesh, spec)


def specs(tree):
    """The `PartitionSpec` of every leaf of a model or a KVCache, by the rule table `RULES`."""
    if isinstance(tree, KVCache):
        return jax.tree.map(lambda a: _CACHE_SPEC, tree)
    return partition_specs(tree, RULES)


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
            fix=f"on CPU, call sm.use_cpu_devices({tp}) first, before any JAX computation; or "
            "run on a machine with more devices",
        )


@functools.cache
def tp_mesh(tp: int) -> Mesh:
    """The one-axis mesh `"tp"` over the first tp devices (`sharding.make_mesh`), made once per tp."""
    return sharding_make_mesh({AXIS: tp})


def mesh(m, tp: Any) -> Mesh:
    """The mesh of a tp-way split of `m`, after checking tp (Int8TensorParallelError, E1611)."""
    check_tp(tp, m.dims)
    return tp_mesh(tp)


def _put(x, sharding: NamedSharding):
    # device_put costs ~50 us per leaf even when nothing moves: skip placed leaves.
    return x if getattr(x, "sharding", None) == sharding else jax.device_put(x, sharding)


@api_boundary
def place(tree, mesh: Mesh):
    """A model or KVCache with each leaf on the mesh as `specs` says (a no-op when already so).

    Raises:
        UnknownMeshAxisError, IndivisibleDimError: (E1902, E1903) for a model and a mesh without
            a `tp` axis, or one whose size does not divide H and F.
    """
    if isinstance(tree, KVCache):
        return jax.tree.map(lambda x: _put(x, _sharding(mesh, _CACHE_SPEC)), tree)
    return jax.tree.map(_put, tree, shardings(tree, mesh, RULES))


def place_tables(m, names: list[str], tables: list, tp: int) -> list:
    """`m`'s array leaves (`names`: their dotted paths) placed on the tp-device mesh."""
    plans, mesh = field_plans(m, RULES), tp_mesh(tp)
    return [_put(x, _sharding(mesh, plans[n].spec)) for n, x in zip(names, tables, strict=True)]


def place_cache(k, v, tp: int):
    """A KVCache's k and v placed on the tp-device mesh, split over heads."""
    sharding = _sharding(tp_mesh(tp), _CACHE_SPEC)
    return _put(k, sharding), _put(v, sharding)


def _spec_text(spec: P) -> str:
    return (
        "P(" + ", ".join("None" if e is None else repr(e) for e in spec) + ")"
        if any(spec)
        else "P()"
    )


def manifest(m, tp: Any) -> TpManifest:
    """The placement of every tensor of `m` (its fields, then the KV cache) for a tp-way split,
    read from the plans of the rule table `RULES`."""
    check_tp(tp, m.dims, devices=False)
    out, reduced = {}, []
    entries = [(p.name, p.shape, p.spec, p.rules) for p in field_plans(m, RULES).values()]
    cache_shape = (1, 1, m.dims.T, m.dims.H, m.dims.Dh)
    entries += [(n, cache_shape, _CACHE_SPEC, KVCache.AXES) for n in ("k_cache", "v_cache")]
    for name, shape, spec, dims in entries:
        ax = next((i for i, e in enumerate(spec) if e is not None), None)
        if ax is None:
            slices, role = (), "replicated: each device holds all of it"
        else:
            n, what = shape[ax] // tp, _OWNS[dims[ax]]
            slices = tuple((i * n, (i + 1) * n) for i in range(tp))
            if name.endswith("_cache"):
                role = "KVCache [layer batch ctx heads dh]: this device's heads"
            elif ax == 0:  # rows: this device's share of a contraction, a partial sum
                role = f"rows of this device's {what}; int32 partial sum psum'ed before requant `{name}`"
                reduced.append(f"psum({name}_acc) then requant {name}")
            else:
                role = f"this device's {what}"
        out[name] = TensorPlacement(name, shape, ax, _spec_text(spec), slices, role)
    return TpManifest(tp, m.dims.H // tp, m.dims.F // tp, out, tuple(reduced))


def _split_model(m):
    """The model's arrays (through `shard_map`, split as `specs` says) and its host constants
    (numpy leaves: the requant pairs the compiled programs fold in), closed over."""
    return eqx.partition(m, lambda x: isinstance(x, jax.Array))


@api_boundary
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
            in_specs=(specs(arrays), P(), P(), _CACHE_SPEC),
            out_specs=(P(), P(), _CACHE_SPEC),
        )
        return f(arrays, tok, pos, cache)

    return run


@api_boundary
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
            out_specs=(P(), P(), _CACHE_SPEC),
        )
        return f(arrays, buf, plen, steps)

    return run
