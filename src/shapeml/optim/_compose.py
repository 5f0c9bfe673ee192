"""How an optimizer's options wrap its update rule, with optax's own pieces.

    apply_if_finite(            # skip_nonfinite: a step whose gradient is not finite is skipped
        MultiSteps(             # accumulate=N: average N gradients, then one update
            chain(base,         # the update rule: optax.adamw(...), a user's optax chain, ...
                  average)))    # ema=DECAY: an exponential moving average of the weights

Each layer is present only when its option is on. `split` and `join` take the state apart and put it
back layer by layer, so options can be added to an optimizer that has already trained.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

__all__ = ["Layers", "compose", "join", "split", "track_average"]

# apply_if_finite gives up and applies a non-finite update after this many in a row: never, here.
_NEVER = 2**31 - 1


def track_average(decay: float) -> optax.GradientTransformation:
    """Keeps `optax.ema(decay, debias=False)` of the params after each update, started at the
    params themselves (so the average is a model from the first step); passes updates through."""
    ema = optax.ema(decay, debias=False)

    def init(params):
        return optax.EmaState(count=jnp.zeros((), jnp.int32), ema=jax.tree.map(jnp.array, params))

    def update(updates, state, params=None):
        _, state = ema.update(optax.apply_updates(params, updates), state)
        return updates, state

    return optax.GradientTransformation(init, update)


@functools.lru_cache(maxsize=256)
def _cached(base, skip: bool, accumulate: int, ema: float | None):
    return _compose(base, skip, accumulate, ema)


def _compose(base, skip: bool, accumulate: int, ema: float | None):
    tx = base
    if ema is not None:
        tx = optax.chain(tx, track_average(ema))
    if accumulate > 1:
        tx = optax.MultiSteps(tx, accumulate).gradient_transformation()
    if skip:
        tx = optax.apply_if_finite(tx, _NEVER)
    return tx


def compose(base, skip: bool, accumulate: int, ema: float | None):
    """The full transformation; the same object for the same parts, so equal optimizers share one
    pytree structure and a jitted step is not traced again for each."""
    try:
        return _cached(base, skip, accumulate, ema)
    except TypeError:  # an unhashable transformation: build it afresh
        return _compose(base, skip, accumulate, ema)


class Layers(NamedTuple):
    """An optimizer's state layer by layer (None where the option is off)."""

    skip: Any  # optax.ApplyIfFiniteState (its inner_state replaced by None)
    accumulate: Any  # optax.MultiStepsState (its inner_opt_state replaced by None)
    base: Any  # the update rule's state
    average: Any  # optax.EmaState of the weights


def split(state, skip: bool, accumulate: int, ema: float | None) -> Layers:
    s_skip = s_acc = s_avg = None
    if skip:
        s_skip, state = state._replace(inner_state=None), state.inner_state
    if accumulate > 1:
        s_acc, state = state._replace(inner_opt_state=None), state.inner_opt_state
    if ema is not None:
        state, s_avg = state
    return Layers(s_skip, s_acc, state, s_avg)


def join(layers: Layers, skip: bool, accumulate: int, ema: float | None):
    state = layers.base
    if ema is not None:
        state = (state, layers.average)
    if accumulate > 1:
        state = layers.accumulate._replace(inner_opt_state=state)
    if skip:
        state = layers.skip._replace(inner_state=state)
    return state
