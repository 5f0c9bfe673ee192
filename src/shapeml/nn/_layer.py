"""`nn.Layer`: the base of every layer, and `Layer.of(...)`, which maps a layer's dims to its
parent's names and sets its options.

A sub-model takes its parent's value for every dim it shares by name. A layer's own names (a
Linear's `In`, `Out`) rarely match the parent's (`D`, `F`), so `Linear.of(In="D", Out="F")` makes a
subclass whose dims are declared as `Dims(D=.., F=.., In="D", Out="F")`: the parent's names are its
free dims, the layer's names are derived from them, and the layer's field shapes and shape-checked
forward keep using `In` and `Out`. The classes are cached, so the same call gives the same class.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from .._errors import similar
from .._validate import shorten
from ..models import Dims, Model, static
from ..models._dims import names_in
from ._errors import LayerDimsError, LayerOptionError

__all__ = ["Layer"]

_CLASSES: dict[tuple, type] = {}


class Layer(Model):
    """Base of the `shapeml.nn` layers: an `sm.Model` with `Layer.of(...)` and option checks.

    Subclasses declare `dims`, fields and options (`sm.static`), and may override `_check`
    (validates options and dims at construction) and `_variant` (options that choose a class, such
    as a Linear's bias).
    """

    # Options that pick a variant class rather than set a static field: name -> allowed values.
    _variant_options: ClassVar[dict[str, tuple]] = {}

    @classmethod
    def of(cls, **names_and_options: Any) -> type:
        """This layer class with its dims taken from the parent's under other names, and options set.

        Args:
            **names_and_options: a layer dim mapped to a parent dim's name (`In="D"`), to an
                expression of parent dims (`Out="4 * D"`), or to a fixed size (`In=64`); and the
                layer's options (`bias=False`, `stride=2`, `causal=True`, ...).

        Returns:
            A subclass (the same class for the same arguments) to declare a field with:
            `up: nn.Linear = sm.submodel(nn.Linear.of(In="D", Out="F"))`.

        Raises:
            LayerDimsError: (E1801) a dim mapped to another of the layer's own dims.
            LayerOptionError: (E1802) an unknown option or a value out of its range.
        """
        if not names_and_options:
            return cls
        key = (cls, tuple(sorted((k, repr(v)) for k, v in names_and_options.items())))
        if key in _CLASSES:
            return _CLASSES[key]
        decl = cls.dims
        statics = cls.__shapeml_statics__
        renames = {k: v for k, v in names_and_options.items() if k in decl}
        options = {k: v for k, v in names_and_options.items() if k not in decl}
        for k in options:
            if k not in statics and k not in cls._variant_options:
                known = [*decl, *statics, *cls._variant_options]
                raise LayerOptionError(
                    f"`{cls.__name__}.of` got `{k}`, which is neither one of its dims "
                    f"({', '.join(decl)}) nor one of its options "
                    f"({', '.join([*statics, *cls._variant_options]) or 'none'})",
                    fix=similar(k, known, what="dim or option")
                    or f"pass only the dims and options of `{cls.__name__}`",
                )
        variant = {k: v for k, v in options.items() if k in cls._variant_options}
        for k, v in variant.items():
            allowed = cls._variant_options[k]
            if not any(type(v) is type(a) and v == a for a in allowed):
                raise LayerOptionError(
                    f"`{cls.__name__}.of({k}={shorten(v)})`: `{k}` must be one of "
                    f"{', '.join(map(repr, allowed))}",
                    fix=f"pass {k}={allowed[0]!r}",
                )
        settings = {k: v for k, v in options.items() if k in statics}
        base = cls._variant(**variant) if variant else cls
        base._check(None, {**base.__shapeml_statics__, **settings})
        label = ", ".join(f"{k}={v}" for k, v in names_and_options.items())
        name = f"{cls.__name__}[{label}]"
        namespace: dict[str, Any] = {
            "__module__": cls.__module__,
            "__qualname__": name,
            "__doc__": f"`{cls.__name__}` as `{name}`.\n\n{cls.__doc__ or ''}",
            "__annotations__": {k: Any for k in settings},
            **{k: static(default=v) for k, v in settings.items()},
        }
        if renames:
            namespace["dims"] = _renamed(cls.__name__, decl, renames)
        elif base is not cls:
            namespace["dims"] = decl
        new = type(cls)(name, (base,), namespace)
        _CLASSES[key] = new
        return new

    @classmethod
    def _check(cls, dims: Mapping[str, int] | None, options: Mapping[str, Any]) -> None:
        """Validates options (and dims, when given); raises E1801/E1802. Default: nothing."""

    @classmethod
    def _variant(cls, **variant: Any) -> type:
        """The class that the variant options choose (default: this one)."""
        return cls

    def __check_init__(self):
        cls = type(self)
        cls._check(self.dims, {k: getattr(self, k) for k in cls.__shapeml_statics__})


def _renamed(owner: str, decl: Dims, renames: Mapping[str, Any]) -> Dims:
    """The dims declaration of a layer whose dims in `renames` take the parent's names."""
    own = decl.declarations()
    new_free: dict[str, int] = {}
    decls: dict[str, int | str] = {}
    for n, target in renames.items():
        if isinstance(target, bool) or not isinstance(target, (int, str)):
            raise LayerDimsError(
                f"`{owner}.of({n}={shorten(target)})`: a dim maps to a parent dim's name, an "
                "expression of parent dims, or a whole number",
                fix=f'write e.g. `{owner}.of({n}="D")`',
            )
        if isinstance(target, int):
            if target < 0:
                raise LayerDimsError(
                    f"`{owner}.of({n}={target})` is a negative size", fix="use >= 0"
                )
            decls[n] = target
            continue
        if target.strip() == n:
            continue
        for r in sorted(names_in(target, f"`{owner}.of({n}=...)`")):
            if r in own:
                if r in renames and renames[r] != r:
                    raise LayerDimsError(
                        f"`{owner}.of({n}={target!r})` reads `{r}`, which is one of "
                        f"`{owner}`'s own dims and is itself mapped to {renames[r]!r}",
                        fix=f"map both to parent dims of other names, e.g. "
                        f'`{owner}.of({n}="A", {r}="B")`',
                    )
                continue
            # A parent dim: its default is the layer dim's when mapped one to one.
            new_free.setdefault(r, decl[n] if target.strip() == r else 1)
        decls[n] = target
    merged = {**new_free, **{n: decls.get(n, v) for n, v in own.items()}}
    return Dims(**merged)
