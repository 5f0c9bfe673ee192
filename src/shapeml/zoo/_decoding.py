"""The token loop of the zoo's KV-cache `generate` functions (GPT-2, Llama), one for both: the
host checks of its arguments, and the loop itself, a prefill then one `lax.scan` of decode steps
in the model's compiled call."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import nn
from .._validate import integer
from ..state._index import StateIndexError
from ._sampling import check_sampling, pick
from .transformer import _check_prompt

__all__ = ["generate_with", "token_loop"]


def generate_with(compiled: Callable, m, prompt, steps, key, temperature):
    """Checks `generate`'s arguments on the host (each a coded error, nothing compiled), then runs
    `compiled(m, ids, steps, greedy, key, temperature)`, the model's jitted loop."""
    t = _check_prompt(prompt)
    steps = integer("steps", steps, low=1, fix="pass how many tokens to add, a Python int >= 1")
    temperature = check_sampling(key, temperature)
    if t + steps > m.dims.T:
        raise StateIndexError(
            f"a prompt of {t} tokens plus {steps} new ones does not fit the context T={m.dims.T}",
            fix=f"generate at most {m.dims.T - t} tokens after this prompt",
        )
    ids = np.asarray(prompt)
    if ids.min() < 0 or ids.max() >= m.dims.V:  # never a NaN row read as logits
        bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
        raise nn.LayerInputError(
            f"token id {bad} is outside the vocabulary of V={m.dims.V} ids",
            fix=f"pass ids in 0..{m.dims.V - 1}",
        )
    dummy = jax.random.key(0) if key is None else key
    return compiled(
        m, jnp.asarray(ids, jnp.int32), steps, key is None, dummy, jnp.float32(temperature)
    )


def token_loop(advance: Callable, m, cache, prompt, steps: int, greedy: bool, key, temperature):
    """`prompt` followed by `steps` picked tokens. `advance(m, cache, tokens [b n], pos)` runs
    new tokens against the cache and returns `(logits of the last one [b V], cache)`."""
    t = prompt.shape[1]
    key = None if greedy else key
    logits, cache = advance(m, cache, prompt, 0)
    first = pick(logits, key, 0, temperature)

    def body(carry, i):
        cache, tok = carry
        logits, cache = advance(m, cache, tok[:, None], t + i - 1)
        return (cache, pick(logits, key, i, temperature)), tok

    # generate_with checked t + steps <= T on the host; the in-loop checks never fire.
    (_, last), toks = lax.scan(body, (cache, first), jnp.arange(1, steps))
    new = jnp.concatenate([jnp.swapaxes(toks, 0, 1), last[:, None]], axis=1)
    return jnp.concatenate([prompt, new], axis=1)
