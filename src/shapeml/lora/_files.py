"""LoRA adapters alone in a small safetensors file: `lora.save` writes each adapter's `lora_a` and
`lora_b` with its layer's dims, rank and scale in the metadata; `lora.load` checks the file against
a base model and applies it."""

from __future__ import annotations

import json
import os
import typing
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np

from .._io import read_safetensors, write_safetensors
from .._traceback import api_boundary
from .._validate import instance, shorten
from ..models import Model
from ..models._entries import entry_problems, first_problems
from ._apply import adapters, build, linears
from ._errors import LoRAFileError, LoRATargetError
from ._linear import Linear

__all__ = ["load", "save"]

_FORMAT = "shapeml.lora"
_FIX = "save the adapters with lora.save(path, m), and load them into the base they were trained on"


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def save(
    path: str | os.PathLike, m: Model, *, allow_nonfinite: bool | Collection[str] = False
) -> Path:
    """Writes the adapters of `m` alone (`<layer>.lora_a`, `<layer>.lora_b`), atomically, with
    each layer's `In`, `Out`, rank, alpha and rslora in the metadata: a file of a few hundred
    kB for a model of hundreds of MB.

    Returns:
        The path written.

    Raises:
        LoRATargetError: (E2301) for a model without adapters.
        NonFiniteError: (E1307) naming every adapter holding NaN or an infinity.

    Example:
        >>> lora.save("adapters.safetensors", m)
        >>> m2 = lora.load("adapters.safetensors", llama.from_hf("ckpt/"))
    """
    instance("m", m, Model, "an sm.Model")
    found = adapters(m)
    if not found:
        raise LoRATargetError(
            f"`{type(m).__name__}` holds no LoRA adapters to save",
            fix="apply them first: m = lora.apply(m, ['*.attn.q', '*.attn.v'], rank=8)",
        )
    arrays, layers = {}, {}
    for name, layer in found.items():
        arrays[f"{name}.lora_a"] = np.asarray(layer.lora_a)
        arrays[f"{name}.lora_b"] = np.asarray(layer.lora_b)
        d = layer.dims
        layers[name] = {"In": d.In, "Out": d.Out, "R": d.R, "alpha": layer.alpha}
        layers[name]["rslora"] = layer.rslora
    meta = {
        "shapeml.format": _FORMAT,
        "shapeml.class": f"{type(m).__module__}.{type(m).__qualname__}",
        "lora.layers": json.dumps(layers, sort_keys=True),
    }
    return write_safetensors(path, arrays, meta, allow_nonfinite=allow_nonfinite)


def _layers(meta: dict[str, str], source: str) -> dict[str, dict[str, Any]]:
    """The layers a file's metadata declares, each checked (E2302 for malformed metadata)."""
    try:
        layers = json.loads(meta.get("lora.layers", ""))
    except (ValueError, RecursionError):
        layers = None
    ok = meta.get("shapeml.format") == _FORMAT and isinstance(layers, dict)
    ok = ok and all(
        isinstance(v, dict)
        and all(type(v.get(k)) is int and v[k] >= 1 for k in ("In", "Out", "R"))
        and isinstance(v.get("alpha"), (int, float))
        and not isinstance(v.get("alpha"), bool)
        and v["alpha"] > 0
        and isinstance(v.get("rslora"), bool)
        for v in layers.values()
    )
    if not ok:
        raise LoRAFileError(
            f"`{source}` is not a LoRA adapters file written by lora.save (its metadata "
            f"`shapeml.format` is {shorten(meta.get('shapeml.format'))})",
            fix=_FIX,
        )
    return layers


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def load(
    path: str | os.PathLike,
    base: Model,
    *,
    allow_nonfinite: bool | Collection[str] = False,
) -> Model:
    """`base` with the adapters of the file `path` (written by `lora.save`) applied, and every
    other weight frozen: the model `lora.apply` built, as trained.

    Every layer the file names must be an `nn.Linear` of `base` with the same `In` and `Out`,
    and every adapter must have its declared shape: all problems are listed at once, and
    nothing is applied.

    Args:
        path: the adapters file.
        base: the model the adapters were trained on (plain, without adapters).
        allow_nonfinite: True (or the names) to load NaN/inf values without warning.

    Raises:
        LoRAFileError: (E2302) for a file that is not an adapters file or does not fit `base`.
        and the errors of reading a safetensors file (E1302, E1304, E1306, E1308).

    Example:
        >>> m = lora.load("adapters.safetensors", llama.from_hf("ckpt/"))
    """
    instance("base", base, Model, "an sm.Model (the base the adapters were trained on)")
    arrays, meta = read_safetensors(path, fix=_FIX, allow_nonfinite=allow_nonfinite)
    source = str(path)
    layers = _layers(meta, source)
    found = linears(base)
    problems = []
    for name, d in sorted(layers.items()):
        layer = found.get(name)
        if layer is None:
            problems.append(f"`{name}`: `{type(base).__name__}` has no nn.Linear of that name")
        elif isinstance(layer, Linear):
            problems.append(f"`{name}`: the base already holds an adapter there (merge it first)")
        elif (layer.dims.In, layer.dims.Out) != (d["In"], d["Out"]):
            problems.append(
                f"`{name}`: the adapter was trained on In={d['In']} Out={d['Out']}, the base's "
                f"Linear has In={layer.dims.In} Out={layer.dims.Out}"
            )
    expected = {}
    for name, d in layers.items():
        expected[f"{name}.lora_a"] = ((d["In"], d["R"]), np.dtype(np.float32))
        expected[f"{name}.lora_b"] = ((d["R"], d["Out"]), np.dtype(np.float32))
    problems += entry_problems(expected, arrays)
    if problems:
        raise LoRAFileError(
            f"`{source}` does not fit the `{type(base).__name__}` it is loaded into: "
            f"{len(problems)} problem(s):\n    " + "\n    ".join(first_problems(problems)),
            fix=_FIX,
        )
    plan = {
        name: (
            d["R"],
            float(d["alpha"]),
            d["rslora"],
            arrays[f"{name}.lora_a"],
            arrays[f"{name}.lora_b"],
        )
        for name, d in layers.items()
    }
    return build(base, plan, 0)
