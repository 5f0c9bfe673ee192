"""Llama-family checkpoints in the Hugging Face format, in (`from_hf`) and out (`to_hf`):
`config.json` for the dims and options, safetensors files for the tensors, each mapped by name
onto the shapeml fields; and the tokenizer a `tokenizer.json` describes (`load_tokenizer`)."""

from __future__ import annotations

import json
import os
import typing
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np

from ..._io import (
    FileMissingError,
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
from ...models._introspect import declared, statics, tensors
from ...models._limits import check_size, max_bytes_of
from ...models._load import partial_model_from_arrays, whole_report
from ...models._partial import check_report_flag, load_policy, warn_partial
from .._hf_files import as_float32, checkpoint_folder, read_weights, write_weights
from ._config import DIM_KEYS, Config, config_json, read_config
from ._errors import LlamaCheckpointError
from ._model import Llama, options
from ._names import HEAD, hf_to_field

__all__ = ["from_hf", "load_tokenizer", "to_hf"]

_F32 = np.dtype(np.float32)
# Buffers some checkpoints carry that are constants of the code, not weights.
_CONSTANTS = ".rotary_emb.inv_freq"


def _statics(config: Config) -> dict[str, Any]:
    """Every static of the model the config describes, by dotted name (as `sm.save` keeps
    them): the model's own and each layer's."""
    opts = config.layer_options
    out = dict(config.statics)
    out["norm.eps"] = opts["eps"]
    for i in range(config.dims["L"]):
        p = f"layers.{i}."
        out.update({p + "attn_norm.eps": opts["eps"], p + "mlp_norm.eps": opts["eps"]})
        out.update({p + "attn.theta": opts["theta"], p + "attn.window": opts["window"]})
        for proj in "qkv":
            out[f"{p}attn.{proj}.bias"] = opts["qkv_bias"]
        out[p + "attn.o.bias"] = opts["o_bias"]
    return out


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def from_hf(
    path: str | os.PathLike,
    *,
    like: Llama | None = None,
    missing: str = "error",
    unexpected: str = "error",
    mismatched: str = "error",
    seed: Any = 0,
    report: bool = False,
    max_bytes: int | None = None,
    allow_nonfinite: bool | Collection[str] = False,
):
    """A `Llama` from a Hugging Face Llama, Qwen2 or Mistral checkpoint: `config.json` and
    `model.safetensors` (or the shards its `model.safetensors.index.json` names).

    The dims and options come from the config (see `shapeml explain E2006`); every tensor is
    mapped by name and checked against them, and every missing, unexpected or misshapen tensor
    is reported at once. The logits then equal `transformers`' for the same checkpoint.
    Half-precision tensors load as float32. Nothing is ever unpickled.

    For fine-tuning in other dims (another vocabulary, fewer layers), the policies of `sm.load`
    apply: `like` is the template whose dims and options the model takes, and what matches by
    name is loaded.

    Args:
        path: the checkpoint's folder (or a file in it).
        like: a `Llama` whose dims the model takes (a partial load).
        missing, unexpected, mismatched, seed, report: partial loading, as in `sm.load` (in the
            report, fields by their shapeml names; entries of no field by their own).
        max_bytes: the most the checkpoint's tensors may hold (default 16 GiB).
        allow_nonfinite: True (or the Hugging Face names) to load NaN/inf values without warning.

    Returns:
        The model; `(model, LoadReport)` with `report=True`.

    Raises:
        LlamaConfigError: (E2006) for a config that is not a model shapeml can hold.
        LlamaCheckpointError: (E2007) listing every tensor that does not match the config.
        CheckpointError: (E1301) in a partial load, for what the policies leave as errors.
        FileMissingError: (E1304) for a folder without `config.json` or safetensors weights.
        ModelTooLargeError: (E0906) for a config whose model would hold more than `max_bytes`.
        and the errors of reading a safetensors file (E1302, E1306, E1308).

    Example:
        >>> m = llama.from_hf("SmolLM2-135M/")   # huggingface-cli download ... --local-dir ...
    """
    policy = load_policy(missing, unexpected, mismatched, seed, like)
    want_report = check_report_flag(report)
    if like is not None:
        instance("like", like, Llama, "a Llama (the template of a partial load)")
    folder = checkpoint_folder(path)
    config = read_config(folder)
    dims, tied = config.dims, config.statics["tied"]
    limit = max_bytes_of(max_bytes)
    saved = _statics(config)
    # The config's dims are checked before they size anything (a config of 10**9 layers).
    check_size(Llama, Llama.dims.resolve(**dims), limit, f"reading `{cut(folder)}`", saved)
    files = read_weights(folder, limit, allow_nonfinite, LlamaCheckpointError)
    named = {k: as_float32(a) for k, a in files.items() if not k.endswith(_CONSTANTS)}
    fields = hf_to_field(dims["L"], tied)
    problems = []
    if tied and HEAD in named:
        head = named.pop(HEAD)
        embed = named.get("model.embed_tokens.weight")
        if embed is not None and not np.array_equal(head, embed):
            problems.append(
                f"`{HEAD}` differs from `model.embed_tokens.weight`, but the config ties the "
                "head to the embeddings (tie_word_embeddings true)"
            )
    arrays = {}
    for k, a in named.items():
        field, transposed = fields.get(k, (k, False))
        arrays[field] = np.ascontiguousarray(a.T) if transposed and a.ndim == 2 else a
    meta = {
        "shapeml.dims": json.dumps(dims),
        "shapeml.static": json.dumps(saved),
    }
    source = str(folder)
    if policy.strict:
        _check(named, config, saved, fields, problems, source)
        m = model_from_arrays(Llama, arrays, meta, source, max_bytes=limit)
        return (m, whole_report(m, source)) if want_report else m
    m, done = partial_model_from_arrays(
        Llama, arrays, meta, source, like=like, policy=policy, max_bytes=limit
    )
    if want_report:
        return m, done
    if done.partial:
        warn_partial(done)
    return m


def _check(named, config: Config, saved, fields, problems, source) -> None:
    """E2007 listing every tensor that differs from what the config declares, in the file's
    names (the tied head was compared with the embeddings already)."""
    dims = Llama.dims.resolve(**config.dims)
    shapes = {k: (shape, dtype) for k, (_, shape, dtype) in declared(Llama, dims, saved).items()}
    expected = {}
    for hf, (field, transposed) in fields.items():
        if field in shapes:
            shape, _ = shapes[field]
            expected[hf] = (tuple(reversed(shape)) if transposed else shape, _F32)
    problems = problems + entry_problems(expected, named)
    if problems:
        given = " ".join(f"{key}={config.dims[dim]}" for dim, key in DIM_KEYS.items())
        given += f" num_key_value_heads={config.dims['K']} head_dim={config.dims['Dh']}"
        raise LlamaCheckpointError(
            f"`{source}` does not match its config.json ({given}): {len(problems)} "
            "problem(s):\n    " + "\n    ".join(first_problems(problems)),
            fix="check that config.json belongs to these weights; a checkpoint fine-tuned to "
            'other dims loads with from_hf(path, like=Llama.init(...), missing="keep", '
            'mismatched="overlap")',
        )


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def to_hf(
    m: Llama,
    path: str | os.PathLike,
    *,
    max_shard_bytes: int | None = None,
    allow_nonfinite: bool | Collection[str] = False,
) -> Path:
    """Writes `m` as a Hugging Face checkpoint of its family that `transformers` loads
    (`AutoModelForCausalLM.from_pretrained(path)`): `config.json` and `model.safetensors`, named
    and laid out as `save_pretrained` writes them (a tied head is not written).

    Every file is written atomically, the weights first and `config.json` last; the weight files
    of an earlier save into the folder that this one does not rewrite are removed. The folder is
    created if it does not exist (its parent must).

    Args:
        m: the model (a LoRA model is merged first: `lora.merge(m)`).
        path: the folder.
        max_shard_bytes: split the weights into shards of at most this many bytes, with a
            `model.safetensors.index.json` (default: one file).
        allow_nonfinite: True (or the Hugging Face names) to write NaN/inf values anyway.

    Returns:
        The folder.

    Raises:
        LlamaConfigError: (E2006) for options the family's config cannot hold.
        ArgumentError: (E0002) for layers built with different options.
        NonFiniteError: (E1307) naming every tensor holding NaN or an infinity.
        FolderMissingError: (E1305), FileAccessError: (E1306) when the folder cannot be written.

    Example:
        >>> llama.to_hf(lora.merge(m), "finetuned/")
    """
    instance("m", m, Llama, "a Llama")
    if max_shard_bytes is not None:
        max_shard_bytes = integer("max_shard_bytes", max_shard_bytes, low=1)
    folder = as_path(path)
    own = {field: (hf, t) for hf, (field, t) in hf_to_field(m.dims.L, m.tied).items()}
    found = statics(m)
    top = {k: found[k] for k in ("tied", "family", "bos_token_id", "eos_token_id")}
    dims = {k: m.dims[k] for k in ("V", "T", "D", "H", "K", "Dh", "F", "L")}
    config = config_json(dims, top, options(m))  # before anything is written
    arrays = {}
    for k, (_, v) in tensors(m).items():
        hf, transposed = own[k]
        a = np.asarray(v)
        arrays[hf] = np.ascontiguousarray(a.T) if transposed else a
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
    atomic_write(folder / "config.json", config.encode())
    return folder


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def load_tokenizer(path: str | os.PathLike):
    """The tokenizer of a checkpoint folder, from its `tokenizer.json`, through the `tokenizers`
    library (`pip install tokenizers`; shapeml itself does not depend on it).

    Returns:
        A `tokenizers.Tokenizer`: `tok.encode(text).ids`, `tok.decode(ids)`.

    Raises:
        FileMissingError: (E1304) for a folder without `tokenizer.json`, or without the
            `tokenizers` library.

    Example:
        >>> tok = llama.load_tokenizer("SmolLM2-135M/")
        >>> ids = jnp.asarray([tok.encode("Once upon a time").ids])
        >>> print(tok.decode(llama.generate(m, ids, 20)[0].tolist()))
    """
    folder = checkpoint_folder(path)
    file = folder / "tokenizer.json"
    if not file.is_file():
        raise FileMissingError(
            f"`{cut(folder)}` holds no tokenizer.json",
            fix="download the checkpoint's tokenizer.json into the folder (older checkpoints "
            "convert with transformers: AutoTokenizer.from_pretrained(folder).save_pretrained("
            "folder))",
        )
    try:
        import tokenizers  # optional: only this function reads tokenizers
    except ImportError:
        raise FileMissingError(
            f"reading `{cut(file)}` needs the `tokenizers` library, which is not installed",
            fix="pip install tokenizers (or: pip install 'shapeml[hf]')",
        ) from None
    return tokenizers.Tokenizer.from_file(str(file))
