"""`nn.Layer`: the base of every layer, an `sm.Model` whose options are checked when it is declared
and when it is built.

A layer is declared in a parent like any sub-model: `sm.submodel(nn.Linear, In="D", Out="F",
bias=False)` (or the same value spelled `nn.Linear.of(In="D", Out="F", bias=False)`) maps the
layer's dims onto the parent's names and sets its options; the layer built from it is a `Linear`
with its own dims (`In`, `Out`) and its options as static fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._traceback import api_boundary
from ..models import Model
from ..models._mapped import Inherit, Mapped, map_model
from ._errors import LayerDimsError, LayerOptionError

__all__ = ["Layer"]


@api_boundary
class Layer(Model):
    """Base of the `shapeml.nn` layers: an `sm.Model` with checked options.

    Subclasses declare `dims`, fields and options (`sm.static(default=...)`), an `init` whose
    signature lists every dim and option with its default, and may override `_check`, which
    validates options (and dims, when given) whenever the layer is declared or built.
    """

    @classmethod
    def of(cls, **dims_and_options: Any) -> Mapped:
        """This layer as a parent's field declares it: dims mapped, options set.

        `sm.submodel(nn.Linear, In="D", Out="F")` declares the same sub-model, and is the
        spelling the guide uses; `of` names the value, to reuse it (`proj = nn.Linear.of(...)`).

        Args:
            **dims_and_options: a layer dim mapped to a parent dim's name (`In="D"`), to an
                expression of parent dims (`Out="4 * D"`), or to a fixed size (`In=64`); and the
                layer's options (`bias=False`, `stride=2`, `causal=True`, ...); and `init=`, a
                mapping of the layer's tensor names to initializers that replace the declared
                ones (`init={"w": sm.normal(std=0.02)}`).

        Returns:
            A `shapeml.models.Mapped` value: `up: nn.Linear = sm.submodel(nn.Linear.of(...))`.

        Raises:
            LayerDimsError: (E1801) a dim mapped to a non-name, a derived dim, or a dim mapped
                to another of the layer's own dims that is itself mapped.
            LayerOptionError: (E1802) an unknown option or a value out of its range, or an
                `init=` naming no tensor of the layer or giving something not an initializer.
        """
        mapped = map_model(
            cls, dims_and_options, dims_error=LayerDimsError, option_error=LayerOptionError
        )
        # an inherited option is the parent's value, checked when the layer is built
        given = {k: v for k, v in mapped.options if not isinstance(v, Inherit)}
        cls._check(None, {**cls.__shapeml_statics__, **given})
        return mapped

    @classmethod
    def _check(cls, dims: Mapping[str, int] | None, options: Mapping[str, Any]) -> None:
        """Validates options (and dims, when given); raises E1801/E1802. Default: nothing."""

    def __check_init__(self):
        cls = type(self)
        cls._check(self.dims, {k: getattr(self, k) for k in cls.__shapeml_statics__})
