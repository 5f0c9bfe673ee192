"""A griffe extension for the API reference (`mkdocs.yml` loads it): reads three idioms shapeml's
Google-style docstrings use that griffe's parser does not, so they render instead of being dropped.

- `Example:` followed by `>>>` lines: griffe reads only the plural `Examples:` as code examples.
- `a, b: description` in `Args:` or `Attributes:`: one entry per name, each with the description (a name that is
  not a parameter still fails the strict build).
- a `Raises:` section written as prose (`A (E1601), B (E1602).`, no `Name: description` pair on
  each entry): rendered as a paragraph titled "Raises" rather than parsed, so no entry is lost.
"""

from __future__ import annotations

import re

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


class HouseDocstrings(griffe.Extension):
    """Rewrites each docstring with `normalize` before griffe parses it."""

    def on_object(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = normalize(obj.docstring.value)
