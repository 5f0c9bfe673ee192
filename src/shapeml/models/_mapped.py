"""`Mapped`: a model class with some of its dims mapped onto a parent's names and options set.

A sub-model takes its parent's value for every free dim it shares by name. When its names are not
the parent's (a Linear's `In`, `Out` inside a block of `D`, `F`), the parent's field declaration
holds a `Mapped` value saying how each is computed from the parent's dims, and which options the
sub-model is built with:

    up: nn.Linear = sm.submodel(nn.Linear, In="D", Out="4 * D", bias=False)

The value is plain data (the class, by reference, and tuples), so it compares, hashes and pickles
like any value; the sub-model built from it is an instance of the class itself, with its own dim
names (`m.up.dims.In`). It may also give some of the sub-model's tensors another initializer than
their class declares (`init={"w": sm.normal(std=0.02)}`, dotted names reaching deeper), and take an
option from the parent's static field of a name (`Inherit("bias")`: `nn.MLP`'s `bias` reaches its
two Linears).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from .._errors import ShapemlError, similar
from .._traceback import api_boundary
from .._validate import shorten
from ._dims import Dims, DimsError, DimsOverrideError, evaluate, names_in
from ._statics import check_static

__all__ = ["Inherit", "Mapped", "child_dims", "map_model"]


@dataclasses.dataclass(frozen=True)
class Inherit:
    """An option a sub-model takes from its parent's static field `name` (set per instance)."""

    name: str

    def __repr__(self) -> str:
        return f"Inherit({self.name!r})"


