"""A griffe extension (mkdocs.yml) for what griffe's Google parser does not read in shapeml's
docstrings, which would otherwise be dropped or fail the strict build: `Example:` before `>>>`
lines (griffe reads `Examples:`); `a, b: description` in `Args:` or `Attributes:` (one entry per
name); a `Raises:` section in prose (kept as a note titled "Raises"); a coded error's `__doc__`,
set at run time by `shapeml._errors`; a public module constant's comment (on its line or above).
It also shows how a model class is built, its `init` (whose signature each class makes from its
dims and options at run time) in place of `Model.__init__`'s `(*, dims=None, **values)`, and
leaves private base classes out of "Bases:".
"""

from __future__ import annotations

import inspect
import re

import griffe

SECTION = re.compile(r"^(?P<indent> *)(?P<title>Example|Args|Arguments|Attributes|Raises):[ \t]*$")
GROUPED = re.compile(r"^(?P<pad> *)(?P<names>\w+(?: *, *\w+)+)(?P<rest> *(?:\([^)]*\))? *:.*)$")
COMMENT = re.compile(r"^\s*#\s?(?P<text>.*)$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _rewrite(title: str, indent: str, body: list[str]) -> list[str]:
    if title == "Example":
        return [f"{indent}Examples:", *body]
    least = min((_indent(x) for x in body if x.strip()), default=0)
    items: list[list[str]] = []  # each entry: its first line (least indented), then the rest
    for line in body:
        if line.strip() and _indent(line) == least or not items:
            items.append([line])
        else:
            items[-1].append(line)
    if title == "Raises":
        prose = not all(":" in item[0] for item in items)
        return [f"{indent}{'Note: Raises' if prose else 'Raises:'}", *body]
    out = [f"{indent}{title}:"]
    for first, *rest in items:
        m = GROUPED.match(first)
        names = [n.strip() for n in m["names"].split(",")] if m else [None]
        for name in names:
            out += [f"{m['pad']}{name}{m['rest']}" if m else first, *rest]
    return out


def normalize(text: str) -> str:
    """`text` (a dedented docstring) with the idioms above rewritten as griffe reads them."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        m = SECTION.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        end = i + 1
        while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > len(m[1])):
            end += 1
        while end > i + 1 and not lines[end - 1].strip():  # trailing blank lines stay outside
            end -= 1
        out += _rewrite(m["title"], m["indent"], lines[i + 1 : end])
        i = end
    return "\n".join(out)


def _runtime_doc(obj: griffe.Object) -> str | None:
    """A class's own `__doc__` at run time (None: it has none, or its module does not import)."""
    try:
        value = griffe.dynamic_import(obj.path)
    except ImportError:
        return None
    doc = value.__dict__.get("__doc__") if isinstance(value, type) else None
    return inspect.cleandoc(doc) if doc else None


def _comment_doc(obj: griffe.Object) -> str | None:
    """A public module constant's comment: on its line, else the comment lines right above it."""
    if not (obj.is_attribute and obj.parent.is_module and obj.lineno) or obj.name[0] == "_":
        return None
    lines = obj.module.lines
    own = lines[obj.lineno - 1].partition("  #")[2].strip()
    above, at = [], obj.lineno - 2
    while not own and at >= 0 and (m := COMMENT.match(lines[at])):
        above.insert(0, m["text"])
        at -= 1
    text = " ".join(x for x in ([own] if own else above) if x)
    return f"{text[:1].upper()}{text[1:]}" if text else None


_KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: griffe.ParameterKind.positional_only,
    inspect.Parameter.POSITIONAL_OR_KEYWORD: griffe.ParameterKind.positional_or_keyword,
    inspect.Parameter.VAR_POSITIONAL: griffe.ParameterKind.var_positional,
    inspect.Parameter.KEYWORD_ONLY: griffe.ParameterKind.keyword_only,
    inspect.Parameter.VAR_KEYWORD: griffe.ParameterKind.var_keyword,
}


def init_signature(cls: griffe.Class) -> griffe.Function | None:
    """`cls.init` as griffe sees a constructor, for a `shapeml.Model` subclass (else None)."""
    try:
        value = griffe.dynamic_import(cls.path)
        from shapeml.models import Model
    except ImportError:
        return None
    if not (isinstance(value, type) and issubclass(value, Model)):
        return None
    params = [
        griffe.Parameter(
            p.name,
            annotation=None if p.annotation is p.empty else str(p.annotation),
            kind=_KINDS[p.kind],
            default=None if p.default is p.empty else repr(p.default),
        )
        for p in inspect.signature(value.init).parameters.values()
    ]
    return griffe.Function("__init__", parameters=griffe.Parameters(*params), parent=cls)


class HouseDocstrings(griffe.Extension):
    """Fills the docstrings griffe does not see, then `normalize`s each before griffe parses it;
    a model class's signature is its `init`'s; private bases are left out."""

    def on_class_members(self, *, cls: griffe.Class, **kwargs) -> None:
        cls.bases = [b for b in cls.bases if not str(b).rsplit(".", 1)[-1].startswith("_")]
        if (init := init_signature(cls)) is not None:
            cls.set_member("__init__", init)

    def on_object(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is None and not obj.is_alias:
            text = _runtime_doc(obj) if obj.is_class else _comment_doc(obj)
            if text:
                obj.docstring = griffe.Docstring(text, parent=obj)
        if obj.docstring is not None:
            obj.docstring.value = normalize(obj.docstring.value)
