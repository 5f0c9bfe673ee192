"""The weight files of a Hugging Face checkpoint folder: one `model.safetensors`, or the shards a
`model.safetensors.index.json` names; read whole and checked, and written atomically. Shared by
the zoo's Hugging Face formats (GPT-2, the Llama family), each raising its own checkpoint error."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

from .._io import (
    FileMissingError,
    as_path,
    atomic_write,
    cut,
    read_safetensors,
    read_text,
    write_safetensors,
)

__all__ = ["INDEX", "SINGLE", "as_float32", "checkpoint_folder", "read_weights", "write_weights"]

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
_SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
_FIX = "save it again with transformers (save_pretrained), or with the model's to_hf"
# The metadata transformers requires of a safetensors checkpoint ("pt": PyTorch's layout).
_METADATA = {"format": "pt"}
# An index names each tensor once (a few kB to a few MB); anything far larger is not one.
_MAX_INDEX_BYTES = 64 << 20


def _index(folder: Path, error: type) -> dict[str, str]:
    """The weight map of a sharded checkpoint: tensor name -> shard file (a name in `folder`)."""
    path = folder / INDEX
    try:
        index = json.loads(read_text(path, fix=_FIX, max_bytes=_MAX_INDEX_BYTES))
    except (ValueError, RecursionError):
        index = None
    weights = index.get("weight_map") if isinstance(index, dict) else None
    ok = isinstance(weights, dict) and all(
        isinstance(k, str) and isinstance(v, str) and Path(v).name == v and v not in ("", "..")
        for k, v in weights.items()
    )
    if not ok:
        raise error(
            f"`{cut(path)}` is not a shard index: a JSON object whose `weight_map` maps each "
            "tensor name to a file name in the same folder",
            fix=_FIX,
        )
    return weights


def read_weights(
    folder: Path, max_bytes: int, allow_nonfinite, error: type
) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint in `folder`, by its Hugging Face name.

    Raises:
        FileMissingError: (E1304) for a folder without weights in safetensors files.
        error: (the model's checkpoint error) for a malformed index, or shards that disagree
            with it.
        and the errors of reading a safetensors file (E1302, E1306, E1308).
    """
    if (folder / SINGLE).is_file():
        arrays, _ = read_safetensors(
            folder / SINGLE, fix=_FIX, max_bytes=max_bytes, allow_nonfinite=allow_nonfinite
        )
        return arrays
    if not (folder / INDEX).is_file():
        pickled = [p.name for p in folder.glob("*.bin")]
        raise FileMissingError(
            f"`{cut(folder)}` holds no {SINGLE} (nor {INDEX})"
            + (
                f", only {', '.join(pickled)}: pickles, which shapeml never loads"
                if pickled
                else ""
            ),
            fix="convert it with transformers: AutoModelForCausalLM.from_pretrained(folder)"
            ".save_pretrained(new_folder)"
            if pickled
            else "pass the folder that holds config.json and model.safetensors",
        )
    weights = _index(folder, error)
    arrays: dict[str, np.ndarray] = {}
    problems = []
    for file in sorted(set(weights.values())):
        budget = max_bytes - sum(a.nbytes for a in arrays.values())
        shard, _ = read_safetensors(
            folder / file, fix=_FIX, max_bytes=max(budget, 0), allow_nonfinite=allow_nonfinite
        )
        problems += [f"`{k}` is in `{file}` and in an earlier shard" for k in shard if k in arrays]
        arrays.update(shard)
        problems += [
            f"the index puts `{k}` in `{file}`, which does not hold it"
            for k, f in weights.items()
            if f == file and k not in shard
        ]
    if problems:
        raise error(
            f"the shards of `{cut(folder)}` disagree with its {INDEX}: {len(problems)} "
            "problem(s):\n    " + "\n    ".join(problems[:40]),
            fix=_FIX,
        )
    return arrays


def _shards(arrays: Mapping[str, np.ndarray], max_shard_bytes: int) -> list[list[str]]:
    """The names of each shard, in name order, each shard at most `max_shard_bytes` (or one
    tensor, when a tensor alone is larger)."""
    shards: list[list[str]] = [[]]
    size = 0
    for name in sorted(arrays):
        n = arrays[name].nbytes
        if shards[-1] and size + n > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    return shards


def write_weights(
    folder: Path, arrays: Mapping[str, np.ndarray], max_shard_bytes: int | None, allow_nonfinite
) -> None:
    """Writes the tensors as one `model.safetensors`, or as shards of at most `max_shard_bytes`
    with their index, each file atomically; then removes the weight files of the other layout
    (or of a run with more shards) that an earlier save left, so the folder holds one checkpoint."""
    total = sum(a.nbytes for a in arrays.values())
    if max_shard_bytes is None or total <= max_shard_bytes:
        write_safetensors(folder / SINGLE, arrays, _METADATA, allow_nonfinite=allow_nonfinite)
        written = {SINGLE}
    else:
        groups = _shards(arrays, max_shard_bytes)
        names = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
        for file, group in zip(names, groups):
            part = {k: arrays[k] for k in group}
            write_safetensors(folder / file, part, _METADATA, allow_nonfinite=allow_nonfinite)
        weight_map = {k: file for file, group in zip(names, groups) for k in group}
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        atomic_write(folder / INDEX, (json.dumps(index, indent=2) + "\n").encode())
        written = {INDEX, *names}
    for old in folder.iterdir():
        stale = old.name in (SINGLE, INDEX) or _SHARD.fullmatch(old.name)
        if stale and old.name not in written and old.is_file():
            old.unlink()


def as_float32(a: np.ndarray) -> np.ndarray:
    """Floating tensors as float32 (bfloat16 and float16 checkpoints load as float32); others as
    they are, for the report to name their dtype."""
    # jnp's test: numpy does not count ml_dtypes' bfloat16 as floating
    return a.astype(np.float32, copy=False) if jnp.issubdtype(a.dtype, jnp.floating) else a


def checkpoint_folder(path: Any) -> Path:
    """The folder of a Hugging Face checkpoint: `path` itself, or the folder of a file in it."""
    path = as_path(path)
    if path.is_file():
        return path.parent
    if not path.is_dir():
        raise FileMissingError(
            f"cannot read `{cut(path)}`: there is no such folder",
            fix="pass the folder that holds config.json and model.safetensors",
        )
    return path