@api_boundary
@dataclasses.dataclass(frozen=True, repr=False)
class Mapped:
    """A model class as a parent declares it: some dims mapped, some options set.

    Attributes:
        model: the sub-model's class.
        dims: `(own dim, parent expression or whole number)` pairs: the own dim's value is the
            expression evaluated in the parent's dims (`("Out", "4 * D")`), or the number.
        options: `(static field, value)` pairs the sub-model is built with; a value may be an
            `Inherit(name)`: the parent's static field `name`.
        inits: `(dotted tensor name, initializer)` pairs overriding the class's declarations.
    """

    model: type
    dims: tuple[tuple[str, int | str], ...] = ()
    options: tuple[tuple[str, Any], ...] = ()
    inits: tuple[tuple[str, Callable], ...] = ()

    def __repr__(self) -> str:
        args = [f"{k}={v!r}" for k, v in (*self.dims, *self.options)]
        if self.inits:
            args.append(f"init={dict(self.inits)!r}")
        return f"{self.model.__name__}.of({', '.join(args)})"

    def options_in(self, parent: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
        """The options with each `Inherit` replaced by the parent's static value."""
        return tuple(
            (k, parent.get(v.name) if isinstance(v, Inherit) else v) for k, v in self.options
        )

    def init(self, seed: Any = 0, *, max_bytes: int | None = None, **parent_dims: Any):
        """The sub-model as a parent with these dims would build it (a standalone layer).

        Example:
            >>> nn.Linear.of(In="D", Out="4 * D").init(seed=0, D=8).w.shape
            (8, 32)

        Raises:
            DimsOverrideError: (E0904) for a parent dim the mapping reads but was not given.
        """
        for name in sorted(reads(self)):
            if name not in parent_dims:
                raise DimsOverrideError(
                    f"`{self!r}` reads the parent dim `{name}`, which was not given",
                    fix=f"pass it: .init(seed=..., {name}=...)",
                )
        own = child_dims(self, Dims(**parent_dims))
        free = {n: own[n] for n in self.model.dims.free}
        options = {k: v for k, v in self.options if not isinstance(v, Inherit)}
        return self.model.init(seed, max_bytes=max_bytes, **free, **options)


def reads(mapped: Mapped) -> set[str]:
    """The parent dims a mapping's expressions read."""
    out: set[str] = set()
    for _, target in mapped.dims:
        if isinstance(target, str):
            out |= names_in(target)
    return out


def map_model(
    cls: type,
    names_and_options: Mapping[str, Any],
    *,
    dims_error: type[ShapemlError],
    option_error: type[ShapemlError],
) -> Mapped:
    """`cls` with the dims and options in `names_and_options`, checked (`Model.of`).

    Raises:
        dims_error: a dim mapped to something other than a name, an expression or a whole
            number, a derived dim, or one read by another mapping of the same class's dims.
        option_error: a name that is neither a dim nor an option of `cls`.
        ArgumentTypeError: (E0003) for an option value that is not a static field's value.
    """
    decl: Dims = cls.dims
    statics = cls.__shapeml_statics__
    names_and_options = dict(names_and_options)
    inits = _check_inits(cls, names_and_options.pop("init", None), option_error)
    for k in names_and_options:
        if k not in decl and k not in statics:
            raise option_error(
                f"`{cls.__name__}.of` got `{k}`, which is neither one of its dims "
                f"({', '.join(decl) or 'none'}) nor one of its options "
                f"({', '.join(statics) or 'none'})",
                fix=similar(k, [*decl, *statics], what="dim or option")
                or f"pass only the dims and options of `{cls.__name__}`",
            )
    renames = {k: v for k, v in names_and_options.items() if k in decl}
    for n, target in renames.items():
        _check_target(cls.__name__, decl, n, target, renames, dims_error)
    dims = tuple(
        (n, renames[n])
        for n in decl
        if n in renames and not (isinstance(renames[n], str) and renames[n].strip() == n)
    )
    options = tuple(
        (
            k,
            names_and_options[k]
            if isinstance(names_and_options[k], Inherit)
            else check_static(cls.__name__, k, names_and_options[k]),
        )
        for k in statics
        if k in names_and_options
    )
    return Mapped(cls, dims, options, inits)


def tensor_names(cls: type, prefix: str = "") -> list[str]:
    """Every param and buffer a `cls` may hold, by dotted name without layer numbers (a
    `submodels` field's layers share one name: `blocks.attn.w`)."""
    out: list[str] = []
    for name, spec in cls.__shapeml_fields__.items():
        if spec.kind in ("submodel", "submodels"):
            out += tensor_names(spec.model, f"{prefix}{name}.")
        else:
            out.append(prefix + name)
    return out


def _check_inits(cls: type, inits: Any, error: type[ShapemlError]) -> tuple:
    if inits is None:
        return ()
    names = tensor_names(cls)
    example = f'init={{"{names[0] if names else "w"}": sm.normal(std=0.02)}}'
    if not isinstance(inits, Mapping) or not inits:
        raise error(
            f"`{cls.__name__}.of(init={shorten(inits)})`: init maps tensor names to initializers",
            fix=f"write e.g. `{example}`",
        )
    for k, v in inits.items():
        if k not in names:
            raise error(
                f"`{cls.__name__}.of(init=...)` names `{k}`, which is not one of its tensors "
                f"({', '.join(names) or 'none'})",
                fix=similar(str(k), names, what="tensor") or f"write e.g. `{example}`",
            )
        if not callable(v):
            raise error(
                f"`{cls.__name__}.of(init=...)` gives `{k}` {shorten(v)}, which is not an "
                "initializer",
                fix=f"pass one, e.g. `{example}` (any `(key, shape, dtype) -> array` callable)",
            )
        try:
            hash(v)
        except TypeError:
            raise error(
                f"`{cls.__name__}.of(init=...)`: the initializer of `{k}` is not hashable",
                fix="use sm.normal(...), sm.uniform(...), nn.fan_in(...) or a plain function",
            ) from None
    return tuple(sorted(inits.items()))


def _check_target(owner, decl: Dims, n: str, target: Any, renames, error) -> None:
    if isinstance(target, bool) or not isinstance(target, (int, str)):
        raise error(
            f"`{owner}.of({n}={shorten(target)})`: a dim maps to a parent dim's name, an "
            "expression of parent dims, or a whole number",
            fix=f'write e.g. `{owner}.of({n}="D")`',
        )
    if n in decl.derived:
        reads_ = ", ".join(sorted(names_in(decl.derived[n])))
        raise error(
            f"`{owner}.of({n}=...)`: `{n}` = `{decl.derived[n]}` is derived in `{owner}`, so it "
            "cannot be mapped",
            fix=f"map the dims it is computed from ({reads_})",
        )
    if isinstance(target, int):
        if target < 0:
            raise error(f"`{owner}.of({n}={target})` is a negative size", fix="use >= 0")
        return
    for r in sorted(names_in(target, f"`{owner}.of({n}=...)`")):
        if r != n and r in renames and isinstance(renames[r], str) and renames[r].strip() != r:
            # `In="Out", Out="D"` reads like a swap of the layer's own names: refused as unclear.
            raise error(
                f"`{owner}.of({n}={target!r})` reads `{r}`, which is one of `{owner}`'s own "
                f"dims and is itself mapped to {renames[r]!r}",
                fix=f'map both to parent dims of other names, e.g. `{owner}.of({n}="A", {r}="B")`',
            )


def child_dims(spec: Any, parent: Mapping[str, int]) -> Dims:
    """A sub-model's dims: each mapped dim computed from the parent's, every other free dim it
    shares with the parent by name taken from the parent, the rest as its class declares.

    `spec` is a `Mapped`, a sub-model class, or a field declaration with `.model` and `.mapped`.

    Raises:
        DimsError: (E0903) when a derived dim of the child disagrees with the parent's dim of the
            same name.
    """
    if isinstance(spec, type):
        spec = Mapped(spec)
    elif not isinstance(spec, Mapped):
        spec = spec.mapped
    cls = spec.model
    decl: Dims = cls.dims
    mapped = dict(spec.dims)
    values = {n: evaluate(mapped[n], parent, f"`{spec!r}`: dim `{n}`") for n in mapped}
    values.update({n: parent[n] for n in decl.free if n not in mapped and n in parent})
    dims = decl.resolve(**values)
    for n in decl.derived:
        if n in parent and dims[n] != parent[n]:
            raise DimsError(
                f"`{cls.__name__}` derives {n} = {dims[n]} but its parent has {n} = {parent[n]}",
                fix=f"make the two declarations of `{n}` agree, or name the parent's dim "
                "differently",
            )
    return dims
