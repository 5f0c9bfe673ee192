"""An optimizer's description in checkpoint metadata: written by `Optimizer.config`, read by
`rebuild`.

The description is JSON: the kind, the convenience's settings (numbers, schedules, masks, clip_norm
transforms) and the options. `rebuild` checks every part before it builds anything, and reports a
malformed or partial description as one coded error (E1205) naming the file and the part.
"""

from __future__ import annotations

import inspect
from typing import Any

from .._errors import ShapemlError
from .._validate import shorten
from ..models import Model
from ..models._checkpoint import CheckpointError
from ._aliases import PUBLIC
from ._errors import OptimizerCheckpointError
from ._masks import mask_from_config
from ._optimizer import FORMAT, OPTIONS, Optimizer
from ._schedules import from_config
from ._transforms import clip_norm

__all__ = ["check_header", "rebuild"]


def _decode(name: str, value: Any) -> Any:
    if not isinstance(value, dict):
        return value  # numbers and flags: the convenience checks them
    if len(value) != 1:
        raise ValueError(f"setting `{name}` is {shorten(value)}, which describes no value")
    ((tag, inner),) = value.items()
    if tag == "schedule":
        return from_config(inner)
    if tag == "mask":
        return mask_from_config(inner)
    if tag == "transforms" and isinstance(inner, list):
        out = []
        for t in inner:
            if (
                not (isinstance(t, dict) and set(t) == {"kind", "max_norm"})
                or t["kind"] != "clip_norm"
            ):
                raise ValueError(f"not a transform description: {shorten(t)}")
            out.append(clip_norm(t["max_norm"]))
        return tuple(out)
    raise ValueError(f"setting `{name}` is {shorten(value)}, which describes no value")


def rebuild(m: Model, cfg: Any, source: str) -> Optimizer:
    """The optimizer a checkpoint's description names, built fresh for `m`.

    Raises:
        OptimizerCheckpointError: (E1205) for a malformed, partial or refused description.
        CheckpointError: (E1301) when the optimizer cannot be rebuilt without `like=`.
    """

    def bad(why: str) -> OptimizerCheckpointError:
        return OptimizerCheckpointError(
            f"`{source}`'s optimizer description (metadata `shapeml.optimizer`) {why}",
            fix="re-save it with sm.save_checkpoint(path, m, opt), or build the optimizer as in "
            "training and pass it: sm.load_checkpoint(path, Cls, like=opt)",
        )

    check_header(cfg, bad)
    kind = cfg["kind"]
    if cfg.get("rebuildable") is False or kind not in PUBLIC:
        if kind != "optax" and kind not in PUBLIC:
            raise bad(f"names an unknown optimizer kind {shorten(kind)}")
        raise CheckpointError(
            f"`{source}`'s optimizer ({kind}) uses a custom transformation, schedule or mask, "
            "which cannot be rebuilt from the file",
            fix="build the optimizer as in training and pass it: load_checkpoint(path, M, like=opt)",
        )
    settings = cfg.get("settings")
    if not isinstance(settings, dict):
        raise bad(f"has no `settings` object (got {shorten(settings)})")
    fn = PUBLIC[kind]
    params = inspect.signature(fn).parameters
    allowed = {k for k in params if k not in ("m", *OPTIONS)}
    # Every setting must be there: a default filled in for a lost one would resume another run.
    unknown, missing = sorted(set(settings) - allowed), sorted(allowed - set(settings))
    if unknown or missing:
        raise bad(f"for {kind} has unknown settings {unknown} and lacks the settings {missing}")
    try:
        decoded = {k: _decode(k, v) for k, v in settings.items()}
        return fn(m, **decoded, **{k: cfg[k] for k in OPTIONS})
    except (ShapemlError, ValueError, TypeError, OverflowError) as e:
        why = e.message if isinstance(e, ShapemlError) else str(e)
        raise bad(f"holds a setting {kind} refuses: {why}") from None


def check_header(cfg: Any, bad) -> None:
    """The parts every description has: format, kind and options (raises `bad(why)`)."""
    if not isinstance(cfg, dict):
        raise bad(f"is not a JSON object (got {shorten(cfg)})")
    if cfg.get("format") != FORMAT:
        raise bad(
            f"has format {shorten(cfg.get('format'))}; this shapeml reads format {FORMAT} "
            "(checkpoints written before optimizers took any optax transformation)"
        )
    if not isinstance(cfg.get("kind"), str):
        raise bad(f"names no optimizer kind (got {shorten(cfg.get('kind'))})")
    absent = [k for k in OPTIONS if k not in cfg]
    if absent:
        raise bad(f"lacks the options {absent}")
