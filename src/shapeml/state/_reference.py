"""Graph inputs as the compiled path sees them, and the eager host run of a body (`reference`).

Both paths cast inputs the same way (Python numbers and numpy arrays to JAX's canonical dtypes), so
the body computes in the same dtypes whether it is traced or run on the host.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from . import _index
from ._errors import GraphInputError
from ._frame import Frame

__all__ = ["normalize_inputs", "run_reference"]


_INT = np.dtype(jax.dtypes.canonicalize_dtype(np.int64))


def _canonical(x):
    if isinstance(x, jax.Array):
        return x
    if type(x) is int:  # the common per-call `pos=`: skip the generic path
        return np.asarray(x, _INT)
    if isinstance(x, bool | int | float | complex | np.generic | np.ndarray):
        arr = np.asarray(x)
        if arr.dtype.kind not in "biufc":
            raise GraphInputError(
                f"a graph input has dtype {arr.dtype}", fix="pass numeric arrays or numbers"
            )
        dtype = jax.dtypes.canonicalize_dtype(arr.dtype)
        return arr if arr.dtype == dtype else arr.astype(dtype)
    raise GraphInputError(
        f"a graph input is a {type(x).__name__} ({x!r:.60}), not an array or a number",
        fix="pass arrays, numbers or pytrees of them; fixed configuration belongs in __init__",
    )


def normalize_inputs(inputs: tuple, per_call: dict):
    """`(leaves, key)`: the canonical leaves of `(inputs, per_call)`, and the signature key
    `(treedef, avals)` that picks the compiled program."""
    leaves, treedef = jax.tree_util.tree_flatten((inputs, per_call))
    leaves = [_canonical(x) for x in leaves]
    key = (treedef, tuple((x.shape, x.dtype, getattr(x, "weak_type", False)) for x in leaves))
    return leaves, key


def run_reference(graph, store, body, inputs: tuple, per_call: dict) -> Any:
    """Runs `body` eagerly against the host mirror; commits the state only if it returns.

    Values are eager JAX arrays on the CPU (host) device, so annotated functions (`Array`) accept
    them and integer results are exact; array states are mirrored as numpy.
    """
    cpu = jax.devices("cpu")[0]
    leaves, (treedef, _) = normalize_inputs(inputs, per_call)
    args, kwargs = jax.tree_util.tree_unflatten(treedef, leaves)
    args, kwargs = jax.device_put((args, kwargs), cpu)
    params = {attr: store.host_param_value(attr) for attr in store.params}
    states = {attr: store.host_state(attr) for attr in store.states}
    frame = Frame(graph, "host", params, states, store.states)
    # A sink of its own: an enclosing trace must not collect this run's checks, and a bad index
    # that is an input gets named in the error.
    _index.push_sink(_index.Sink(_index.direct_inputs((args, kwargs))))
    try:
        with frame, jax.default_device(cpu):
            out = body(graph, *args, **kwargs)
    finally:
        _index.pop_sink()
    for attr in store.states:
        store.set_host_state(attr, frame.states[attr])
    return jax.tree_util.tree_map(np.asarray, out)
