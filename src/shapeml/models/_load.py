"""`sm.load`: a model file read back, every entry checked, or, for fine-tuning, loaded in part
(what matches is loaded, the rest initialized or kept, and what was done reported)."""

from __future__ import annotations

import os
import typing
from collections.abc import Collection, Mapping
from typing import Any

from .._traceback import api_boundary
from ._checkpoint import CheckpointError, build_model, model_from_arrays, read_model_file
from ._entries import first_problems
from ._introspect import statics, tensors
from ._limits import check_size, max_bytes_of
from ._metadata import check_kinds, saved_dims, saved_statics
from ._model import Model
from ._partial import (
    LoadPolicy,
    LoadReport,
    check_report_flag,
    complete_entries,
    load_policy,
    warn_partial,
)

__all__ = ["load", "partial_model_from_arrays", "whole_report"]


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def load(
    path: str | os.PathLike,
    cls: type[Model] | None = None,
    *,
    like: Model | None = None,
    missing: str = "error",
    unexpected: str = "error",
    mismatched: str = "error",
    seed: Any = 0,
    report: bool = False,
    max_bytes: int | None = None,
    allow_nonfinite: bool | Collection[str] = False,
):
    """Loads a model saved by `sm.save`, checking every entry's name, shape and dtype.

    By default every entry must match (E1301). For fine-tuning, `missing`, `unexpected` and
    `mismatched` load what matches and fill the rest (partial loading): the model then has the
    class, dims and options of `like` (or `cls` in the file's dims), whatever class and dims
    the file was saved with, and what was not loaded whole is reported (W1302, or the returned
    `LoadReport` with `report=True`).

    Args:
        path: the checkpoint file.
        cls: the model class; its dims are taken from the file.
        like: instead of `cls`, a model whose class, dims and options the file must match (in a
            partial load: the template that decides them, and the values `"keep"` keeps).
        missing: a field the file lacks: `"error"`, `"init"` (drawn as `init(seed=seed)` draws
            it) or `"keep"` (`like`'s value).
        unexpected: an entry the model does not declare: `"error"` or `"ignore"`.
        mismatched: an entry of another shape or dtype: `"error"`, `"skip"` (the field is filled
            as `missing` says) or `"overlap"` (filled, then the block both shapes share, the
            leading rows and columns, loaded from the file: a longer position table keeps the
            file's rows).
        seed: the seed of `missing="init"` (a whole number or a `jax.random.key`).
        report: True to return `(model, LoadReport)` instead of warning W1302.
        max_bytes: the most the file's tensors and the model may hold, checked from the header
            and the dims before any tensor is read (default 16 GiB).
        allow_nonfinite: True (or the dotted names) to load NaN/inf values without warning.

    Returns:
        The model; `(model, LoadReport)` with `report=True`.

    Raises:
        CheckpointError: (E1301) listing every missing, unexpected, wrong-shape and wrong-dtype
            entry at once (those the policies leave as errors), with near-miss suggestions.
        CheckpointModelError: (E1303) if the file holds another class or other dims (not in a
            partial load).
        CheckpointFileError: (E1302) for a truncated, corrupted or non-safetensors file, or
            malformed shapeml metadata.
        FileMissingError: (E1304), FileAccessError: (E1306) for a missing or unreadable file.
        FileTooLargeError: (E1308), ModelTooLargeError: (E0906) beyond `max_bytes`.
        ArgumentTypeError: (E0003) for a `cls` that is not an sm.Model class, or a `like` that
            is not a model.
        ArgumentError: (E0002) for a policy out of its options, `missing="keep"` without
            `like`, or a `mismatched` other than "error" with `missing="error"`.

    Warns:
        NonFiniteWarning: (W1301) naming the tensors that hold NaN or an infinity.
        PartialLoadWarning: (W1302) naming every field filled and entry ignored, when a partial
            load did not load the whole model (not with `report=True`).

    Example:
        >>> m = sm.load("gpt.safetensors", GPT)
        >>> m = sm.load("gpt.safetensors", like=GPT.init(seed=1, T=256), missing="keep",
        ...             mismatched="overlap")    # a longer position table: the file's rows kept
    """
    policy = load_policy(missing, unexpected, mismatched, seed, like)
    want_report = check_report_flag(report)
    cls, arrays, meta, limit = read_model_file(path, cls, like, max_bytes, allow_nonfinite)
    if policy.strict:
        m = model_from_arrays(
            cls,
            arrays,
            meta,
            str(path),
            like_dims=like.dims if like else None,
            max_bytes=limit,
            like_statics=statics(like) if like else None,
        )
        return (m, whole_report(m, str(path))) if want_report else m
    m, done = partial_model_from_arrays(
        cls, arrays, meta, str(path), like=like, policy=policy, max_bytes=limit
    )
    if want_report:
        return m, done
    if done.partial:
        warn_partial(done)
    return m


def partial_model_from_arrays(
    cls: type[Model],
    arrays: Mapping[str, Any],
    meta: Mapping[str, str],
    source: str,
    *,
    like: Model | None,
    policy: LoadPolicy,
    max_bytes: int | None = None,
) -> tuple[Model, LoadReport]:
    """A partial load: a `cls` (in `like`'s dims and options, or the file's) from the entries
    that match it, the rest filled as `policy` says; with the report of what was done.

    The file's class and dims need not match (entries are matched by name); its metadata is
    still checked (E1302), and the model's size (E0906). What the policy leaves as errors is
    one E1301 listing them all.
    """
    check_kinds(meta, source)
    if like is not None:
        dims, saved = like.dims, statics(like)
    else:
        file_dims = saved_dims(meta, source)
        dims = cls.dims.resolve(**{k: v for k, v in file_dims.items() if k in cls.dims.free})
        saved = saved_statics(meta, source)
    check_size(cls, dims, max_bytes_of(max_bytes), f"loading `{source}`", saved)
    values, done, problems = complete_entries(cls, dims, saved, arrays, policy, source, like)
    if problems:
        raise CheckpointError(
            f"`{source}` does not match `{cls.__name__}` "
            f"({' '.join(f'{k}={v}' for k, v in dims.items())}): {len(problems)} problem(s) "
            "that the load's policies leave as errors:\n    "
            + "\n    ".join(first_problems(problems)),
            fix='allow what you meant: missing="init" (or "keep" with like=), '
            'unexpected="ignore", mismatched="skip" or "overlap"',
        )
    return build_model(cls, dims, values, "", saved), done


def whole_report(m: Model, source: str) -> LoadReport:
    """The report of a load that loaded every tensor of `m` whole."""
    return LoadReport(source, tuple(tensors(m)), (), (), (), (), "", 0)
