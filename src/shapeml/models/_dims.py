"""Named dims: declared once per model class, free (a number) or derived (an expression of others).

`Dims(S=16, P=4, N="(S // P) ** 2")` is both the declaration and, once resolved, the values: it is
a read-only mapping `name -> int`, with attribute access (`dims.N == 16`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from .._errors import ArgumentError, ArgumentTypeError, ShapemlError, similar
from .._traceback import api_boundary
from .._validate import integer, shorten
from ._dim_expr import MAX_DIM, ExprError, compute, names

__all__ = [
    "MAX_DIM",
    "Dims",
    "DimsError",
    "DimsOverrideError",
    "UnknownDimError",
    "evaluate",
    "names_in",
]


class DimsError(
    ShapemlError,
    ValueError,
    code="E0903",
    title="invalid dims declaration",
    explanation="""
A model's `sm.Dims(...)` declaration, or a shape in one of its fields, could not be resolved to
non-negative whole numbers.

Each dim is either a number (`D=32`, a free dim users can override at `init`) or a string holding an
expression of other dims (`N="(S // P) ** 2"`, a derived dim). Expressions may use `+ - * // / % **`,
parentheses, whole numbers and dim names; `/` must divide exactly. A derived dim may not depend on
itself, directly or through others, and every name must be declared.

    class Spotter(sm.Model):
        dims = sm.Dims(S=16, P=4, N="(S // P) ** 2")   # N = 16
""",
):
    pass


class DimsOverrideError(
    ShapemlError,
    ValueError,
    code="E0904",
    title="invalid dims override",
    explanation="""
