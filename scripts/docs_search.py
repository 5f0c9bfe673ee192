"""The site's search, tuned (scripts/mkdocs_hooks.py applies it; mkdocs-material indexes the pages).

- Ranking: each page gets mkdocs-material's `search.boost` by its kind (`SEARCH_BOOST`), so the
  guide and the API reference come before the tutorials and the whole-file pages of the example
  scripts and exercise solutions.
- Left out of the index (`data-search-exclude`): a notebook's outputs (plots, tables, tracebacks),
  the hidden copies of its code, its prompts and copy buttons; the whole file shown on a script page
  (its title and introduction stay); the API entries' "Used in" lines.
- Sections: the theme splits a page into sections at its headings, but a notebook's headings sit
  inside their cells, so every cell after the first heading's would fall back into the page's
  first section; the index reads `index_view` of a notebook, its cells unwrapped.
"""

from __future__ import annotations

import re

import docs_xref

SEARCH_BOOST = {"guide": 2.0, "api": 2.0, "home": 1.0, "tutorial": 0.5, "script": 0.3}
# A notebook's outputs, its hidden copies of the code, the prompts, copy buttons and cell tags.
NOTEBOOK_NOISE = [
    '<div class="jp-Cell-outputWrapper"',
    '<div class="clipboard-copy-txt"',
    '<div class="jp-InputPrompt',
    '<div class="zeroclipboard-container"',
    '<div class="celltoolbar"',
]
WHOLE_FILE = re.compile(r'<div class="(?:language-\w+ )?highlight"')


def page_kind(src: str) -> str:
    """What a site source is: home, guide, api, tutorial or script (a whole-file page)."""
    if src == "index.md":
        return "home"
    if src.startswith("api/"):
        return "api"
    if src.endswith(".ipynb"):
        return "tutorial"
    if src.startswith(("tutorials/solutions/", "examples/")):
        return "script"
    return "guide"


def prepare(html: str, kind: str, meta: dict) -> str:
    """Sets the page's boost in `meta` and marks what the index leaves out in `html`."""
    meta.setdefault("search", {}).setdefault("boost", SEARCH_BOOST[kind])
    if kind == "script":
        return WHOLE_FILE.sub(lambda m: m.group(0) + " data-search-exclude", html, count=1)
    if kind == "tutorial":
        for noise in NOTEBOOK_NOISE:
            html = html.replace(noise, noise.replace("<div", "<div data-search-exclude", 1))
    return html


def index_view(html: str) -> str:
    """A notebook's HTML as the index reads it: without what it leaves out, no `div` left."""
    out, skip = [], 0
    for token in docs_xref.tokens(html):
        tag = docs_xref.tag_of(token)
        if tag and tag[0] == "div":
            if skip:
                skip += -1 if tag[1] else 1
            elif not tag[1] and "data-search-exclude" in token:
                skip = 1
            continue
        if not skip:
            out.append(token)
    return "".join(out)
