"""Loading a checkpoint straight onto a mesh: each field goes from the file to its shards.

The file is checked exactly as `sm.load` checks it (the same codec, `model_from_arrays`); the only
difference is where each entry lands. Instead of one whole copy per field on the default device,
each device receives only its block, cut from the host copy of the file
(`jax.make_array_from_callback`), so no device ever holds a field it does not own.
"""

from __future__ import annotations

import os
import typing
from collections.abc import Collection, Iterator, Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from .._errors import ArgumentError
from .._traceback import api_boundary
from .._validate import instance
from ..models import Model
from ..models import load as load_unsharded
from ..models._checkpoint import model_from_arrays, read_model_file
from ..models._metadata import saved_dims, saved_statics
from ..models._partial import warn_partial
from ._place import shard
from ._rules import FieldPlan, Rules, check_mesh, plan
from ._table import rules_table

__all__ = ["load"]


class _PlacedEntries(Mapping[str, Any]):
    """A checkpoint's entries by dotted name; each read places the entry on its shards (once).

    Reads come from the checkpoint codec after it has checked the file's class and dims, so the
    plan is made then. An entry whose shape or dtype differs from its declaration is returned
    as it is, for the codec to report with every other problem.
    """

    def __init__(self, arrays, meta, cls: type[Model], mesh: Mesh, rules: Rules):
        self._arrays, self._meta, self._cls = arrays, meta, cls
        self._mesh, self._rules = mesh, rules
        self._plans: dict[str, FieldPlan] | None = None
        self._placed: dict[str, jax.Array] = {}

    def _plan(self) -> dict[str, FieldPlan]:
        if self._plans is None:
            cls = self._cls
            saved = saved_dims(self._meta, "")  # already checked by the codec
            dims = cls.dims.resolve(**{k: v for k, v in saved.items() if k in cls.dims.free})
            plans = plan(
                cls, dims, self._rules, saved_statics(self._meta, ""), dict(self._mesh.shape)
            )
            check_mesh(plans, self._rules, self._mesh)
            self._plans = {p.name: p for p in plans}
        return self._plans

    def __getitem__(self, name: str):
        host = self._arrays[name]
        p = self._plan().get(name)
        if p is None or tuple(host.shape) != p.shape or np.dtype(host.dtype) != p.dtype:
            return host
        if name not in self._placed:
            self._placed[name] = jax.make_array_from_callback(
                p.shape, NamedSharding(self._mesh, p.spec), lambda index: host[index]
            )
        return self._placed[name]

    def __contains__(self, name: object) -> bool:  # never places anything
        return name in self._arrays

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def load(
    path: str | os.PathLike,
    cls: type[Model] | None = None,
    *,
    like: Model | None = None,
    mesh: Mesh | None = None,
    rules: Rules | None = None,
    missing: str = "error",
    unexpected: str = "error",
    mismatched: str = "error",
    seed: Any = 0,
    report: bool = False,
    max_bytes: int | None = None,
    allow_nonfinite: bool | Collection[str] = False,
):
    """Loads a model saved by `sm.save`, each field placed on `mesh` as `rules` say.

    Without `mesh` it is `sm.load`. A checkpoint does not depend on how the model that wrote it
    was placed: save from one device, load onto a mesh, or the other way round.

    Args:
        path: the checkpoint file.
        cls: the model class; its dims are taken from the file.
        like: instead of `cls`, a model whose class and dims the file must match.
        mesh: the device mesh to place every field on.
        rules: dim name -> mesh axis (or tuple of axes, or None); `{}` (the default with a
            mesh) replicates every field.
        missing, unexpected, mismatched, seed, report: partial loading, as for
            `shapeml.models.load` (a partial load is built first, then placed).
        max_bytes, allow_nonfinite: as for `sm.load`.

    Example:
        >>> m = sm.load("model.safetensors", Transformer, mesh=mesh, rules={"F": "model"})

    Raises:
        the errors of `sm.load` (E1301-E1308, E0906, E0003), then those of `sm.shard`
        (E1901-E1905) for the rules.
    """
    policy = {"missing": missing, "unexpected": unexpected, "mismatched": mismatched}
    policy.update(seed=seed, report=instance("report", report, bool, "True or False"))
    if mesh is None:
        if rules is not None:
            raise ArgumentError(
                "sm.load(..., rules=...) was given rules but no mesh to place the fields on",
                fix="pass mesh= too, e.g. sm.load(path, Cls, mesh=mesh, rules=rules)",
            )
        return load_unsharded(
            path, cls, like=like, **policy, max_bytes=max_bytes, allow_nonfinite=allow_nonfinite
        )
    instance("mesh", mesh, Mesh, "a jax.sharding.Mesh")
    rules = {} if rules is None else rules
    rules_table(rules)  # a malformed table fails before the file is read
    if report or any(policy[k] != "error" for k in ("missing", "unexpected", "mismatched")):
        # Fields a partial load fills exist in no file: the model is built, then placed.
        m, done = load_unsharded(
            path,
            cls,
            like=like,
            **{**policy, "report": True},
            max_bytes=max_bytes,
            allow_nonfinite=allow_nonfinite,
        )
        m = shard(m, mesh, rules)
        if not report and done.partial:
            warn_partial(done)
        return (m, done) if report else m
    # The same checks and reads as `sm.load`; only where the entries land differs.
    cls, arrays, meta, limit = read_model_file(path, cls, like, max_bytes, allow_nonfinite)
    return model_from_arrays(
        cls,
        _PlacedEntries(arrays, meta, cls, mesh, rules),
        meta,
        str(path),
        like_dims=like.dims if like else None,
        max_bytes=limit,
    )
