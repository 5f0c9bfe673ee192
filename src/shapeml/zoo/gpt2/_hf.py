"""GPT-2 checkpoints in the Hugging Face format, in (`from_hf`) and out (`to_hf`): `config.json`
for the dims, safetensors files for the tensors, each mapped by name onto the shapeml fields."""

from __future__ import annotations

import json
import os
import typing
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np

from ..._io import (
    NonFiniteError,
    access_error,
    allowed_nonfinite,
    as_path,
    atomic_write,
    check_writable,
    cut,
    names_text,
    nonfinite,
)
from ..._traceback import api_boundary
from ..._validate import instance, integer
from ...models._checkpoint import model_from_arrays
from ...models._entries import entry_problems, first_problems
from ...models._introspect import declared, tensors
from ...models._limits import check_size, max_bytes_of
from ...models._load import partial_model_from_arrays, whole_report
from ...models._partial import check_report_flag, load_policy, warn_partial
from .._hf_files import as_float32, checkpoint_folder, read_weights, write_weights
from ._config import DIM_KEYS, config_json, read_config
from ._errors import HFCheckpointError
from ._model import GPT2
from ._names import BUFFERS, HEAD, PREFIX, hf_to_field, split_prefix

__all__ = ["from_hf", "to_hf"]

_F32 = np.dtype(np.float32)


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def from_hf(
    path: str | os.PathLike,
    *,
    like: GPT2 | None = None,
    missing: str = "error",
    unexpected: str = "error",
    mismatched: str = "error",
    seed: Any = 0,
    report: bool = False,
    max_bytes: int | None = None,
    allow_nonfinite: bool | Collection[str] = False,
):
    """A `GPT2` from a Hugging Face checkpoint: `config.json` and `model.safetensors` (or the
    shards its `model.safetensors.index.json` names).

    The dims come from the config (`vocab_size`, `n_positions`, `n_embd`, `n_head`, `n_layer`,
    `n_inner`); every tensor is mapped by name (with or without the `transformer.` prefix) and
    checked against them, and every missing, unexpected or misshapen tensor is reported at once.
    The logits then equal `transformers.GPT2LMHeadModel`'s. Nothing is ever unpickled.

    For fine-tuning in other dims (another vocabulary, a longer or shorter context, fewer
    blocks), the policies of `sm.load` apply: `like` is the template whose dims the model
    takes, and what matches by name is loaded (see `shapeml.models.load`).

    Args:
        path: the checkpoint's folder (or a file in it).
        like: a `GPT2` whose dims the model takes (a partial load).
        missing, unexpected, mismatched, seed, report: partial loading, as in `sm.load`
            (in the report, fields by their shapeml names; entries of no field by their own).
        max_bytes: the most the checkpoint's tensors may hold (default 16 GiB).
        allow_nonfinite: True (or the Hugging Face names) to load NaN/inf values without warning.

    Returns:
        The model; `(model, LoadReport)` with `report=True`.

    Raises:
        HFConfigError: (E2004) for a config that is not a GPT-2 shapeml can hold.
        HFCheckpointError: (E2005) listing every tensor that does not match the config.
        CheckpointError: (E1301) in a partial load, for what the policies leave as errors.
        FileMissingError: (E1304) for a folder without `config.json` or safetensors weights.
        ModelTooLargeError: (E0906) for a config whose model would hold more than `max_bytes`.
        and the errors of reading a safetensors file (E1302, E1306, E1308).

    Example:
        >>> m = gpt2.from_hf("gpt2/")       # e.g. `huggingface-cli download gpt2 --local-dir gpt2`
    """
    policy = load_policy(missing, unexpected, mismatched, seed, like)
    want_report = check_report_flag(report)
    if like is not None:
        instance("like", like, GPT2, "a GPT2 (the template of a partial load)")
    folder = checkpoint_folder(path)
    dims = read_config(folder)
    limit = max_bytes_of(max_bytes)
    # The config's dims are checked before they size anything (a config of 10**9 layers).
    check_size(GPT2, GPT2.dims.resolve(**dims), limit, f"reading `{cut(folder)}`")
    files = read_weights(folder, limit, allow_nonfinite, HFCheckpointError)
    prefix = split_prefix(files)
    fields = hf_to_field(dims["L"])
    skipped = {k for k in files if BUFFERS.fullmatch(k.removeprefix(prefix))}
    head = files.get(HEAD)
    named = {k: as_float32(a) for k, a in files.items() if k not in skipped and k != HEAD}
    wte = named.get(f"{prefix}wte.weight")
    tied = head is not None and wte is not None and np.array_equal(as_float32(head), wte)
    if head is not None and not tied:
        named[HEAD] = as_float32(head)  # an untied head: reported, never dropped in silence
    arrays = {fields.get(k.removeprefix(prefix), k): a for k, a in named.items()}
    meta = {"shapeml.dims": json.dumps(dims)}
    source = str(folder)
    if policy.strict:
        _check(named, dims, prefix, fields, source)
        m = model_from_arrays(GPT2, arrays, meta, source, max_bytes=limit)
        return (m, whole_report(m, source)) if want_report else m
    m, done = partial_model_from_arrays(
        GPT2, arrays, meta, source, like=like, policy=policy, max_bytes=limit
    )
    if want_report:
        return m, done
    if done.partial:
        warn_partial(done)
    return m


