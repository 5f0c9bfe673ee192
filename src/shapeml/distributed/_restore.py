"""Restoring a sharded checkpoint: shapeml's checks on the metadata first, then each array read
straight onto its shards.

The checks are `sm.load`'s and `sm.load_checkpoint`'s own codec (`model_from_arrays`,
`entry_problems`), run on the checkpoint's abstract arrays (`jax.eval_shape`: shapes and dtypes
from orbax's metadata, nothing read), so a mismatch is reported whole before any I/O. The
shardings come from the rule table (`sharding.shardings`, `step_shardings(...).opt`) for the
mesh asked for, which need not be the one the checkpoint was saved from.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
from jax.sharding import Mesh, SingleDeviceSharding

from .. import sharding
from .._errors import ArgumentError, ArgumentTypeError
from .._io import FileFormatError
from .._validate import instance, shorten
from ..models import Model
from ..models._checkpoint import CheckpointError, entry_problems, model_from_arrays
from ..models._introspect import dotted_name
from ..optim._checkpoint import _check_like, _options, _parse
from ..optim._config import rebuild
from ..optim._errors import OptionConflictError
from ..optim._optimizer import OPTIONS
from ..sharding._table import rules_table

__all__ = ["restore_entries"]


def _arguments(cls, like, mesh, rules) -> tuple[type[Model], Any]:
    if (cls is None) == (like is None):
        raise ArgumentTypeError(
            "restore(Cls) or restore(like=model): give exactly one",
            fix="pass the model class, or a model to restore like",
        )
    if like is not None:
        instance("like", like, Model, "a model whose class and dims the checkpoint must match")
        cls = type(like)
    if not (isinstance(cls, type) and issubclass(cls, Model)):
        raise ArgumentTypeError(
            f"restore takes an sm.Model class, got {shorten(cls)} ({type(cls).__name__})",
            fix="pass the class the checkpoint was saved from, e.g. restore(Spotter)",
        )
    if mesh is None:
        if rules is not None:
            raise ArgumentError(
                "restore(..., rules=...) was given rules but no mesh to place the fields on",
                fix="pass mesh= too, e.g. restore(Cls, mesh=mesh, rules=rules)",
            )
        if jax.process_count() > 1:
            raise ArgumentError(
                f"restore() without a mesh in a job of {jax.process_count()} processes: no "
                "process can hold the whole model alone",
                fix="pass the job's mesh and rules, e.g. mesh=sharding.make_mesh('data=4')",
            )
        return cls, None
    instance("mesh", mesh, Mesh, "a jax.sharding.Mesh")
    rules = {} if rules is None else rules
    rules_table(rules)  # a malformed table fails before anything is read
    return cls, rules


def _metadata(raw: Any, source: str) -> dict[str, str]:
    if not (isinstance(raw, Mapping) and all(isinstance(v, str) for v in raw.values())):
        raise FileFormatError(
            f"`{source}` has unreadable shapeml metadata: {shorten(raw)}",
            fix="re-save it with CheckpointManager.save",
        )
    return dict(raw)


def restore_entries(
    mgr: Any,  # the CheckpointManager restoring
    cls: type[Model] | None,
    like: Model | None,
    like_opt: Any,
    step: int | None,
    mesh: Mesh | None,
    rules: Any,
    max_bytes: int | None,
    training: bool,
) -> tuple[Model, Any]:
    """`(model, optimizer or None)` of a checkpoint, checked, then placed (see the module)."""
    cls, rules = _arguments(cls, like, mesh, rules)
    step = mgr._step(step)
    source = f"{mgr.directory / str(step)}"
    ocp, orbax_mgr = mgr._ocp, mgr._mgr
    meta = orbax_mgr.restore(step, args=ocp.args.Composite(shapeml=ocp.args.JsonRestore()))
    meta = _metadata(meta["shapeml"], source)
    if training and "shapeml.optimizer" not in meta:
        raise CheckpointError(
            f"`{source}` holds no optimizer state (it was saved without one)",
            fix="restore it with restore(Cls), or save with save(step, m, opt)",
        )
    found = {
        name: jax.ShapeDtypeStruct(tuple(md.shape), md.dtype)
        for name, md in orbax_mgr.item_metadata(step)["arrays"].tree.items()
    }
    # The model's entries, and any entry of neither part (reported as unexpected).
    model_found = {
        (k[len("model.") :] if k.startswith("model.") else k): v
        for k, v in found.items()
        if not k.startswith("opt.")
    }
    like_dims = like.dims if like is not None else None

    def build(arrays):
        return model_from_arrays(cls, arrays, meta, source, like_dims, max_bytes=max_bytes)

    abstract = jax.eval_shape(build, model_found)  # every check, nothing read
    template = _optimizer(abstract, meta, found, like_opt, cls, source) if training else None
    targets = _targets(abstract, template, mesh, rules)
    restored = orbax_mgr.restore(
        step,
        args=ocp.args.Composite(
            arrays=ocp.args.PyTreeRestore(
                item=targets,
                restore_args={
                    k: ocp.ArrayRestoreArgs(
                        sharding=t.sharding, global_shape=t.shape, dtype=t.dtype
                    )
                    for k, t in targets.items()
                },
                partial_restore=True,
            )
        ),
    )["arrays"]
    model = build({k[len("model.") :]: v for k, v in restored.items() if k.startswith("model.")})
    if template is None:
        return model, None
    paths, treedef = jax.tree_util.tree_flatten_with_path(template)
    names = ["opt." + dotted_name(p) for p, _ in paths]
    return model, jax.tree_util.tree_unflatten(treedef, [restored[n] for n in names])


def _optimizer(abstract: Model, meta, found, like_opt, cls, source: str) -> Any:
    """The optimizer to fill (abstract unless `like_opt` is given), its entries checked."""
    cfg = _parse(meta["shapeml.optimizer"], source)
    if like_opt is not None:
        template = _check_like(like_opt, cls, cfg, source)
    else:
        template = jax.eval_shape(lambda m: rebuild(m, cfg, source), abstract)
    expected = {k: (v.shape, v.dtype) for k, v in _entries(template).items()}
    problems = entry_problems(expected, {k: v for k, v in found.items() if k.startswith("opt.")})
    if problems:
        raise CheckpointError(
            f"`{source}`'s optimizer state does not fit `{type(template).__name__}` "
            f"({_options(template)}; the checkpoint's: {_options(cfg)}): "
            f"{len(problems)} problem(s):\n    " + "\n    ".join(problems[:40]),
            fix="resume with the optimizer and options the checkpoint was saved with",
        )
    if any(cfg.get(k) != getattr(template, k) for k in OPTIONS):
        raise OptionConflictError(
            f"`{source}` was saved with {_options(cfg)}, but the template has {_options(template)}",
            fix="build the template with the options the run was saved with",
        )
    return template


def _entries(opt: Any) -> dict[str, Any]:
    """The optimizer's leaves (arrays or abstract ones) by entry name, as `save_checkpoint`
    names them (`opt.state.0.mu.w_e`)."""
    leaves = jax.tree_util.tree_flatten_with_path(opt)[0]
    return {"opt." + dotted_name(path): v for path, v in leaves}


def _targets(abstract: Model, template: Any, mesh: Mesh | None, rules: Any) -> dict:
    """Every entry to read, by name, as a `ShapeDtypeStruct` carrying the sharding to read onto."""
    if mesh is None:
        one = SingleDeviceSharding(jax.local_devices()[0])
        model_sh = jax.tree.map(lambda _: one, abstract)
        opt_sh = None if template is None else jax.tree.map(lambda _: one, template)
    else:
        model_sh = sharding.shardings(abstract, mesh, rules)
        opt_sh = None
        if template is not None:
            opt_sh = sharding.step_shardings(abstract, template, mesh, rules, None).opt
    out = {}
    for prefix, tree, shardings in (("model.", abstract, model_sh), ("opt.", template, opt_sh)):
        if tree is None:
            continue
        for (path, leaf), s in zip(
            jax.tree_util.tree_leaves_with_path(tree), jax.tree.leaves(shardings), strict=True
        ):
            out[prefix + dotted_name(path)] = jax.ShapeDtypeStruct(
                leaf.shape, leaf.dtype, sharding=s
            )
    return out
