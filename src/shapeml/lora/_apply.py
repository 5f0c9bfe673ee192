"""`lora.apply` puts adapters on a model's Linears chosen by dotted-name pattern and freezes the
rest; `lora.merge` folds them back into plain Linears; `lora.adapters` lists them."""

from __future__ import annotations

import fnmatch
import typing
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from .. import nn
from .._errors import ArgumentError, ArgumentTypeError
from .._traceback import api_boundary
from .._validate import instance, integer, shorten
from ..models import Model
from ..models._checks import key_of
from ..models._freeze import frozen_copy
from ..models._model import field_hash
from ..models._stacked import is_stacked
from ._errors import LoRATargetError
from ._linear import Linear

__all__ = ["Adapter", "adapters", "apply", "build", "linears", "merge"]

# What an adapter is built from: (rank, alpha, rslora, lora_a or None to draw, lora_b or None).
Adapter = tuple[int, float, bool, Any, Any]


def _children(m: Model):
    """`(field, index or None, sub-model)` of each direct sub-model (stacked ones as one)."""
    for name, spec in type(m).__shapeml_fields__.items():
        value = getattr(m, name)
        if spec.kind == "submodel" or (spec.kind == "submodels" and is_stacked(spec, value)):
            yield name, None, value
        elif spec.kind == "submodels":
            for i, child in enumerate(value):
                yield name, i, child


def _stacked(m: Model) -> set[str]:
    return {
        name
        for name, spec in type(m).__shapeml_fields__.items()
        if spec.kind == "submodels" and is_stacked(spec, getattr(m, name))
    }


def linears(m: Model, prefix: str = "") -> dict[str, nn.Linear]:
    """Every `nn.Linear` sub-model of `m` (LoRA layers included) by dotted name; layers stored
    stacked are not listed (they hold every layer's weights in one tensor)."""
    out = {}
    stacked = _stacked(m)
    for name, i, child in _children(m):
        if name in stacked:
            continue
        path = f"{prefix}{name}." + ("" if i is None else f"{i}.")
        if isinstance(child, nn.Linear):
            out[path[:-1]] = child
        else:
            out.update(linears(child, path))
    return out


def _rebuild(m: Model, prefix: str, fn: Callable[[str, Model], Model | None]) -> Model:
    """`m` with every sub-model rebuilt: `fn(path, model)` replaces a Linear when it returns a
    model; every other model is passed through `fn` after its children (parents are rebuilt
    without re-checking: the children keep the class and dims their declarations ask for)."""
    changes: dict[str, Any] = {}
    for name, i, child in _children(m):
        path = f"{prefix}{name}" + ("" if i is None else f".{i}")
        replaced = fn(path, child) if isinstance(child, nn.Linear) else None
        new = replaced if replaced is not None else _rebuild(child, path + ".", fn)
        if i is None:
            changes[name] = new
        else:
            changes.setdefault(name, []).append(new)
    out = object.__new__(type(m))
    out.__dict__.update(m.__dict__)
    for name, value in changes.items():
        object.__setattr__(out, name, tuple(value) if isinstance(value, list) else value)
    return fn(prefix[:-1], out) or out


def build(m: Model, plan: dict[str, Adapter], seed: Any) -> Model:
    """`m` frozen, with an adapter on each Linear `plan` names (by dotted name)."""
    key = key_of(seed)

    def one(path: str, sub: Model) -> Model | None:
        if path in plan and isinstance(sub, nn.Linear):
            rank, alpha, rslora, a, b = plan[path]
            d = sub.dims
            if a is None:
                k = jax.random.fold_in(key, field_hash(path + ".lora_a"))
                a = nn.fan_in()(k, (d.In, rank), sub.w.dtype)
            if b is None:
                b = jnp.zeros((rank, d.Out), sub.w.dtype)
            return Linear(
                dims=Linear.dims.resolve(In=d.In, Out=d.Out, R=rank),
                w=sub.w,
                b=sub.b,
                lora_a=jnp.asarray(a),
                lora_b=jnp.asarray(b),
                bias=sub.bias,
                alpha=float(alpha),
                rslora=rslora,
            )
        if isinstance(sub, Linear):  # an adapter kept as it is (its own params stay trained)
            return sub
        return frozen_copy(sub)

    return _rebuild(m, "", one)


