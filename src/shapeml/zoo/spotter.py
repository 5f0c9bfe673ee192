"""The Spotter: a small MLP-mixer that tells squares, disks, pluses and crosses apart.

Images `[b 1 16 16]` are cut into 4x4 patches, each embedded as a token; `L` mixer blocks mix the
tokens and the channels; the head averages the tokens and scores the `C` classes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int, UInt8

from .. import _jax_internals as jxi
from .._shaped import shaped
from .._traceback import api_boundary
from .._validate import integer
from ..models import Dims, Model, normal, param
from ._errors import LabelError, SpotterDimsError
from .mixer import mix_channels, mix_tokens, norm

__all__ = [
    "LabelError",
    "Spotter",
    "SpotterDimsError",
    "confusion",
    "cross_entropy",
    "forward",
    "loss",
    "per_class_accuracy",
    "predict",
]


@api_boundary
class Spotter(Model):
    """The spotter's weights: 12,928 numbers at the default dims."""

    dims = Dims(S=16, P=4, N="(S // P) ** 2", D=32, Dt=64, Dc=64, C=4, L=2)
    w_e: Float[Array, "P*P D"] = param(normal(std=0.25))
    tw1: Float[Array, "L N Dt"] = param(normal(std=0.25))
    tw2: Float[Array, "L Dt N"] = param(normal(std=0.125))
    cw1: Float[Array, "L D Dc"] = param(normal(std=0.18))
    cw2: Float[Array, "L Dc D"] = param(normal(std=0.125))
    w_h: Float[Array, "D C"] = param(normal(std=0.18))

    def __check_init__(self):
        d = self.dims
        if d.P < 1 or d.S % d.P:
            raise SpotterDimsError(
                f"`Spotter` has S={d.S} and P={d.P}: the {d.S} x {d.S} images are cut into "
                f"patches of {d.P} x {d.P}, so P must divide S",
                fix=f"pick P among the divisors of S={d.S} (e.g. P=4 with S=16)",
            )


def _classes(classes) -> int:
    return integer("classes", classes, low=1, fix="pass the number of classes C, e.g. 4")


def _check_labels(name: str, labels, classes: int) -> None:
    """Refuses concrete labels outside `0..classes-1` (a gather would read NaN, a count another
    class's cell); traced ones, inside a user's jit, cannot be checked on the host."""
    if jxi.is_tracer(labels):
        return
    arr = np.asarray(labels)
    if arr.size and (arr.min() < 0 or arr.max() >= classes):
        bad = int(arr.min()) if arr.min() < 0 else int(arr.max())
        raise LabelError(
            f"`{name}` holds the class {bad}, outside 0..{classes - 1} (C={classes})",
            fix=f"pass class indices in 0..{classes - 1}",
        )


def patchify(x: Float[Array, "b 1 S S"], p: int) -> Float[Array, "b N PP"]:
    """Cuts each image into `p x p` patches, one row of pixels per patch, in reading order."""
    b, _, s, _ = x.shape
    g = s // p
    x = x.reshape(b, g, p, g, p)
    return jnp.transpose(x, (0, 1, 3, 2, 4)).reshape(b, g * g, p * p)


@shaped
def forward(m: Spotter, img: UInt8[Array, "b 1 S S"]) -> Float[Array, "b C"]:
    """The class scores (logits) of each image."""
    x = img.astype(jnp.float32) * (2.0 / 255.0) - 1.0  # pixels to [-1, 1]
    patches = patchify(x, m.dims.P)
    b, n, pp = patches.shape
    tokens = (patches.reshape(b * n, pp) @ m.w_e).reshape(b, n, -1)
    for layer in range(m.dims.L):
        tokens = mix_tokens(tokens, m.tw1[layer], m.tw2[layer])
        tokens = mix_channels(tokens, m.cw1[layer], m.cw2[layer])
    return jnp.mean(norm(tokens), axis=1) @ m.w_h


@shaped
def loss(m: Spotter, img: UInt8[Array, "b 1 S S"], y: Int[Array, " b"]) -> Float[Array, ""]:
    """The mean cross-entropy of the scores against the labels."""
    return cross_entropy(forward(m, img), y)


@api_boundary
def cross_entropy(logits: Float[Array, "b C"], y: Int[Array, " b"]) -> Float[Array, ""]:
    """The mean cross-entropy of class scores against integer labels.

    Raises:
        LabelError: (E2003) for a concrete label outside `0..C-1`.
    """
    _check_labels("y", y, logits.shape[-1])
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


@shaped
def predict(m: Spotter, img: UInt8[Array, "b 1 S S"]) -> Int[Array, " b"]:
    """The likeliest class of each image."""
    return jnp.argmax(forward(m, img), axis=-1).astype(jnp.int32)


@api_boundary
def per_class_accuracy(
    pred: Int[Array, " b"], y: Int[Array, " b"], classes: int
) -> Float[Array, " C"]:
    """The fraction of each class's images predicted right (0 for a class with no images).

    Raises:
        ArgumentError, ArgumentTypeError: (E0002, E0003) unless `classes` is an int >= 1.
        LabelError: (E2003) for a concrete label or prediction outside `0..classes-1`.
    """
    classes = _classes(classes)
    _check_labels("pred", pred, classes)
    _check_labels("y", y, classes)
    c = jnp.arange(classes)[:, None]
    hits = jnp.sum((pred[None] == c) & (y[None] == c), axis=1)
    total = jnp.sum(y[None] == c, axis=1)
    return hits / jnp.maximum(total, 1)


@api_boundary
def confusion(pred: Int[Array, " b"], y: Int[Array, " b"], classes: int) -> Int[Array, "C C"]:
    """How often each true class (rows) was predicted as each class (columns).

    Raises:
        ArgumentError, ArgumentTypeError: (E0002, E0003) unless `classes` is an int >= 1.
        LabelError: (E2003) for a concrete label or prediction outside `0..classes-1`: it
            would be counted in another class's cell.
    """
    classes = _classes(classes)
    _check_labels("pred", pred, classes)
    _check_labels("y", y, classes)
    idx = y.astype(jnp.int32) * classes + pred.astype(jnp.int32)
    return jnp.bincount(idx, length=classes * classes).reshape(classes, classes)