def _check(named, dims, prefix, fields, source) -> None:
    """E2005 listing every tensor that differs from what the config declares, in the file's
    names (a tied `lm_head.weight` and old mask buffers were set aside already)."""
    shapes = {k: shape for k, (_, shape, _) in declared(GPT2, GPT2.dims.resolve(**dims)).items()}
    expected = {prefix + hf: (shapes[field], _F32) for hf, field in fields.items()}
    problems = entry_problems(expected, named)
    tied = f": it differs from `{prefix}wte.weight`, and GPT-2's head is the token table"
    problems = [p + tied if f"`{HEAD}`" in p else p for p in problems]
    if problems:
        given = " ".join(f"{key}={dims[dim]}" for dim, key in DIM_KEYS.items())
        raise HFCheckpointError(
            f"`{source}` does not match its config.json ({given} n_inner={dims['F']}): "
            f"{len(problems)} problem(s):\n    " + "\n    ".join(first_problems(problems)),
            fix="check that config.json belongs to these weights; a checkpoint fine-tuned to "
            'other dims loads with from_hf(path, like=GPT2.init(...), missing="keep", '
            'mismatched="overlap")',
        )


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def to_hf(
    m: GPT2,
    path: str | os.PathLike,
    *,
    max_shard_bytes: int | None = None,
    allow_nonfinite: bool | Collection[str] = False,
) -> Path:
    """Writes `m` as a Hugging Face GPT-2 checkpoint that `transformers` loads
    (`GPT2LMHeadModel.from_pretrained(path)`): `config.json` and `model.safetensors`, named as
    `save_pretrained` names them (the tied head is not written).

    Every file is written atomically, the weights first and `config.json` last; the weight files
    of an earlier save into the folder that this one does not rewrite are removed. The folder is
    created if it does not exist (its parent must).

    Args:
        m: the model.
        path: the folder.
        max_shard_bytes: split the weights into shards of at most this many bytes, with a
            `model.safetensors.index.json` (default: one file).
        allow_nonfinite: True (or the Hugging Face names) to write NaN/inf values anyway.

    Returns:
        The folder.

    Raises:
        NonFiniteError: (E1307) naming every tensor holding NaN or an infinity.
        FolderMissingError: (E1305), FileAccessError: (E1306) when the folder cannot be written.

    Example:
        >>> gpt2.to_hf(m, "finetuned/")      # then GPT2LMHeadModel.from_pretrained("finetuned/")
    """
    instance("m", m, GPT2, "a GPT2")
    if max_shard_bytes is not None:
        max_shard_bytes = integer("max_shard_bytes", max_shard_bytes, low=1)
    folder = as_path(path)
    own = {field: hf for hf, field in hf_to_field(m.dims.L).items()}
    arrays = {PREFIX + own[k]: np.asarray(v) for k, (_, v) in tensors(m).items()}
    if bad := nonfinite(arrays, allowed_nonfinite(allow_nonfinite)):  # before any folder is made
        raise NonFiniteError(
            f"refusing to write `{cut(folder)}`: {names_text(bad)} hold NaN or infinite values",
            fix="train from the last good checkpoint with a lower learning rate or clipped "
            "gradients; to write them on purpose pass allow_nonfinite=True (or the names)",
        )
    if not folder.is_dir():
        check_writable(folder)  # its parent exists and is writable; the folder is no folder yet
        try:
            folder.mkdir()
        except OSError as e:
            raise access_error(folder, "create the folder", e) from e
    check_writable(folder / "config.json")
    write_weights(folder, arrays, max_shard_bytes, allow_nonfinite)
    dims = {k: m.dims[k] for k in ("V", "T", "D", "H", "L", "F")}
    atomic_write(folder / "config.json", config_json(dims).encode())
    return folder
