"""`lora.Linear`: an `nn.Linear` whose weight and bias are frozen (declared buffers) with a trained
low-rank adapter beside them: `y = x @ (w + (alpha / R) * lora_a @ lora_b) + b`."""

from __future__ import annotations

import math
import typing
from typing import Any

from jaxtyping import Array, Float

from .. import nn
from .._errors import ArgumentError
from .._shaped import shaped
from .._traceback import api_boundary
from ..models import Dims, buffer, param, static, zeros
from ._product import adapted

__all__ = ["Linear"]


@api_boundary
class Linear(nn.Linear):
    """A LoRA layer: an `nn.Linear` (it stands wherever one is declared) whose base weight
    `w [In Out]` and bias `b [Out]` are buffers, frozen, and whose adapter is trained:
    `lora_a [In R]` (drawn as `nn.fan_in()`) and `lora_b [R Out]` (zeros, so a new adapter
    changes nothing).

    `y = x @ (w + scale * lora_a @ lora_b) + b` with `scale = alpha / R` (`alpha / sqrt(R)` with
    `rslora`), as `peft`'s LoRA computes it (its `lora_A.weight` is `lora_a.T`, its
    `lora_B.weight` is `lora_b.T`). Hoisted (`sm.hoist`), the merged weight is computed once per
    weights; differentiated, only the rank-`R` products are.

    Dims: `In`, `Out`, `R` (the rank). Options: `bias` (as `nn.Linear`), `alpha`, `rslora`.
    `lora.apply` builds these from a model's Linears; `lora.merge` folds them back.
    """

    dims = Dims(In=32, Out=32, R=8)
    w: Float[Array, "In Out"] = buffer(nn.fan_in())
    b: Float[Array, " Out"] | None = buffer(zeros, when="bias")
    lora_a: Float[Array, "In R"] = param(nn.fan_in())
    lora_b: Float[Array, "R Out"] = param(zeros)
    alpha: float = static(default=8.0)
    rslora: bool = static(default=False)

    @classmethod
    @typing.no_type_check  # validates its arguments itself, with coded errors
    def init(
        cls,
        seed: Any = 0,
        *,
        In: int = 32,
        Out: int = 32,
        R: int = 8,
        bias: bool = True,
        alpha: float = 8.0,
        rslora: bool = False,
        max_bytes: int | None = None,
    ) -> Linear:
        """A new LoRA layer drawn from `seed` (a random base; `lora.apply` wraps a real one).

        Args:
            seed: a whole number, a `jax.random.key` or an int array (as `sm.Model.init`).
            In, Out: input and output widths.
            R: the adapter's rank.
            bias: whether the base has the bias `b [Out]`.
            alpha: the adapter's scale numerator (`scale = alpha / R`).
            rslora: scale by `alpha / sqrt(R)` instead (rank-stabilized LoRA).
            max_bytes: the most the layer may hold (default 16 GiB).
        """
        return super(nn.Linear, cls).init(
            seed, max_bytes=max_bytes, In=In, Out=Out, R=R, bias=bias, alpha=alpha, rslora=rslora
        )

    @classmethod
    def _check(cls, dims, options) -> None:
        super()._check(dims, options)
        alpha = options["alpha"]
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
            raise ArgumentError(
                f"LoRA alpha is {alpha!r}; it must be a number > 0",
                fix="pass e.g. alpha=16 (peft's lora_alpha)",
            )
        if not isinstance(options["rslora"], bool):
            raise ArgumentError(
                f"LoRA rslora is {options['rslora']!r}; it must be True or False",
                fix="pass rslora=True for alpha / sqrt(R), False for alpha / R",
            )

    @property
    def scale(self) -> float:
        """`alpha / R` (`alpha / sqrt(R)` with `rslora`): the adapter's weight in the sum."""
        r = self.dims.R
        return self.alpha / (math.sqrt(r) if self.rslora else r)

    @shaped
    def __call__(self, x: Float[Array, "*b In"]) -> Float[Array, "*b Out"]:
        """`x @ (w + scale * lora_a @ lora_b) (+ b)`: `[*b In] -> [*b Out]`."""
        y = adapted(x, self.w, self.lora_a, self.lora_b, self.scale)
        if self.b is None:
            return y
        return y + self.b.reshape((1,) * (y.ndim - 1) + self.b.shape)
