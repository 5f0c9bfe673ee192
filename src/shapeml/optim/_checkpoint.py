"""Training checkpoints: a model and its optimizer in one safetensors file, checked by name.

Entries are `model.<field>` and `opt.<tree path in the optimizer>` (`opt.state.0.mu.w1`,
`opt.step`): any optax state is saved by its tree paths. The optimizer's description (kind,
settings, options) goes in the metadata, so the built-in conveniences restore without a template;
any other optimizer restores into `like=opt`. Restores are bit for bit.
"""

from __future__ import annotations

import json
import os
import typing
from collections.abc import Collection
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from .._errors import ShapemlError
from .._io import read_safetensors, write_safetensors
from .._traceback import api_boundary
from .._validate import instance, shorten
from ..models import Dims, Model
from ..models._checkpoint import (
    CheckpointError,
    CheckpointModelError,
    entry_problems,
    model_from_arrays,
    model_metadata,
)
from ..models._entries import first_problems
from ..models._introspect import declared, dotted_name, statics, tensors
from ._config import check_header, rebuild
from ._errors import (
    OptimizerCheckpointError,
    OptimizerKindError,
    OptimizerMismatchError,
    OptionConflictError,
)
from ._optimizer import OPTIONS, Optimizer

__all__ = ["load_checkpoint", "save_checkpoint"]

_META = "shapeml.optimizer"


def _opt_entries(opt: Optimizer) -> dict[str, jax.Array]:
    leaves = jax.tree_util.tree_flatten_with_path(opt)[0]
    return {"opt." + dotted_name(path): v for path, v in leaves}


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def save_checkpoint(
    path: str | os.PathLike,
    m: Model,
    opt: Optimizer,
    *,
    allow_nonfinite: bool | Collection[str] = False,
) -> Path:
    """Saves a model and its optimizer's whole state atomically, to resume training exactly.

    Args:
        path: the file (its folder must exist).
        m, opt: the model and its optimizer.
        allow_nonfinite: True (or entry names such as `"model.w"`) to write NaN/inf on purpose;
            by default a state holding them is refused (E1307) and nothing is written.

    Example:
        >>> sm.save_checkpoint("run/last.safetensors", m, opt)
        >>> m, opt = sm.load_checkpoint("run/last.safetensors", Spotter)

    Raises:
        OptimizerMismatchError: (E1201) if `opt` is not an optimizer built for `m`'s class.
        NonFiniteError: (E1307) naming every entry holding NaN or an infinity.
    """
    instance("m", m, Model, "the sm.Model being trained")
    if not isinstance(opt, Optimizer) or opt.model_class is not type(m):
        raise OptimizerMismatchError(
            f"save_checkpoint(path, m, opt) got a `{type(opt).__name__}` for a `{type(m).__name__}`",
            fix="pass the optimizer built for this model",
        )
    arrays = {f"model.{k}": v for k, (_, v) in tensors(m).items()}
    arrays.update(_opt_entries(opt))
    meta = model_metadata(m)
    meta["shapeml.format"] = "checkpoint"
    meta[_META] = json.dumps(opt.config())
    return write_safetensors(path, arrays, meta, allow_nonfinite=allow_nonfinite)


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def load_checkpoint(
    path: str | os.PathLike,
    cls: type[Model],
    *,
    like: Optimizer | None = None,
    allow_nonfinite: bool | Collection[str] = False,
):
    """Loads `(model, optimizer)` saved by `save_checkpoint`, every entry checked.

    Args:
        path: the checkpoint.
        cls: the model class.
        like: an optimizer to fill: the template that gives the transformation (needed for
            `from_optax` optimizers and custom transforms; the conveniences rebuild themselves).
            Its kind must match the file's.
        allow_nonfinite: True (or entry names) to read NaN/inf without warning W1301.

    Raises:
        CheckpointModelError: (E1303) if `like` was built for a model with other dims than the
            file's, naming each (`D: file 64, model 32`) before the entries that differ.
        CheckpointError: (E1301) listing every missing, unexpected or mis-shaped entry at once.
        OptimizerCheckpointError: (E1205) for a missing, malformed or partial optimizer description.
        OptimizerKindError: (E1202) if `like` is another kind than the file's optimizer.
        OptimizerMismatchError: (E1201) if `like` is for another model class.
    """
    arrays, meta = read_safetensors(
        path,
        fix="re-save it with sm.save_checkpoint; if it was copied, check the copy finished",
        allow_nonfinite=allow_nonfinite,
    )
    if _META not in meta:
        raise CheckpointError(
            f"`{path}` holds no optimizer state (was it saved with sm.save?)",
            fix="load it with sm.load(path, Cls), or save with sm.save_checkpoint",
        )
    model_arrays = {k[len("model.") :]: v for k, v in arrays.items() if k.startswith("model.")}
    m = model_from_arrays(cls, model_arrays, meta, str(path))
    cfg = _parse(meta[_META], str(path))
    if like is not None:
        template = _check_like(like, cls, cfg, str(path))
    else:
        template = rebuild(m, cfg, str(path))
    expected_arrays = _opt_entries(template)
    expected = {k: (v.shape, v.dtype) for k, v in expected_arrays.items()}
    found = {k: v for k, v in arrays.items() if not k.startswith("model.")}
    problems = entry_problems(expected, found)
    if problems and like is not None and (dims := _dims_of(like, m)) is not None:
        diff = ", ".join(
            f"{k}: file {m.dims[k]}, model {dims[k]}" for k in m.dims.free if m.dims[k] != dims[k]
        )
        kwargs = ", ".join(f"{k}={m.dims[k]}" for k in m.dims.free if m.dims[k] != dims[k])
        raise CheckpointModelError(
            f"`{path}` was saved with other dims than the optimizer given as like= ({diff}): "
            f"{len(problems)} entries of its state differ:\n    "
            + "\n    ".join(first_problems(problems, 3)),
            fix=f"build like= from a model with the file's dims: {cls.__name__}.init(seed=0, {kwargs})",
        )
    if problems:
        raise CheckpointError(
            f"`{path}`'s optimizer state does not fit `{type(template).__name__}` "
            f"({_options(template)}; the file's: {_options(cfg)}): "
            f"{len(problems)} problem(s):\n    " + "\n    ".join(problems),
            fix="resume with the optimizer and options the checkpoint was saved with",
        )
    # Options that keep the state's structure would still resume a different run (another
    # accumulation count shifts every update boundary): they must match the file's.
    if any(cfg.get(k) != getattr(template, k) for k in OPTIONS):
        raise OptionConflictError(
            f"`{path}` was saved with {_options(cfg)}, but the template has {_options(template)}",
            fix="build the template with the options the run was saved with",
        )
    # Each leaf is filled from the entry of its own tree path, never by position.
    paths, treedef = jax.tree_util.tree_flatten_with_path(template)
    names = ["opt." + dotted_name(p) for p, _ in paths]
    return m, jax.tree_util.tree_unflatten(treedef, [jnp.asarray(found[n]) for n in names])


