"""Training checkpoints: a model and its optimizer in one safetensors file, checked by name.

Entries are `model.<field>` and `opt.<path in the optimizer state>`; the optimizer's kind,
hyperparameters and schedule go in the metadata, so `load_checkpoint` can rebuild it and training
resumes bit for bit.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp

from .._files import read_safetensors, write_safetensors
from ..models import Model
from ..models._checkpoint import (
    CheckpointError,
    entry_problems,
    model_from_arrays,
    model_metadata,
)
from ..models._introspect import dotted_name, tensors
from ._errors import OptimizerKindError, OptimizerMismatchError
from ._optimizer import Optimizer, adamw, sgd
from ._schedules import from_config
from ._transforms import clip_norm

__all__ = ["load_checkpoint", "save_checkpoint"]


def _opt_entries(opt: Optimizer) -> dict[str, jax.Array]:
    leaves = jax.tree_util.tree_flatten_with_path(opt)[0]
    return {"opt." + dotted_name(path): v for path, v in leaves}


def save_checkpoint(path: str | os.PathLike, m: Model, opt: Optimizer) -> Path:
    """Saves a model and its optimizer state atomically, to resume training exactly.

    Example:
        >>> sm.save_checkpoint("run/last.safetensors", m, opt)
        >>> m, opt = sm.load_checkpoint("run/last.safetensors", Spotter)
    """
    if not isinstance(opt, Optimizer) or opt.model_class is not type(m):
        raise OptimizerMismatchError(
            f"save_checkpoint(path, m, opt) got a `{type(opt).__name__}` for a `{type(m).__name__}`",
            fix="pass the optimizer built for this model",
        )
    arrays = {f"model.{k}": v for k, (_, v) in tensors(m).items()}
    arrays.update(_opt_entries(opt))
    meta = model_metadata(m)
    meta["shapeml.format"] = "checkpoint"
    try:
        meta["shapeml.optimizer"] = json.dumps(opt.config())
    except (TypeError, AttributeError):  # a user's own transform cannot be described: like=opt
        meta["shapeml.optimizer"] = json.dumps({"kind": opt.kind, "rebuildable": False})
    return write_safetensors(path, arrays, meta)


def _rebuild(m: Model, cfg: dict) -> Optimizer:
    kind = cfg.get("kind")
    if cfg.get("rebuildable") is False:
        raise CheckpointError(
            "this checkpoint's optimizer uses a custom gradient transform, which cannot be rebuilt "
            "from the file",
            fix="build the optimizer as in training and pass it: load_checkpoint(path, M, like=opt)",
        )
    transforms = [clip_norm(t["max_norm"]) for t in cfg["transforms"]]
    common = dict(
        lr=from_config(cfg["lr"]),
        transforms=transforms,
        skip_nonfinite=cfg["skip_nonfinite"],
        weight_decay=cfg["weight_decay"],
    )
    if kind == "adamw":
        return adamw(m, b1=cfg["b1"], b2=cfg["b2"], eps=cfg["eps"], **common)
    if kind == "sgd":
        return sgd(m, momentum=cfg["momentum"], nesterov=cfg["nesterov"], **common)
    raise CheckpointError(
        f"unknown optimizer kind {kind!r} in the checkpoint",
        fix="re-save it with sm.save_checkpoint",
    )


def load_checkpoint(path: str | os.PathLike, cls: type[Model], *, like: Optimizer | None = None):
    """Loads `(model, optimizer)` saved by `save_checkpoint`, every entry checked.

    Args:
        path: the checkpoint.
        cls: the model class.
        like: an optimizer to fill (needed when training used a custom transform); its kind
            must match the file's.

    Raises:
        CheckpointError: (E1301) listing every missing, unexpected or mis-shaped entry.
        OptimizerKindError: (E1202) if `like` is another kind than the file's optimizer.
    """
    arrays, meta = read_safetensors(path)
    model_arrays = {k[len("model.") :]: v for k, v in arrays.items() if k.startswith("model.")}
    opt_arrays = {k: v for k, v in arrays.items() if k.startswith("opt.")}
    other = [k for k in arrays if k not in opt_arrays and not k.startswith("model.")]
    if "shapeml.optimizer" not in meta:
        raise CheckpointError(
            f"`{path}` holds no optimizer state (was it saved with sm.save?)",
            fix="load it with sm.load(path, Cls), or save with sm.save_checkpoint",
        )
    m = model_from_arrays(cls, model_arrays, meta, str(path))
    cfg = json.loads(meta["shapeml.optimizer"])
    if like is not None:
        if like.kind != cfg.get("kind"):
            raise OptimizerKindError(
                f"`{path}` was saved with {cfg.get('kind')}, but a `{type(like).__name__}` was given",
                fix=f"build the optimizer with optim.{cfg.get('kind')}(m, ...)",
            )
        if like.model_class is not cls:
            raise OptimizerMismatchError(
                f"`{type(like).__name__}` cannot hold the state of a `{cls.__name__}`",
                fix=f"build it from a {cls.__name__}",
            )
        template = like
    else:
        template = _rebuild(m, cfg)
    expected_arrays = _opt_entries(template)
    expected = {k: (v.shape, v.dtype) for k, v in expected_arrays.items()}
    problems = entry_problems(expected, {**opt_arrays, **{k: arrays[k] for k in other}})
    if problems:
        raise CheckpointError(
            f"`{path}`'s optimizer state does not match `{type(template).__name__}`: "
            f"{len(problems)} problem(s):\n    " + "\n    ".join(problems),
            fix="resume with the optimizer kind and settings the checkpoint was saved with",
        )
    leaves, treedef = jax.tree_util.tree_flatten(template)
    names = list(expected_arrays)
    opt = jax.tree_util.tree_unflatten(treedef, [jnp.asarray(opt_arrays[n]) for n in names])
    del leaves
    return m, opt
