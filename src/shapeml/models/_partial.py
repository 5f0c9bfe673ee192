"""Partial loading, for fine-tuning: a checkpoint's entries that match the model are loaded, the
rest of the model is initialized (or kept from a template), and what was done is reported.

`sm.load(path, like=template, missing="keep", unexpected="ignore", mismatched="overlap")` is the
spelling; the policies say what each kind of mismatch does instead of raising E1301. This module
decides, entry by entry, and completes the arrays the checkpoint codec then builds the model from.
"""

from __future__ import annotations

import dataclasses
import typing
import warnings
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from .._errors import ArgumentError, ShapemlWarning, similar
from .._traceback import api_boundary, user_stacklevel
from .._validate import choice, instance
from ._checks import key_of, statics_of
from ._mapped import child_dims
from ._model import Model, field_hash

__all__ = ["LoadPolicy", "LoadReport", "PartialLoadWarning", "complete_entries", "load_policy"]

MISSING = ("error", "init", "keep")
UNEXPECTED = ("error", "ignore")
MISMATCHED = ("error", "skip", "overlap")


class PartialLoadWarning(
    ShapemlWarning,
    code="W1302",
    title="a checkpoint was loaded in part",
    explanation="""
A load with `missing=`, `unexpected=` or `mismatched=` policies did not load the whole model from the
file: some fields were initialized (or kept from `like=`), some file entries were ignored, or an
entry of another shape was loaded in part. The warning names each of them, so nothing is filled in
silently. It is what fine-tuning expects (a new head, a longer position table, another
vocabulary); check the list names only the fields you meant.

    m = sm.load(path, like=Classifier.init(seed=1), missing="keep", unexpected="ignore")
    m, report = sm.load(path, like=template, missing="keep", report=True)   # no warning: a report

Filter it like any warning (`warnings.simplefilter("ignore", sm.models.PartialLoadWarning)`), or
pass `report=True` to get the `LoadReport` instead.
""",
):
    pass


@dataclasses.dataclass(frozen=True)
class LoadPolicy:
    """What a load does with each kind of mismatch (see `sm.load`)."""

    missing: str = "error"  # a field the file lacks: "error", "init" (drawn) or "keep" (from like)
    unexpected: str = "error"  # an entry the model lacks: "error" or "ignore"
    mismatched: str = "error"  # an entry of another shape or dtype: "error", "skip" or "overlap"
    seed: Any = 0  # the seed `missing="init"` draws with, as `Cls.init(seed=...)`

    @property
    def strict(self) -> bool:
        return (self.missing, self.unexpected, self.mismatched) == ("error",) * 3


@typing.no_type_check  # validates its arguments itself, with coded errors
def load_policy(missing, unexpected, mismatched, seed, like) -> LoadPolicy:
    """The policy of a load's keywords, each checked (E0002 for a value out of its options)."""
    missing = choice("missing", missing, MISSING)
    unexpected = choice("unexpected", unexpected, UNEXPECTED)
    mismatched = choice("mismatched", mismatched, MISMATCHED)
    if missing == "keep" and like is None:
        raise ArgumentError(
            'missing="keep" keeps the fields the file lacks from a model, but no like= was given',
            fix='pass the model to keep them from: sm.load(path, like=template, missing="keep"); '
            'or draw them: sm.load(path, Cls, missing="init", seed=0)',
        )
    if mismatched != "error" and missing == "error":
        raise ArgumentError(
            f'mismatched="{mismatched}" fills the fields whose file entry has another shape as '
            'missing= says, but missing="error"',
            fix='pass missing="init" (or "keep" with like=) too',
        )
    if missing == "init":
        key_of(seed)  # a bad seed fails before the file is read
    return LoadPolicy(missing, unexpected, mismatched, seed)


@api_boundary
@dataclasses.dataclass(frozen=True)
class LoadReport:
    """What a partial load did, by dotted name (`str(report)` is the summary the warning shows).

    Attributes:
        source: the file (or folder) loaded.
        loaded: the fields loaded whole from the file.
        missing: the fields the file lacks, filled as `filled_from` says.
        unexpected: the file's entries the model does not declare (ignored).
        mismatched: `(name, file shape, model shape)` of each entry of another shape or dtype;
            its field is filled, and with `mismatched="overlap"` the overlapping block (the
            leading rows and columns) is then loaded from the file.
        overlapped: the mismatched names whose overlapping block was loaded.
        filled_from: `"init"` (drawn from the class's initializers with `seed`), `"like"` (kept
            from the `like=` model) or `""` when nothing was filled.
        seed: the seed of `"init"`.
    """

    source: str
    loaded: tuple[str, ...]
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    mismatched: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...]
    overlapped: tuple[str, ...]
    filled_from: str
    seed: Any = 0

    @property
    def partial(self) -> bool:
        """Whether anything was not loaded whole from the file."""
        return bool(self.missing or self.unexpected or self.mismatched)

    def __str__(self) -> str:
        total = len(self.loaded) + len(self.missing) + len(self.mismatched)
        lines = [f"`{self.source}`: loaded {len(self.loaded)} of the model's {total} tensors whole"]
        fill = (
            f"initialized (seed {self.seed})" if self.filled_from == "init" else "kept from like="
        )
        if self.missing:
            lines.append(f"{fill}, not in the file: {_names(self.missing)}")
        for name, file_shape, shape in self.mismatched:
            block = f"[{', '.join(f':{min(a, b)}' for a, b in zip(file_shape, shape))}]"
            if name not in self.overlapped:
                did = fill
            elif all(a >= b for a, b in zip(file_shape, shape)):
                did = f"loaded the file's {block}"
            else:
                did = f"loaded {block} from the file, the rest {fill.split(' (')[0]}"
            lines.append(f"`{name}`: file {_shape(file_shape)}, model {_shape(shape)}: {did}")
        if self.unexpected:
            lines.append(f"ignored, not in the model: {_names(self.unexpected)}")
        return "\n    ".join(lines)