def _dims_of(like: Optimizer, m: Model) -> Dims | None:
    """The dims of the model `like` was built for, when they differ from the file's (`m.dims`)
    and explain every param shape `like` holds; else None.

    Each free dim is found on a param axis that is that dim itself (the axis grows by one with
    it), and the guess counts only if the whole model at those dims has `like`'s shapes.
    """
    want = {k: tuple(shape) for k, shape, _ in like.shapes}
    given = statics(m)

    def shapes_at(dims: Dims) -> dict[str, tuple[int, ...]]:
        found = declared(type(m), dims, given)
        return {k: tuple(shape) for k, (kind, shape, _) in found.items() if kind == "param"}

    try:
        base, guess = shapes_at(m.dims), {}
        for k in m.dims.free:
            grown = shapes_at(m.dims.resolve(**{k: m.dims[k] + 1}))
            for name, shape in base.items():
                if len(want.get(name, ())) == len(shape) == len(grown.get(name, ())):
                    for a, b, w in zip(shape, grown[name], want[name]):
                        if a == m.dims[k] and b == a + 1:
                            guess.setdefault(k, w)
        dims = m.dims.resolve(**guess)
        return dims if dims != m.dims and shapes_at(dims) == want else None
    except ShapemlError:  # a guess no model can have (a negative or oversized dim)
        return None


def _parse(text: str, source: str) -> Any:
    try:
        cfg = json.loads(text)
    except (ValueError, RecursionError):
        raise OptimizerCheckpointError(
            f"`{source}`'s optimizer description (metadata `{_META}`) is not JSON: {shorten(text)}",
            fix="re-save it with sm.save_checkpoint(path, m, opt)",
        ) from None
    return cfg


def _check_like(like: object, cls: type, cfg: object, source: str) -> Optimizer:
    if not isinstance(like, Optimizer):
        raise OptimizerKindError(
            f"load_checkpoint(..., like=) takes a shapeml optimizer, got {type(like).__name__}",
            fix="build it as in training: like=optim.adamw(m, ...) or optim.from_optax(m, tx)",
        )

    def bad(why: str) -> OptimizerCheckpointError:
        return OptimizerCheckpointError(
            f"`{source}`'s optimizer description (metadata `{_META}`) {why}",
            fix="re-save it with sm.save_checkpoint(path, m, opt)",
        )

    check_header(cfg, bad)
    if like.kind != cfg["kind"]:
        raise OptimizerKindError(
            f"`{source}` was saved with {cfg['kind']}, but a `{type(like).__name__}` "
            f"({like.kind}) was given",
            fix=f"build the optimizer the file was saved with ({cfg['kind']})",
        )
    if like.model_class is not cls:
        raise OptimizerMismatchError(
            f"`{type(like).__name__}` cannot hold the state of a `{cls.__name__}`",
            fix=f"build it from a {cls.__name__}",
        )
    return like


def _options(o) -> str:
    get = o.get if isinstance(o, dict) else lambda k: getattr(o, k)
    return ", ".join(f"{k}={get(k)}" for k in ("skip_nonfinite", "accumulate", "ema"))