def _patterns(targets: Any) -> tuple[str, ...]:
    if isinstance(targets, str):
        targets = (targets,)
    ok = isinstance(targets, Sequence) and targets and all(isinstance(t, str) for t in targets)
    if not ok:
        raise ArgumentTypeError(
            f"`targets` must be a dotted-name pattern or a list of them, got {shorten(targets)}",
            fix='pass e.g. targets=["*.attn.q", "*.attn.v"]',
        )
    return tuple(targets)


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def apply(
    m: Model,
    targets: str | Sequence[str],
    *,
    rank: int = 8,
    alpha: float | None = None,
    rslora: bool = False,
    seed: Any = 0,
) -> Model:
    """`m` with a LoRA adapter on every `nn.Linear` whose dotted name matches a pattern of
    `targets`, and every other weight frozen.

    Each matched Linear becomes a `lora.Linear` (same class family, dims and base weights, now
    buffers) with `lora_a [In rank]` drawn from `seed` and `lora_b [rank Out]` zero, so the new
    model computes what `m` does. Every other param of `m` is frozen (`sm.models.freeze`): the
    gradient (`sm.value_and_grad`), the optimizer state and `TrainStep` hold the adapters only,
    and training leaves the base bit for bit as it was. The model is still an instance of its
    class: its forward (`llama.forward`, `gpt2.forward`, your own) runs unchanged.

    Args:
        m: any `sm.Model` with `nn.Linear` sub-models (a Llama, a GPT-2, your own).
        targets: shell-style patterns over dotted names (`"*.attn.q"`, `"*.mlp.*"`,
            `"layers.0.attn.v"`; `*` also crosses dots); a name without wildcards also matches
            as a suffix, as peft's `target_modules` (`["q", "v"]`).
        rank: the adapters' rank `R` (peft's `r`).
        alpha: the scale numerator (peft's `lora_alpha`; default `rank`, a scale of 1).
        rslora: scale by `alpha / sqrt(rank)` (peft's `use_rslora`).
        seed: draws each `lora_a` from `fold_in(key(seed), hash(its dotted name))`.

    Returns:
        The adapted model.

    Raises:
        LoRATargetError: (E2301) for a pattern that matches no Linear, or a Linear that
            already has an adapter.
        ArgumentError, ArgumentTypeError: (E0002, E0003) for a bad rank, alpha or targets.

    Example:
        >>> m = lora.apply(llama.from_hf("ckpt/"), ["*.attn.q", "*.attn.v"], rank=8, alpha=16)
        >>> sm.count_params(m)      # the adapters only
    """
    instance("m", m, Model, "an sm.Model")
    patterns = _patterns(targets)
    rank = integer("rank", rank, low=1, fix="pass the adapters' rank, e.g. rank=8")
    alpha = float(rank) if alpha is None else alpha
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
        raise ArgumentError(f"`alpha` is {alpha!r}; it must be a number > 0", fix="e.g. alpha=16")
    instance("rslora", rslora, bool, "True or False")
    found = linears(m)
    chosen: set[str] = set()
    for pattern in patterns:
        hits = [name for name in found if _matches(name, pattern)]
        if not hits:
            names = sorted(found)
            near = [n for n in names if n.rsplit(".", 1)[-1] == pattern.rsplit(".", 1)[-1]]
            shown = ", ".join((near or names)[:8]) or "none"
            raise LoRATargetError(
                f"the LoRA target {pattern!r} matches no nn.Linear of `{type(m).__name__}` "
                f"(its {len(names)} Linears include: {shown})",
                fix="name Linears by dotted name with shell wildcards, e.g. '*.attn.q'"
                + (
                    "; layers stored stacked are not matched: unstack them first"
                    if _any_stacked(m)
                    else ""
                ),
            )
        chosen.update(hits)
    done = sorted(n for n in chosen if isinstance(found[n], Linear))
    if done:
        raise LoRATargetError(
            f"{', '.join(done[:8])} already hold LoRA adapters",
            fix="merge them first (m = lora.merge(m)), then apply new adapters",
        )
    plan = {name: (rank, float(alpha), rslora, None, None) for name in chosen}
    return build(m, plan, seed)


def _matches(name: str, pattern: str) -> bool:
    """A shell-style pattern over the whole dotted name; a plain name (no wildcard) also matches
    as a suffix, as peft's `target_modules` do (`"q"` and `"attn.q"` match `layers.0.attn.q`)."""
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return name == pattern or name.endswith("." + pattern)


def _any_stacked(m: Model) -> bool:
    return bool(_stacked(m)) or any(_any_stacked(c) for _, _, c in _children(m))


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def adapters(m: Model) -> dict[str, Linear]:
    """Every LoRA layer of `m`, by dotted name.

    Example:
        >>> sorted(lora.adapters(m))
        ['layers.0.attn.q', 'layers.0.attn.v', ...]
    """
    instance("m", m, Model, "an sm.Model")
    return {k: v for k, v in linears(m).items() if isinstance(v, Linear)}


def merged_weight(layer: Linear) -> jax.Array:
    """`w + scale * lora_a @ lora_b`, spelled as the layer's forward spells it (the same bits)."""
    s = jnp.asarray(layer.scale, layer.lora_a.dtype)
    return layer.w + (layer.lora_a * s) @ layer.lora_b


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def merge(m: Model) -> Model:
    """A plain model: every LoRA layer of `m` folded into an `nn.Linear` with the weight
    `w + scale * lora_a @ lora_b`, and every weight trainable again (unfrozen). Save it with
    `sm.save`, or export it with the zoo's `to_hf` (`llama.to_hf(lora.merge(m), folder)`).

    For inference there is no need to merge by hand: `sm.hoist(forward)` computes each merged
    weight once per weights.

    Example:
        >>> plain = lora.merge(m)
        >>> llama.to_hf(plain, "finetuned/")
    """
    instance("m", m, Model, "an sm.Model")

    def one(path: str, sub: Model) -> Model | None:
        if isinstance(sub, Linear):
            d = sub.dims
            return nn.Linear(
                dims=nn.Linear.dims.resolve(In=d.In, Out=d.Out),
                w=merged_weight(sub),
                b=sub.b,
                bias=sub.bias,
            )
        return frozen_copy(sub, False)

    return _rebuild(m, "", one)