def _shape(shape) -> str:
    return f"[{' '.join(map(str, shape))}]"


def _names(names, limit: int = 12) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _specs(cls: type[Model], dims, statics: Mapping[str, Any], prefix: str = "") -> dict:
    """Each tensor a `cls` with these dims and statics holds: dotted name -> (spec, shape), as
    `Model.init` walks them (so a drawn field equals `init`'s)."""
    own = statics_of(cls, statics, prefix)
    out = {}
    for name, spec in cls.__shapeml_fields__.items():
        if spec.kind in ("submodel", "submodels"):
            sub = child_dims(spec, dims)
            paths = (
                [f"{name}."]
                if spec.kind == "submodel"
                else [f"{name}.{i}." for i in range(spec.count_in(dims))]
            )
            options = {prefix + p + k: v for p in paths for k, v in spec.mapped.options_in(own)}
            merged = {**statics, **options}  # once: a copy per sub-model is quadratic
            for p in paths:
                inner = _specs(spec.model, sub, merged, prefix + p)
                out.update({p + k: v for k, v in inner.items()})
        elif spec.present(own):
            out[name] = (spec, spec.shape_in(dims))
    return out


def _draw(specs: Mapping[str, tuple], names: list[str], seed: Any) -> dict[str, np.ndarray]:
    """The named fields as `init(seed=seed)` draws them, in one compiled program."""
    if not names:
        return {}

    def draw(key):
        return {
            n: specs[n][0].init(
                jax.random.fold_in(key, field_hash(n)), specs[n][1], specs[n][0].dtype
            )
            for n in names
        }

    return {k: np.asarray(v) for k, v in jax.jit(draw)(key_of(seed)).items()}


def complete_entries(
    cls: type[Model],
    dims,
    statics: Mapping[str, Any],
    arrays: Mapping[str, Any],
    policy: LoadPolicy,
    source: str,
    like: Model | None,
) -> tuple[dict[str, Any], LoadReport, list[str]]:
    """The entries a `cls` with these dims is built from: the file's where they match, the rest
    filled as `policy` says; with the report, and the problems the policy leaves as errors."""
    specs = _specs(cls, dims, statics)
    kept = {}
    if like is not None and policy.missing == "keep":
        from ._introspect import tensors  # a model's tensors by name (imports no model module)

        kept = {k: v for k, (_, v) in tensors(like).items()}
    out: dict[str, Any] = {}
    problems, missing, mismatched, unexpected, overlap, loaded = [], [], [], [], [], []
    for name, (spec, shape) in specs.items():
        if name not in arrays:
            missing.append(name)
            continue
        a = arrays[name]
        if tuple(a.shape) == tuple(shape) and np.dtype(a.dtype) == np.dtype(spec.dtype):
            out[name] = a
            loaded.append(name)
        else:
            mismatched.append((name, tuple(a.shape), tuple(shape)))
            if policy.mismatched == "overlap" and len(a.shape) == len(shape):
                overlap.append(name)
    unexpected = [k for k in arrays if k not in specs]
    if policy.missing == "error":
        problems += [f"missing: `{n}` {_shape(specs[n][1])}" for n in missing]
    if policy.unexpected == "error":
        for n in unexpected:
            hint = similar(n, missing, what="missing entry") if len(missing) <= 64 else None
            problems.append(
                f"unexpected: `{n}` {_shape(arrays[n].shape)}" + (f" ({hint})" if hint else "")
            )
    if policy.mismatched == "error":
        problems += [
            f"wrong shape or dtype: `{n}` expected {_shape(s)} {np.dtype(specs[n][0].dtype).name}"
            f", file has {_shape(f)} {np.dtype(arrays[n].dtype).name}"
            for n, f, s in mismatched
        ]
    fill = [n for n in missing] + [n for n, _, _ in mismatched]
    if not problems:
        drawn = _draw(specs, fill, policy.seed) if policy.missing == "init" else {}
        for n in fill:
            value = drawn[n] if n in drawn else np.asarray(kept[n])
            if n in overlap:
                value = np.array(value)  # writable
                a = np.asarray(arrays[n])
                block = tuple(slice(0, min(x, y)) for x, y in zip(a.shape, value.shape))
                value[block] = a[block].astype(value.dtype)
            out[n] = value
    report = LoadReport(
        source=source,
        loaded=tuple(loaded),
        missing=tuple(missing),
        unexpected=tuple(unexpected),
        mismatched=tuple(mismatched),
        overlapped=tuple(overlap),
        filled_from=("" if not fill else "init" if policy.missing == "init" else "like"),
        seed=policy.seed,
    )
    return out, report, problems


def warn_partial(report: LoadReport) -> None:
    """W1302 with the report, located at the first frame outside shapeml (the user's call)."""
    w = PartialLoadWarning(
        str(report), fix="pass report=True to get the report instead of this warning"
    )
    w.report = report  # for a program that records warnings
    warnings.warn(w, stacklevel=user_stacklevel())


def check_report_flag(report: Any) -> bool:
    return instance("report", report, bool, "True or False")
