"""The shapes data set: 16x16 grayscale images of a square, disk, plus or cross.

Each image holds one shape at a random position and size, drawn bright on a dark, noisy
background. Labels are 0 square, 1 disk, 2 plus, 3 cross. Generated from a seed, never downloaded.
"""

from __future__ import annotations

import typing

import numpy as np

from .._traceback import api_boundary
from .._validate import integer

__all__ = ["CLASSES", "MAX_IMAGES", "SIZE", "draw"]

CLASSES = ("square", "disk", "plus", "cross")
"""The four shapes drawn, in label order: label `i` is `CLASSES[i]`."""
SIZE = 16
"""The side of each image in pixels: images are `[n 1 SIZE SIZE]` uint8."""
# Drawing takes about 12 KB of temporaries per image: this many is about 0.75 GB at peak.
MAX_IMAGES = 2**16


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def draw(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Draws `n` labelled images, the same ones for the same seed.

    Classes are balanced: each appears `n // 4` or `n // 4 + 1` times, in shuffled order.

    Args:
        n: how many images, `0 .. MAX_IMAGES` (65,536); draw more with several seeds.
        seed: the generator's seed, a whole number >= 0.

    Returns:
        images: uint8 `[n 1 16 16]`; labels: int32 `[n]` in 0..3.

    Raises:
        ArgumentTypeError: (E0003) / ArgumentError: (E0002) for an `n` or `seed` that is not a
            whole number in range.
    """
    n = integer(
        "n",
        n,
        low=0,
        high=MAX_IMAGES,
        fix=f"pass n in 0..{MAX_IMAGES}, and draw more with several seeds",
    )
    seed = integer("seed", seed, low=0)
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n) % len(CLASSES)).astype(np.int32)
    radius = rng.integers(3, 7, size=n)  # half-size 3..6 pixels
    cy = rng.integers(radius, SIZE - radius)  # centre keeps the whole shape inside
    cx = rng.integers(radius, SIZE - radius)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE]
    dy = yy[None] - cy[:, None, None]
    dx = xx[None] - cx[:, None, None]
    r = radius[:, None, None]
    thick = np.maximum(1, r // 3)
    masks = np.stack(
        [
            (np.abs(dy) <= r) & (np.abs(dx) <= r),  # square
            dy**2 + dx**2 <= r**2 + 1,  # disk
            ((np.abs(dy) <= thick // 2) & (np.abs(dx) <= r))
            | ((np.abs(dx) <= thick // 2) & (np.abs(dy) <= r)),  # plus
            ((np.abs(dy - dx) <= thick // 2) | (np.abs(dy + dx) <= thick // 2))
            & (np.abs(dy) <= r)
            & (np.abs(dx) <= r),  # cross
        ]
    )
    mask = masks[labels, np.arange(n)]
    ink = rng.integers(150, 256, size=(n, 1, 1))
    noise = rng.integers(0, 50, size=(n, SIZE, SIZE))
    img = np.where(mask, ink - noise // 2, noise)
    return np.clip(img, 0, 255).astype(np.uint8)[:, None], labels
