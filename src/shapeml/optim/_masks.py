"""Masks: which params a transformation applies to, chosen by dotted-name glob or by declaration.

A mask is a function from a params tree (a model, or a gradient's tree) to a tree of bools of the
same structure, as optax takes it (`optax.masked(tx, mask)`, `optax.add_decayed_weights(wd,
mask=mask)`). `mask("blocks.*.norm*")` selects by name; `decay_mask()` selects the params declared
with `sm.param(..., decay=True)` (the default), which is what weight decay uses unless told otherwise.
Masks combine with `~`, `&` and `|`, compare by value and round-trip through checkpoint metadata.
"""

from __future__ import annotations

import abc
import dataclasses
import fnmatch
import typing
from typing import Any

import jax

from .._errors import ArgumentError, ArgumentTypeError, similar
from .._traceback import api_boundary
from .._validate import shorten
from ..models import Model
from ..models._introspect import decays, dotted_name
from ._errors import MaskError

__all__ = ["Mask", "decay_mask", "mask", "mask_from_config"]


@api_boundary
class Mask(abc.ABC):
    """Selects params by dotted name; call it on a params tree for optax's tree of bools."""

    @abc.abstractmethod
    def selected(self, tree: Any) -> set[str]:
        """The dotted names of the params of `tree` this mask selects."""

    def __call__(self, tree: Any) -> Any:
        chosen = self.selected(tree)
        return jax.tree_util.tree_map_with_path(lambda p, _: dotted_name(p) in chosen, tree)

    def __invert__(self) -> Mask:
        return _Not(self)

    def __and__(self, other: Mask) -> Mask:
        return _Both(self, _checked(other))

    def __or__(self, other: Mask) -> Mask:
        return _Either(self, _checked(other))

    @abc.abstractmethod
    def config(self) -> dict[str, Any]:
        """The mask as JSON-ready data, saved in optimizer checkpoints."""


def _checked(other: Any) -> Mask:
    if not isinstance(other, Mask):
        raise ArgumentTypeError(
            f"masks combine with masks, got {shorten(other)}",
            fix='write e.g. optim.decay_mask() & ~optim.mask("embed.*")',
        )
    return other


def _names(tree: Any) -> list[str]:
    return [dotted_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


@dataclasses.dataclass(frozen=True)
class _Glob(Mask):
    patterns: tuple[str, ...]

    def selected(self, tree):
        names = _names(tree)
        chosen = set()
        for pattern in self.patterns:
            hits = fnmatch.filter(names, pattern)
            if not hits:
                raise MaskError(
                    f"optim.mask({pattern!r}) matches no param (params: "
                    f"{shorten(', '.join(names), 200)})",
                    fix=similar(pattern, names, what="param")
                    or "patterns are dotted names with shell globs, e.g. 'blocks.*.norm*'",
                )
            chosen.update(hits)
        return chosen

    def config(self):
        return {"kind": "glob", "patterns": list(self.patterns)}

    def __repr__(self):
        return f"mask({', '.join(map(repr, self.patterns))})"


@dataclasses.dataclass(frozen=True)
class _Declared(Mask):
    def selected(self, tree):
        if not isinstance(tree, Model):
            raise ArgumentTypeError(
                f"decay_mask() reads the `decay=` declarations of a model's fields, but was "
                f"applied to a {type(tree).__name__}",
                fix="use it on a shapeml optimizer's params, or select by name with optim.mask",
            )
        return {name for name, decays_ in decays(tree).items() if decays_}

    def config(self):
        return {"kind": "declared"}

    def __repr__(self):
        return "decay_mask()"


@dataclasses.dataclass(frozen=True)
class _Not(Mask):
    inner: Mask

    def selected(self, tree):
        return set(_names(tree)) - self.inner.selected(tree)

    def config(self):
        return {"kind": "not", "inner": self.inner.config()}

    def __repr__(self):
        return f"~{self.inner!r}"


@dataclasses.dataclass(frozen=True)
class _Both(Mask):
    a: Mask
    b: Mask

    def selected(self, tree):
        return self.a.selected(tree) & self.b.selected(tree)

    def config(self):
        return {"kind": "and", "a": self.a.config(), "b": self.b.config()}

    def __repr__(self):
        return f"({self.a!r} & {self.b!r})"


@dataclasses.dataclass(frozen=True)
class _Either(Mask):
    a: Mask
    b: Mask

    def selected(self, tree):
        return self.a.selected(tree) | self.b.selected(tree)

    def config(self):
        return {"kind": "or", "a": self.a.config(), "b": self.b.config()}

    def __repr__(self):
        return f"({self.a!r} | {self.b!r})"


@api_boundary
@typing.no_type_check  # validates its arguments itself, with coded errors
def mask(*patterns: str) -> Mask:
    """Selects the params whose dotted name matches one of `patterns` (shell globs).

    Example:
        >>> optim.adamw(m, lr=3e-3, mask=~optim.mask("blocks.*.norm*", "*.bias"))
        >>> optax.masked(optax.add_decayed_weights(0.1), optim.mask("head.*"))   # in any chain

    Raises:
        ArgumentTypeError: (E0003) unless every pattern is a non-empty string.
        MaskError: (E1206) when applied, for a pattern that matches no param (a typo).
    """
    if not patterns or not all(isinstance(p, str) and p for p in patterns):
        raise ArgumentTypeError(
            f"optim.mask(*patterns) takes one or more non-empty strings, got {shorten(patterns)}",
            fix='write e.g. optim.mask("blocks.*.norm*")',
        )
    return _Glob(tuple(patterns))


@api_boundary
def decay_mask() -> Mask:
    """Selects the params declared with `sm.param(..., decay=True)` (the default): the mask weight
    decay uses when none is given. Combine it: `optim.decay_mask() & ~optim.mask("embed.*")`."""
    return _Declared()


_MAX_DEPTH = 32


def mask_from_config(cfg: Any, depth: int = 0) -> Mask:
    """Rebuilds a mask from its `config()`, checking every part (E0002/E0003 when malformed)."""
    if not isinstance(cfg, dict) or depth > _MAX_DEPTH:
        raise ArgumentTypeError(
            f"a mask description is a JSON object nested at most {_MAX_DEPTH} deep, "
            f"got {shorten(cfg)}",
            fix="describe it as mask.config() does",
        )
    kind = cfg.get("kind")
    fields = {
        "glob": {"patterns"},
        "declared": set(),
        "not": {"inner"},
        "and": {"a", "b"},
        "or": {"a", "b"},
    }
    if not isinstance(kind, str) or kind not in fields or set(cfg) != {"kind", *fields[kind]}:
        raise ArgumentError(
            f"not a mask description: {shorten(cfg)}", fix="describe it as mask.config() does"
        )
    if kind == "glob":
        if not isinstance(cfg["patterns"], list):
            raise ArgumentTypeError(f"mask patterns must be a list, got {shorten(cfg['patterns'])}")
        return mask(*cfg["patterns"])
    if kind == "declared":
        return decay_mask()
    if kind == "not":
        return ~mask_from_config(cfg["inner"], depth + 1)
    a, b = mask_from_config(cfg["a"], depth + 1), mask_from_config(cfg["b"], depth + 1)
    return a & b if kind == "and" else a | b
