"""Tensor-parallel decode, Megatron's split, on JAX's engine (`Mesh` + `shard_map`), and its manifest.

Device c of a tp-device mesh owns heads c*H/tp .. (c+1)*H/tp: its columns of Wq, Wk, Wv and of
the KV cache, the matching rows of Wo, FFN columns c*d_ff/tp .. of W1 and the same rows of W2, and
its own copy of the exp table. The output projections (Wo, W2) leave int32 partial sums that are
all-reduced (`psum`) *before* their requant, so the result is the unsplit step bit for bit. The
embedding, the positional table, the residual stream and the head (Eq) are replicated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ..state import KVCache
from ._decode import Int8Params, generate_loop, step_body
from ._errors import Int8TensorParallelError

__all__ = [
    "TensorPlacement",
    "TpManifest",
    "check_tp",
    "place_cache",
    "make_mesh",
    "manifest",
    "param_specs",
    "tp_generate_fn",
    "tp_step_fn",
]

AXIS = "tp"
# None: replicated; 0 / 1: split along rows / columns.
_SPLIT = {
    "embed": None,
    "positions": None,
    "wq": 1,
    "wk": 1,
    "wv": 1,
    "wo": 0,
    "w1": 1,
    "w2": 0,
    "eq": None,
    "exp_table": None,
    "k_cache": 3,
    "v_cache": 3,
}
_ROLE = {
    "embed": "replicated spine: token embedding",
    "positions": "replicated spine: positional table",
    "wq": "columns of this device's heads",
    "wk": "columns of this device's heads",
    "wv": "columns of this device's heads",
    "wo": "rows of this device's heads; int32 partial sum psum'ed before requant `wo`",
    "w1": "this device's FFN columns",
    "w2": "rows of this device's FFN columns; int32 partial sum psum'ed before requant `w2`",
    "eq": "replicated spine: the head (logits = x @ Eq^T)",
    "exp_table": "replicated: each device holds its own copy",
    "k_cache": "KVCache [layer batch ctx heads dh]: this device's heads",
    "v_cache": "KVCache [layer batch ctx heads dh]: this device's heads",
}


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
    all_reduce: tuple[str, ...] = ("psum(wo_acc) then requant wo", "psum(w2_acc) then requant w2")

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
            lines.append(f"  {t.name:10s} {str(t.shape):14s} {t.spec:18s} {where}  ({t.role})")
        lines += [f"  all-reduce: {a}" for a in self.all_reduce]
        return "\n".join(lines)


def check_tp(tp: int, dims: Mapping[str, int], *, devices: bool = True) -> None:
    """Raises Int8TensorParallelError unless tp splits heads and d_ff evenly over enough devices."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise Int8TensorParallelError(
            f"tp must be a positive integer, got {tp!r}",
            fix="pass tp=1, 2, 4, ... (a divisor of heads and d_ff)",
        )
    for name in ("heads", "d_ff"):
        if dims[name] % tp:
            raise Int8TensorParallelError(
                f"tp={tp} does not divide {name}={dims[name]}",
                fix=f"choose tp among the common divisors of heads={dims['heads']} and "
                f"d_ff={dims['d_ff']}",
            )
    if devices and len(jax.devices()) < tp:
        raise Int8TensorParallelError(
            f"tp={tp} needs {tp} devices, this process sees {len(jax.devices())}",
            fix=f"run with XLA_FLAGS=--xla_force_host_platform_device_count={tp} (set before "
            "JAX starts) or on a machine with more devices",
        )


def manifest(dims: Mapping[str, int], table_len: int, tp: int) -> TpManifest:
    """The placement of every tensor for a tp-way split (checks tp against heads and d_ff)."""
    check_tp(tp, dims, devices=False)
    d, f, v, c = dims["d"], dims["d_ff"], dims["vocab"], dims["ctx"]
    shapes = {
        "embed": (v, d),
        "positions": (c, d),
        "wq": (d, d),
        "wk": (d, d),
        "wv": (d, d),
        "wo": (d, d),
        "w1": (d, f),
        "w2": (f, d),
        "eq": (v, d),
        "exp_table": (table_len,),
        "k_cache": (1, 1, c, dims["heads"], d // dims["heads"]),
        "v_cache": (1, 1, c, dims["heads"], d // dims["heads"]),
    }
    out = {}
    for name, shape in shapes.items():
        ax = _SPLIT[name]
        if ax is None:
            spec, slices = "P()", ()
        else:
            n = shape[ax] // tp
            spec = "P(" + ", ".join("'tp'" if i == ax else "None" for i in range(len(shape))) + ")"
            slices = tuple((i * n, (i + 1) * n) for i in range(tp))
        out[name] = TensorPlacement(name, shape, ax, spec, slices, _ROLE[name])
    return TpManifest(tp, dims["heads"] // tp, f // tp, out)


def _spec(name: str) -> P:
    ax = _SPLIT[name]
    return P() if ax is None else P(*(AXIS if i == ax else None for i in range(2)))


def param_specs() -> Int8Params:
    return Int8Params(*(_spec(n) for n in Int8Params._fields))


def cache_specs(cache: KVCache) -> KVCache:
    # KVCache's arrays are [layer batch ctx heads dh]: split the heads axis.
    return jax.tree.map(
        lambda _: P(*(AXIS if i == _SPLIT["k_cache"] else None for i in range(5))), cache
    )


def make_mesh(tp: int) -> Mesh:
    return Mesh(np.asarray(jax.devices()[:tp]), (AXIS,))


def place(mesh: Mesh, params: Int8Params, cache: KVCache) -> tuple[Int8Params, KVCache]:
    """Puts each table and cache slice on its device, as the manifest says."""
    put = lambda x, s: jax.device_put(x, NamedSharding(mesh, s))
    return (
        Int8Params(*map(put, params, param_specs())),
        jax.tree.map(put, cache, cache_specs(cache)),
    )


def place_cache(mesh: Mesh, cache: KVCache) -> KVCache:
    """The cache with each device's heads on that device (a no-op when already placed so)."""
    put = lambda x, s: jax.device_put(x, NamedSharding(mesh, s))
    return jax.tree.map(put, cache, cache_specs(cache))


def tp_step_fn(mesh: Mesh, pairs, heads: int, cache: KVCache, reduce: str = "exact"):
    """A jitted `(params, tok, pos, cache) -> (logits, next, cache)` over `mesh`."""
    tp = mesh.devices.size

    def local(p, tok, pos, cache):
        r = step_body(p, tok, pos, cache, pairs=pairs, heads=heads // tp, axis=AXIS, reduce=reduce)
        return r["logits"], r["next"], r["cache"]

    cs = cache_specs(cache)
    f = jax.shard_map(
        local, mesh=mesh, in_specs=(param_specs(), P(), P(), cs), out_specs=(P(), P(), cs)
    )
    return jax.jit(f)


def tp_generate_fn(mesh: Mesh, pairs, heads: int, cache: KVCache, reduce: str = "exact"):
    """A jitted `(params, buf, plen, steps) -> (buf, preds, cache)` over `mesh`."""
    tp = mesh.devices.size

    def local(p, buf, plen, steps):
        return generate_loop(
            p, buf, plen, steps, pairs=pairs, heads=heads // tp, axis=AXIS, reduce=reduce
        )

    cs = cache_specs(cache)
    f = jax.shard_map(
        local, mesh=mesh, in_specs=(param_specs(), P(), P(), P()), out_specs=(P(), P(), cs)
    )
    return jax.jit(f)
