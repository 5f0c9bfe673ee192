"""GPT-2's `config.json` (the Hugging Face `GPT2Config`) read as dims, every key checked, and
written back from a model's dims."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..._io import read_text
from ..._traceback import api_boundary
from ..._validate import shorten
from ._errors import HFConfigError

__all__ = ["DIM_KEYS", "config_dims", "config_json", "read_config"]

# The dims and the config keys that hold them.
DIM_KEYS = {"V": "vocab_size", "T": "n_positions", "D": "n_embd", "H": "n_head", "L": "n_layer"}
_TANH_GELU = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
# Options whose other values change the math: key -> (default when absent, the value needed).
_FIXED = {
    "layer_norm_epsilon": (1e-5, 1e-5),
    "scale_attn_weights": (True, True),
    "scale_attn_by_inverse_layer_idx": (False, False),
    "add_cross_attention": (False, False),
    "tie_word_embeddings": (True, True),
}
_CONFIG_FIX = "use a GPT-2 checkpoint saved by transformers (GPT2LMHeadModel.save_pretrained)"
# A config.json is a few kB; anything far larger is not one.
_MAX_CONFIG_BYTES = 1 << 20


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@api_boundary
def config_dims(config: Any, source: str) -> dict[str, int]:
    """The dims `V T D H L F` a GPT-2 config declares, after checking every key it reads.

    Raises:
        HFConfigError: (E2004) listing every problem at once.
    """
    if not isinstance(config, dict):
        raise HFConfigError(
            f"`{source}` holds {shorten(config)}, not a JSON object of config keys",
            fix=_CONFIG_FIX,
        )
    problems = []
    kind = config.get("model_type", "gpt2")
    if kind != "gpt2":
        problems.append(f"model_type is {shorten(kind)}, not 'gpt2'")
    dims = {}
    for dim, key in DIM_KEYS.items():
        value = config.get(key)
        if not _whole(value):
            what = "missing" if key not in config else f"{shorten(value)}, not a whole number >= 1"
            problems.append(f"{key} ({dim}) is {what}")
        else:
            dims[dim] = value
    inner = config.get("n_inner")
    if inner is not None and not _whole(inner):
        problems.append(f"n_inner (F) is {shorten(inner)}, not null or a whole number >= 1")
    if "D" in dims and "H" in dims and dims["D"] % dims["H"]:
        problems.append(f"n_head={dims['H']} does not divide n_embd={dims['D']}")
    act = config.get("activation_function", "gelu_new")
    if act not in _TANH_GELU:
        problems.append(
            f"activation_function is {shorten(act)}; shapeml's GPT-2 computes the tanh GELU "
            f"({', '.join(_TANH_GELU)})"
        )
    for key, (default, need) in _FIXED.items():
        value = config.get(key, default)
        if value != need or isinstance(value, bool) != isinstance(need, bool):
            problems.append(f"{key} is {shorten(value)}; shapeml's GPT-2 computes {need!r}")
    if problems:
        raise HFConfigError(
            f"`{source}` does not describe a GPT-2 shapeml can hold: {len(problems)} problem(s):"
            "\n    " + "\n    ".join(problems),
            fix=_CONFIG_FIX + "; a config edited by hand must keep the keys its tensors match",
        )
    dims["F"] = 4 * dims["D"] if inner is None else inner
    return dims


def read_config(folder: Path) -> dict[str, int]:
    """The dims of the checkpoint in `folder`, from its `config.json`.

    Raises:
        FileMissingError: (E1304) without a `config.json`.
        HFConfigError: (E2004) for a file that is not JSON, or a config shapeml cannot hold.
    """
    path = folder / "config.json"
    text = read_text(path, fix=_CONFIG_FIX, max_bytes=_MAX_CONFIG_BYTES)
    try:
        config = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise HFConfigError(
            f"`{path}` is not JSON ({type(e).__name__}: {shorten(str(e))})", fix=_CONFIG_FIX
        ) from None
    return config_dims(config, str(path))


def config_json(dims: dict[str, int]) -> str:
    """The `config.json` of a GPT-2 with these dims, as `GPT2Config.save_pretrained` writes it."""
    v = dims["V"]
    # GPT-2's end-of-text token is its last id; a vocabulary without it names none.
    eos = 50256 if v > 50256 else None
    config = {
        "activation_function": "gelu_new",
        "architectures": ["GPT2LMHeadModel"],
        "attn_pdrop": 0.1,
        "bos_token_id": eos,
        "embd_pdrop": 0.1,
        "eos_token_id": eos,
        "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05,
        "model_type": "gpt2",
        "n_embd": dims["D"],
        "n_head": dims["H"],
        "n_inner": None if dims["F"] == 4 * dims["D"] else dims["F"],
        "n_layer": dims["L"],
        "n_positions": dims["T"],
        "reorder_and_upcast_attn": False,
        "resid_pdrop": 0.1,
        "scale_attn_by_inverse_layer_idx": False,
        "scale_attn_weights": True,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": v,
    }
    return json.dumps(config, indent=2, sort_keys=True) + "\n"
