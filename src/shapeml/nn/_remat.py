"""Rematerialization (`jax.checkpoint`) by named policy: what a layer keeps for the backward pass and
what it recomputes, traded per block.

`nn.remat(fn, "full")` wraps one function; `nn.scan(..., remat=...)` wraps each layer it runs;
`TrainStep(..., remat=...)` (and `train(..., remat=...)`) sets the policy of every `nn.scan` its
loss runs that names none. This is how any model, a zoo model included, takes a remat setting from
the training step: it runs its blocks with `nn.scan` and names no policy itself.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import jax

from .._traceback import api_boundary
from .._validate import choice

__all__ = ["POLICIES", "SCAN_DEFAULT", "remat", "remat_default", "resolve_policy"]

# name -> what the backward pass keeps of each block (everything else is recomputed from the
# block's input); None keeps everything, as without remat.
POLICIES: dict[str, Any] = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_saveable,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}

# What a `lax.scan` over stacked layers keeps when nobody names a policy. Without one, the scan
# stores every intermediate of every layer (attention scores and probabilities, the MLP's
# activations) in stacked `[L ...]` buffers, zero-filled and written one layer at a time: on CPU
# that made the scanned step 1.4-1.6x the Python loop's time. Keeping only the projections'
# outputs and recomputing the batched attention products and the elementwise work in the
# backward pass took it to 0.6-1.05x (docs/performance.md).
SCAN_DEFAULT = "dots_no_batch"


class _Default:
    """The policy `nn.scan` uses when it names none, and whether any scan read it."""

    def __init__(self, policy: str):
        self.policy = policy
        self.used = False


_DEFAULT: contextvars.ContextVar[_Default | None] = contextvars.ContextVar(
    "shapeml_remat_default", default=None
)


def _checked(policy: str) -> str:
    return choice("remat", policy, tuple(POLICIES))


@contextlib.contextmanager
def remat_default(policy: str) -> Iterator[_Default]:
    """While a step's loss is traced: the policy of every `nn.scan` that names none.

    Yields the setting, whose `used` says whether any scan read it (so a `TrainStep(remat=...)`
    whose loss runs no `nn.scan` is reported rather than silently ignored).
    """
    setting = _Default(_checked(policy))
    token = _DEFAULT.set(setting)
    try:
        yield setting
    finally:
        _DEFAULT.reset(token)


def resolve_policy(policy: str | None, *, stacked: bool = False) -> str:
    """The policy to use: the one given, else the enclosing `remat_default`, else `"none"` for a
    loop over layers and `SCAN_DEFAULT` for a `lax.scan` over stacked ones (`stacked`)."""
    if policy is not None:
        return _checked(policy)
    setting = _DEFAULT.get()
    if setting is None:
        return SCAN_DEFAULT if stacked else "none"
    setting.used = True
    return setting.policy


@api_boundary
def remat(fn: Callable, policy: str = "full", *, prevent_cse: bool = True) -> Callable:
    """`fn` under `jax.checkpoint` with a named policy: its backward pass recomputes what the
    policy does not keep, so a deep model's peak memory grows with one block's activations,
    not all of them.

    Args:
        fn: the function to wrap, typically one block's forward `(block, x) -> x`.
        policy: `"none"` (keep every activation: no remat), `"full"` (keep only the input and
            recompute the rest in the backward pass: the least memory), `"dots"` (keep every
            matmul's result, recompute the elementwise work between them), `"dots_no_batch"`
            (keep the projections' results; recompute attention's batched products and the
            elementwise work).
        prevent_cse: as `jax.checkpoint`'s (False inside `lax.scan`, where it is not needed).

    Example:
        >>> block_fwd = nn.remat(lambda blk, x: blk(x), "dots")
        >>> for blk in m.blocks:
        ...     x = block_fwd(blk, x)
    """
    policy = _checked(policy)
    if policy == "none":
        return fn
    return jax.checkpoint(fn, policy=POLICIES[policy], prevent_cse=prevent_cse)