`Model.init(seed=..., **dims)` (or a checkpoint's dims) named a dim the model does not declare,
overrode a derived dim, or gave a value that is not a non-negative whole number.

Only free dims (those declared as numbers) can be overridden; derived dims follow from them:

    m = Spotter.init(seed=0, D=64)        # fine: D is free
    m = Spotter.init(seed=0, N=25)        # E0904: N is derived from S and P; override S or P
""",
):
    pass


class UnknownDimError(
    ShapemlError,
    AttributeError,
    code="E0907",
    title="unknown dim",
    explanation="""
Code read a dim (`m.dims.X`) that the model does not declare. The message lists the declared dims
and, when one is close, suggests it.
""",
):
    pass


def _whole(name: str, value: Any, error: type[ShapemlError], fix: str) -> int:
    """`value` as an int in `0 .. MAX_DIM` (numpy ints exactly, no bools or floats), or `error`."""
    try:
        return integer(name, value, low=0, high=MAX_DIM, fix=fix)
    except (ArgumentError, ArgumentTypeError) as e:
        over = isinstance(e, ArgumentError) and int(value) > MAX_DIM
        kind = "" if isinstance(e, ArgumentError) else f" ({type(value).__name__})"
        raise error(
            f"dim `{name}` must be a whole number >= 0, got {shorten(value)}{kind}"
            + (", more than the largest dim 2**62" if over else ""),
            fix=fix,
        ) from None


def names_in(expr: str, where: str = "dim expression") -> set[str]:
    """The dim names an expression reads.

    Raises:
        DimsError: (E0903) for a string that is not an expression of dims.
    """
    try:
        return names(expr, where)
    except ExprError as e:
        raise DimsError(str(e), fix=e.fix) from None


def evaluate(expr: str | int, values: Mapping[str, int], where: str = "dim expression") -> int:
    """Evaluates a dim expression against resolved dim values.

    Every intermediate value is checked against `MAX_DIM` (powers before they are computed), so
    no expression can build a huge number or hang.

    Raises:
        DimsError: (E0903) for an unknown name, a non-integer, negative or too large result.
    """
    if isinstance(expr, int):
        return expr
    try:
        return compute(expr, values, where)
    except ExprError as e:
        raise DimsError(str(e), fix=e.fix) from None


@api_boundary
class Dims(Mapping[str, int]):
    """Named dims of a model: free dims are numbers, derived dims are expression strings.

    Example:
        >>> dims = Dims(S=16, P=4, N="(S // P) ** 2")
        >>> dims.N, dims["S"], dims.free
        (16, 16, ('S', 'P'))
        >>> dims.resolve(S=32).N
        64

    Raises:
        DimsError: (E0903) for an invalid expression, an unknown name, a cycle, or a value that is
            not a non-negative whole number.
    """

    __slots__ = ("_decls", "_values")

    def __init__(self, **decls: Any):  # int or expression str, validated below
        fix = 'give a whole number >= 0 (`D=32`) or an expression string (`N="S // P"`)'
        decls = {
            n: v if isinstance(v, str) else _whole(n, v, DimsError, fix) for n, v in decls.items()
        }
        object.__setattr__(self, "_decls", decls)
        object.__setattr__(self, "_values", self._resolve())

    def _resolve(self) -> dict[str, int]:
        deps = {
            n: names_in(v, f"dim `{n}`") if isinstance(v, str) else set()
            for n, v in self._decls.items()
        }
        for n, used in deps.items():
            for u in used:
                if u not in self._decls:
                    raise DimsError(
                        f"dim `{n}` = `{self._decls[n]}` reads `{u}`, which is not declared",
                        fix=similar(u, self._decls, what="dim") or f"declare `{u}` in sm.Dims",
                    )
        values: dict[str, int] = {}
        for n in self._decls:
            _visit(n, self._decls, deps, values, [])
        return {n: values[n] for n in self._decls}

    @property
    def free(self) -> tuple[str, ...]:
        """Names of the dims declared as numbers (the ones `init` can override)."""
        return tuple(n for n, v in self._decls.items() if isinstance(v, int))

    @property
    def derived(self) -> dict[str, str]:
        """Derived dims, name -> expression."""
        return {n: v for n, v in self._decls.items() if isinstance(v, str)}

    def resolve(self, **overrides: Any) -> Dims:  # ints, validated below
        """These dims with some free dims replaced, derived dims recomputed.

        Raises:
            DimsOverrideError: (E0904) for an unknown or derived dim, or a bad value.
        """
        if not overrides:
            return self
        for n, v in overrides.items():
            if n not in self._decls:
                raise DimsOverrideError(
                    f"there is no dim `{n}` to override (dims: {', '.join(self._decls) or 'none'})",
                    fix=similar(n, self._decls, what="dim"),
                )
            if n in self.derived:
                reads = ", ".join(sorted(names_in(self._decls[n])))
                raise DimsOverrideError(
                    f"`{n}` = `{self._decls[n]}` is derived, so it cannot be set to {v}",
                    fix=f"override the dims it is computed from ({reads})",
                )
            fix = f"pass a whole number >= 0, e.g. `{n}={self._values[n]}`"
            overrides[n] = _whole(n, v, DimsOverrideError, fix)
        return Dims(**{**self._decls, **overrides})

    def __getitem__(self, name: str) -> int:
        return self._values[name]

    def __getattr__(self, name: str) -> int:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise UnknownDimError(
                f"no dim `{name}` (dims: {', '.join(self._values) or 'none'})",
                fix=similar(name, self._values, what="dim"),
            ) from None

    def __setattr__(self, name, value):
        raise AttributeError("Dims are immutable: use dims.resolve(name=value) for new values")

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __hash__(self) -> int:
        return hash(tuple(self._decls.items()))

    def __eq__(self, other) -> bool:
        if isinstance(other, Dims):
            return self._decls == other._decls
        return NotImplemented

    def __reduce__(self):
        return (_rebuild, (self._decls,))

    def __repr__(self) -> str:
        parts = [
            f"{n}={self._values[n]}" if isinstance(v, int) else f"{n}={self._values[n]} ({v})"
            for n, v in self._decls.items()
        ]
        return f"Dims({', '.join(parts)})"

    def declarations(self) -> dict[str, int | str]:
        """The declarations as given (free dims as numbers, derived ones as expressions)."""
        return dict(self._decls)


def _visit(n: str, decls: dict, deps: dict, values: dict[str, int], visiting: list[str]) -> None:
    """Resolves dim `n` into `values`, its dependencies first (a module-level function rather
    than a closure, so nothing is re-created per `Dims`)."""
    if n in values:
        return
    if n in visiting:
        cycle = " -> ".join([*visiting[visiting.index(n) :], n])
        raise DimsError(
            f"dims depend on themselves: {cycle}", fix="make one of them a number (a free dim)"
        )
    visiting.append(n)
    for u in sorted(deps[n]):
        _visit(u, decls, deps, values, visiting)
    visiting.pop()
    values[n] = evaluate(decls[n], values, f"dim `{n}`")


def _rebuild(decls):
    return Dims(**decls)
