"""A Llama-family `config.json` (`LlamaConfig`, `Qwen2Config`, `MistralConfig`) read as dims and
options, every key checked, and written back from a model."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from ..._io import read_text
from ..._traceback import api_boundary
from ..._validate import shorten
from ._errors import LlamaConfigError

__all__ = ["DIM_KEYS", "Config", "config_json", "read_config"]

DIM_KEYS = {
    "V": "vocab_size",
    "T": "max_position_embeddings",
    "D": "hidden_size",
    "H": "num_attention_heads",
    "F": "intermediate_size",
    "L": "num_hidden_layers",
}
_CLASSES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
}
_FIX = (
    "use a Llama, Qwen2 or Mistral checkpoint saved by transformers "
    "(AutoModelForCausalLM.save_pretrained)"
)
_MAX_CONFIG_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class Config:
    """What a config declares: the dims, the model's own options (`tied`, `family`, token ids)
    and the options every layer holds (`eps`, `theta`, `window`, `qkv_bias`, `o_bias`)."""

    dims: dict[str, int]
    statics: dict[str, Any]
    layer_options: dict[str, Any]


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _token_id(value: Any) -> Any:
    """A token id as a static holds it: an int, None, or a tuple of ints (a JSON list)."""
    return tuple(value) if isinstance(value, list) else value


def _theta(config: dict, problems: list[str]) -> float:
    """The rotary base and a check of the rotary type: `rope_parameters` (transformers 5) or
    `rope_theta` with `rope_scaling` (earlier versions)."""
    params = config.get("rope_parameters")
    if params is None:
        params = dict(config.get("rope_scaling") or {})
        params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    if not isinstance(params, dict):
        problems.append(f"rope_parameters is {shorten(params)}, not a JSON object")
        return 10000.0
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        problems.append(
            f"the rotary type is {shorten(kind)}; shapeml computes plain rotary positions "
            "('default', no rope scaling)"
        )
    theta = params.get("rope_theta", 10000.0)
    if not _number(theta):
        problems.append(f"rope_theta is {shorten(theta)}, not a number > 0")
        return 10000.0
    return float(theta)


@api_boundary
def config_dims(config: Any, source: str) -> Config:
    """The dims and options a Llama-family config declares, after checking every key it reads.

    Raises:
        LlamaConfigError: (E2006) listing every problem at once.
    """
    if not isinstance(config, dict):
        raise LlamaConfigError(
            f"`{source}` holds {shorten(config)}, not a JSON object of config keys", fix=_FIX
        )
    problems = []
    family = config.get("model_type")
    if family not in _CLASSES:
        problems.append(f"model_type is {shorten(family)}, not one of {', '.join(_CLASSES)}")
    dims = {}
    for dim, key in DIM_KEYS.items():
        value = config.get(key)
        if not _whole(value):
            what = "missing" if key not in config else f"{shorten(value)}, not a whole number >= 1"
            problems.append(f"{key} ({dim}) is {what}")
        else:
            dims[dim] = value
    kv = config.get("num_key_value_heads")
    kv = dims.get("H") if kv is None else kv
    if not _whole(kv):
        problems.append(f"num_key_value_heads (K) is {shorten(kv)}, not a whole number >= 1")
    elif "H" in dims:
        dims["K"] = kv
        if dims["H"] % kv:
            problems.append(
                f"num_key_value_heads={kv} does not divide num_attention_heads={dims['H']}"
            )
    head_dim = config.get("head_dim")
    if head_dim is None and "D" in dims and "H" in dims:
        head_dim = dims["D"] // dims["H"]
        if dims["D"] % dims["H"]:
            problems.append(
                f"num_attention_heads={dims['H']} does not divide hidden_size={dims['D']} "
                "and no head_dim is given"
            )
    if head_dim is not None:
        if not _whole(head_dim) or head_dim % 2:
            problems.append(f"head_dim (Dh) is {shorten(head_dim)}, not an even whole number")
        else:
            dims["Dh"] = head_dim
    act = config.get("hidden_act", "silu")
    if act != "silu":
        problems.append(f"hidden_act is {shorten(act)}; shapeml's Llama gates with 'silu'")
    eps = config.get("rms_norm_eps", 1e-6)
    if not _number(eps):
        problems.append(f"rms_norm_eps is {shorten(eps)}, not a number > 0")
    theta = _theta(config, problems)
    if config.get("mlp_bias", False) is not False:
        problems.append(f"mlp_bias is {shorten(config['mlp_bias'])}; shapeml's MLP has no biases")
    tied = config.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        problems.append(f"tie_word_embeddings is {shorten(tied)}, not true or false")
    bias = config.get("attention_bias", False)
    if family == "llama" and not isinstance(bias, bool):
        problems.append(f"attention_bias is {shorten(bias)}, not true or false")
    window = 0
    if family == "mistral":
        window = config.get("sliding_window") or 0
        if not isinstance(window, int) or isinstance(window, bool) or window < 0:
            problems.append(f"sliding_window is {shorten(window)}, not null or a whole number")
            window = 0
    if family == "qwen2" and config.get("use_sliding_window", False):
        problems.append(
            "use_sliding_window is true; shapeml's Qwen2 attends over every earlier position "
            "(no per-layer sliding window)"
        )
    layer_types = config.get("layer_types")
    full = isinstance(layer_types, list) and not set(layer_types) - {"full_attention"}
    if family in ("llama", "qwen2") and layer_types is not None and not full:
        problems.append(
            f"layer_types is {shorten(layer_types)}; shapeml's {family} layers are all "
            "'full_attention'"
        )
    for key in ("bos_token_id", "eos_token_id"):
        value = config.get(key)
        ok = value is None or (type(value) is int and value >= 0)
        if isinstance(value, list):
            ok = all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
        if not ok:
            problems.append(f"{key} is {shorten(value)}, not null, a token id or a list of them")
    if problems:
        raise LlamaConfigError(
            f"`{source}` does not describe a Llama-family model shapeml can hold: "
            f"{len(problems)} problem(s):\n    " + "\n    ".join(problems),
            fix=_FIX + "; a config edited by hand must keep the keys its tensors match",
        )
    qkv_bias = family == "qwen2" or (family == "llama" and bias)
    return Config(
        dims=dims,
        statics={
            "tied": tied,
            "family": family,
            "bos_token_id": _token_id(config.get("bos_token_id")),
            "eos_token_id": _token_id(config.get("eos_token_id")),
        },
        layer_options={
            "eps": float(eps),
            "theta": theta,
            "window": window,
            "qkv_bias": qkv_bias,
            "o_bias": family == "llama" and bias,
        },
    )


def read_config(folder: Path) -> Config:
    """The dims and options of the checkpoint in `folder`, from its `config.json`.

    Raises:
        FileMissingError: (E1304) without a `config.json`.
        LlamaConfigError: (E2006) for a file that is not JSON, or a config shapeml cannot hold.
    """
    path = folder / "config.json"
    text = read_text(path, fix=_FIX, max_bytes=_MAX_CONFIG_BYTES)
    try:
        config = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise LlamaConfigError(
            f"`{path}` is not JSON ({type(e).__name__}: {shorten(str(e))})", fix=_FIX
        ) from None
    return config_dims(config, str(path))


def config_json(dims: dict[str, int], statics: dict[str, Any], layer: dict[str, Any]) -> str:
    """The `config.json` of a model with these dims and options, as `save_pretrained` writes it
    for its family (both spellings of the rotary base, so older `transformers` read it too).

    Raises:
        LlamaConfigError: (E2006) for options the family's config cannot express.
    """
    family = statics["family"]
    problems = []
    if family == "llama" and layer["qkv_bias"] != layer["o_bias"]:
        problems.append(
            f"qkv_bias={layer['qkv_bias']} and o_bias={layer['o_bias']}: Llama's attention_bias "
            "sets both"
        )
    if family == "qwen2" and (not layer["qkv_bias"] or layer["o_bias"]):
        problems.append("Qwen2 has query/key/value biases and no output bias")
    if family == "mistral" and (layer["qkv_bias"] or layer["o_bias"]):
        problems.append("Mistral has no attention biases")
    if family != "mistral" and layer["window"]:
        problems.append(f"window={layer['window']}: only Mistral's config holds a sliding window")
    if problems:
        raise LlamaConfigError(
            f"a {family} config.json cannot hold this model: " + "; ".join(problems),
            fix="build the model with its family's options (Llama.init(family=..., ...))",
        )
    token = {k: list(v) if isinstance(v, tuple) else v for k, v in statics.items()}
    config: dict[str, Any] = {
        "architectures": [_CLASSES[family]],
        "attention_dropout": 0.0,
        "bos_token_id": token["bos_token_id"],
        "eos_token_id": token["eos_token_id"],
        "head_dim": dims["Dh"],
        "hidden_act": "silu",
        "hidden_size": dims["D"],
        "initializer_range": 0.02,
        "intermediate_size": dims["F"],
        "max_position_embeddings": dims["T"],
        "model_type": family,
        "num_attention_heads": dims["H"],
        "num_hidden_layers": dims["L"],
        "num_key_value_heads": dims["K"],
        "rms_norm_eps": layer["eps"],
        "rope_parameters": {"rope_theta": layer["theta"], "rope_type": "default"},
        "rope_theta": layer["theta"],
        "tie_word_embeddings": statics["tied"],
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": dims["V"],
    }
    if family == "llama":
        config.update(attention_bias=layer["qkv_bias"], mlp_bias=False)
    elif family == "mistral":
        config["sliding_window"] = layer["window"] or None
    else:
        config.update(use_sliding_window=False, sliding_window=None)
    return json.dumps(config, indent=2, sort_keys=True) + "\n"
