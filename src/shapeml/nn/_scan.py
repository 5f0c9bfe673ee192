"""`nn.scan`: a stack of layers applied in turn, compiled once (`jax.lax.scan`) when they are stored
stacked, each under a named remat policy; `nn.unstack` lists the layers of either storage.

Every model that runs its blocks through `nn.scan` (the zoo's GPT-2 and transformer among them)
takes the remat policy of the `TrainStep` / `train` that trains it, and its precision policy casts
the stacked weights like any other."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import jax

from .._errors import ArgumentTypeError
from .._traceback import api_boundary
from .._validate import integer, shorten
from ..models import Model
from ..models._stacked import count_of, layer, stack
from ._remat import remat as _remat
from ._remat import resolve_policy

__all__ = ["scan", "unstack"]

C = TypeVar("C")


def _is_stacked(layers: Any) -> bool:
    if isinstance(layers, Model):
        return True
    if (
        isinstance(layers, Mapping)
        and layers
        and all(isinstance(v, jax.Array) and v.ndim >= 1 for v in layers.values())
    ):
        return True
    if isinstance(layers, (tuple, list)) and all(isinstance(x, Model) for x in layers):
        return False
    raise ArgumentTypeError(
        "nn.scan / nn.unstack take the layers of an `sm.submodels` field (a tuple of models, or "
        "one stacked model) or a dict of per-layer arrays stacked on a leading axis, got "
        f"{shorten(layers)} ({type(layers).__name__})",
        fix="pass the field itself, e.g. nn.scan(body, m.blocks, x)",
    )


@api_boundary
def scan(
    body: Callable[[Any, C], C],
    layers: Any,  # a stacked model or a sequence of models: `_is_stacked` checks, with a code
    carry: C,
    *,
    remat: str | None = None,
    unroll: int = 1,
) -> C:
    """Runs `carry = body(layer, carry)` for each layer in order; returns the last carry.

    Layers stored stacked (`sm.submodels(Block, "L", stacked=True)`, or a dict of per-layer
    arrays `{"wq": wq [L D D], ...}`) run as one `jax.lax.scan`: the body is traced and compiled
    once, so compile time does not grow with the number of layers. A tuple of layers runs as a
    Python loop (the same numbers, one copy of the body per layer in the program).

    Run a model's blocks through `nn.scan`, naming no `remat`, and `TrainStep(remat=...)` /
    `train(remat=...)` apply to them: that is how a model offers rematerialization to whoever
    trains it.

    Args:
        body: `(layer, carry) -> carry`, the carry keeping its structure, shapes and dtypes
            (e.g. a block's forward `lambda blk, x: x + blk.mlp(blk.ln(x))`).
        layers: the field: a tuple of models or one stacked model; or a dict of arrays whose
            leading axis is the layer (the body gets each layer's slice as a dict).
        carry: any pytree of arrays (the activations `x [b t D]`).
        remat: the named policy (`nn.remat`) each layer runs under: `"none"`, `"full"`,
            `"dots"` or `"dots_no_batch"`; None takes the policy of the `TrainStep(remat=...)`
            being traced, else `"none"` for a tuple of layers and `"dots_no_batch"` for stacked
            ones (a `lax.scan` that kept every intermediate would store them all in stacked
            buffers: keeping only the projections' outputs is faster on CPU, see
            docs/performance.md).
        unroll: layers per iteration of the compiled loop (as `jax.lax.scan`'s `unroll`).

    Returns:
        The carry after the last layer.

    Example:
        >>> def block(blk, x):
        ...     x = x + blk.attn(blk.ln1(x))
        ...     return x + blk.mlp(blk.ln2(x))
        >>> x = nn.scan(block, m.blocks, x, remat="full")
    """
    stacked = _is_stacked(layers)
    unroll = integer("unroll", unroll, low=1)
    policy = resolve_policy(remat, stacked=stacked)
    if not stacked and policy != "none" and _alike(layers):
        # XLA:CPU schedules a Python loop's recomputation next to the forward pass, so a remat
        # policy there saved no memory at all (the same peak, to the byte); a `lax.scan` over the
        # layers stacked on the fly (one copy of the weights) keeps what the policy says.
        layers, stacked = stack(layers), True
    if not stacked:
        step = _remat(body, policy, prevent_cse=True)
        for lay in layers:
            carry = step(lay, carry)
        return carry
    step = _remat(body, policy, prevent_cse=False)  # a scan's body needs no CSE barrier

    def one(c, lay):
        return step(lay, c), None

    return jax.lax.scan(one, carry, layers, unroll=unroll)[0]


def _alike(layers) -> bool:
    """Whether a tuple of layers stacks: two or more, of one structure, shapes and dtypes."""
    if len(layers) < 2:
        return False
    first = jax.tree.structure(layers[0])
    shapes = [(x.shape, x.dtype) for x in jax.tree.leaves(layers[0])]
    return all(
        jax.tree.structure(lay) == first
        and [(x.shape, x.dtype) for x in jax.tree.leaves(lay)] == shapes
        for lay in layers[1:]
    )


@api_boundary
def unstack(layers: Any) -> tuple[Any, ...]:
    """The layers of an `sm.submodels` field as a tuple, whether it is stored stacked or not
    (a stacked one is sliced: under `jax.jit` the slices cost nothing until used).

    Example:
        >>> for i, blk in enumerate(nn.unstack(m.blocks)):
        ...     x, cache = blk.attn.step(x, cache, i, pos)
    """
    if not _is_stacked(layers):
        return tuple(layers)
    if isinstance(layers, Mapping):
        count = next(iter(layers.values())).shape[0]
        return tuple({k: v[i] for k, v in layers.items()} for i in range(count))
    return tuple(layer(layers, i) for i in range(count_of(layers, 0)))
