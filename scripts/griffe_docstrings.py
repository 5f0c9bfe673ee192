"""A griffe extension for the API reference (`mkdocs.yml` loads it): reads three idioms shapeml's
Google-style docstrings use that griffe's parser does not, so they render instead of being dropped.

- `Example:` followed by `>>>` lines: griffe reads only the plural `Examples:` as code examples.
- `a, b: description` in `Args:` or `Attributes:`: one entry per name, each with the description (a name that is
  not a parameter still fails the strict build).
- a `Raises:` section written as prose (`A (E1601), B (E1602).`, no `Name: description` pair on
  each entry): rendered as a paragraph titled "Raises" rather than parsed, so no entry is lost.

It also fills two kinds of docstrings the source has in another form than griffe reads:

- a class without a docstring whose runtime `__doc__` is its own (every coded error and warning:
  `shapeml._errors` makes its title and long explanation its `__doc__`);
- a module constant without a docstring: its comment (on its line, or the comment lines right
  above it).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import io
import re
import tokenize

import griffe

SECTION = re.compile(r"^(?P<indent> *)(?P<title>Example|Args|Arguments|Attributes|Raises):[ \t]*$")
GROUPED = re.compile(r"^(?P<names>\w+(?: *, *\w+)+)(?P<rest> *(?:\([^)]*\))? *:.*)$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _items(body: list[str]) -> list[list[str]]:
    """The section's entries: each starts at the body's least indentation."""
    least = min(_indent(line) for line in body if line.strip())
    items: list[list[str]] = []
    for line in body:
        if line.strip() and _indent(line) == least:
            items.append([line])
        elif items:
            items[-1].append(line)
    return items


def _rewrite(title: str, indent: str, body: list[str]) -> list[str]:
    if title == "Example":
        return [f"{indent}Examples:", *body]
    if not any(line.strip() for line in body):
        return [f"{indent}{title}:", *body]
    items = _items(body)
    if title == "Raises":
        if all(":" in item[0] for item in items):
            return [f"{indent}Raises:", *body]
        return [f"{indent}Note: Raises", *body]  # an admonition titled "Raises", kept as prose
    out = [f"{indent}{title}:"]
    for item in items:
        first = item[0].strip()
        m = GROUPED.match(first)
        pad = item[0][: _indent(item[0])]
        names = [n.strip() for n in m["names"].split(",")] if m else [None]
        for name in names:
            out.append(f"{pad}{name}{m['rest']}" if m else item[0])
            out.extend(item[1:])
    return out


def normalize(text: str) -> str:
    """`text` (a dedented docstring) with the three idioms rewritten as griffe reads them."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        m = SECTION.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        end = i + 1
        while end < len(lines) and (
            not lines[end].strip() or _indent(lines[end]) > len(m["indent"])
        ):
            end += 1
        while end > i + 1 and not lines[end - 1].strip():  # trailing blank lines stay outside
            end -= 1
        out += _rewrite(m["title"], m["indent"], lines[i + 1 : end])
        i = end
    return "\n".join(out)


def _runtime_doc(obj: griffe.Object) -> str | None:
    """The class's own `__doc__` at run time (None: not a class of its own text, or no import)."""
    module = obj.module.path
    try:
        value = importlib.import_module(module)
        for part in obj.path.removeprefix(module + ".").split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError):
        return None
    doc = value.__dict__.get("__doc__") if isinstance(value, type) else None
    return inspect.cleandoc(doc) if doc else None


@functools.cache
def _comments(source: str) -> dict[int, tuple[str, bool]]:
    """Line number -> (its comment, whether the comment is the whole line)."""
    found = {}
    with_code = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                found[tok.start[0]] = tok.string.lstrip("#").strip()
            elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
                with_code.update(range(tok.start[0], tok.end[0] + 1))
    except (tokenize.TokenError, SyntaxError):
        return {}
    return {line: (text, line not in with_code) for line, text in found.items()}


TOOL_COMMENT = re.compile(r"^(noqa|type:|fmt:|pragma|pyright|mypy)")


def _comment_doc(obj: griffe.Object) -> str | None:
    """A module constant's comment: the one on its line, else the comment lines right above it."""
    if not (obj.is_attribute and obj.parent is not None and obj.parent.is_module and obj.lineno):
        return None
    if obj.name.startswith("_"):
        return None
    comments = _comments("\n".join(obj.module.lines))
    text, whole = comments.get(obj.lineno, ("", True))
    lines = [text] if text and not whole else []
    if not lines:
        line = obj.lineno - 1
        while comments.get(line, ("", False))[1]:
            lines.insert(0, comments[line][0])
            line -= 1
    text = " ".join(line for line in lines if line and not TOOL_COMMENT.match(line))
    return f"{text[:1].upper()}{text[1:]}" if text else None


class HouseDocstrings(griffe.Extension):
    """Fills the docstrings griffe does not see, then rewrites each with `normalize` before griffe
    parses it."""

    def on_object(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is None and not obj.is_alias:
            text = _runtime_doc(obj) if obj.is_class else _comment_doc(obj)
            if text:
                obj.docstring = griffe.Docstring(text, parent=obj)
        if obj.docstring is not None:
            obj.docstring.value = normalize(obj.docstring.value)
