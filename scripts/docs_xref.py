"""Cross-references of the shapeml site, made on the rendered HTML of every page (the hooks in
scripts/mkdocs_hooks.py call `link_site` once every page is rendered), so new text is linked
without any markup:

- inline code naming a public API object (`sm.shard`, `optim.adamw`, `nn.Linear`, `Graph`,
  `Model.init`, `sm.param(..., decay=False)`) links to its entry in the API reference;
- every error or warning code (`E0901`), in text, code or a rendered traceback, links to its entry
  in the error index;
- each API entry lists the guide pages, tutorials and examples that use it ("Used in"), and the
  API pages' summary tables get the first sentence of each entry.

`Names` says which code is an API name; scripts/check_site.py uses the same rules to check that
every one is a link.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field

import docs_api
from mkdocs.utils import get_relative_url

# A tag, a comment, or a script, style, svg or textarea with its content: what is not text.
TOKEN = re.compile(
    r"<!--.*?-->|<(script|style|svg|textarea)\b.*?</\1\s*>|<(?:\"[^\"]*\"|'[^']*'|[^'\">])*>",
    re.S | re.I,
)
TAG_NAME = re.compile(r"</?([a-zA-Z][\w-]*)")
# Tags whose text gets no link: already a link, a heading, a button, the page's title.
NO_LINK = {"a", "h1", "h2", "h3", "h4", "h5", "h6", "button", "autoref", "title"}
CODE_NAME = re.compile(r"@?(?P<name>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?P<rest>[(\[].*)?", re.S)
ERROR_CODE = re.compile(r"(?<![\w/#-])([EW]\d{4})(?![\w-])")
# Packages whose names are linked only when written qualified (`spotter.predict`): tutorials
# define their own `Spotter`, `forward` and `loss`.
QUALIFIED_ONLY = ("shapeml.zoo", "shapeml.apps", "shapeml.data.shapes")


def tokens(text: str) -> list[str]:
    """`text` split into tags (and comments, scripts, styles) and the text between them."""
    out, pos = [], 0
    for m in TOKEN.finditer(text):
        out += [text[pos : m.start()], m.group(0)]
        pos = m.end()
    out.append(text[pos:])
    return out


def tag_of(token: str) -> tuple[str, bool] | None:
    """(tag name, is a closing tag) of a tag token; None for text, comments, scripts."""
    if not token.startswith("<") or token.startswith("<!"):
        return None
    m = TAG_NAME.match(token)
    return (m.group(1).lower(), token.startswith("</")) if m else None


@dataclass
class Names:
    """Which names in code are API names, and where each is documented."""

    targets: dict[str, tuple[str, str]]  # written name -> (API page source, anchor)
    homes: dict[str, str] = field(default_factory=dict)  # anchor -> the API page documenting it
    members: set[str] = field(default_factory=set)  # anchors of documented members (`X.init`)

    @classmethod
    def build(cls) -> Names:
        entries = docs_api.api_entries()
        for package in docs_api.public_packages():
            entries[package] = (docs_api.api_src(package), "")
        by_alias: dict[str, set[tuple[str, str]]] = {}
        for qualified, target in entries.items():
            parts = qualified.split(".")[1:]  # without `shapeml`
            aliases = {qualified, ".".join(["sm", *parts])}
            if target[1]:  # an object, not a package: `optim.adamw`, `spotter.predict`, `adamw`
                aliases |= {".".join(parts[i:]) for i in range(len(parts))}
            for alias in aliases:
                bare = "." not in alias and qualified.startswith(QUALIFIED_ONLY)
                by_alias.setdefault(alias, set()).add(("", "") if bare else target)
        # A name that means two things (`param`: `sm.param` and `state.param`; `step`) is no
        # API name unless qualified; nor is a bare zoo name (tutorials define their own `forward`).
        targets = {a: next(iter(found)) for a, found in by_alias.items() if len(found) == 1}
        targets = {alias: target for alias, target in targets.items() if target[0]}
        return cls(targets, {anchor: src for src, anchor in entries.values() if anchor})

    def resolve(self, code: str) -> tuple[str, str, str] | None:
        """(page, anchor, name) that inline `code` refers to, or None when it is no API name.

        Code is an API name when it starts with one and the rest is a call or a subscript:
        `sm.shard(m, mesh, rules)`, `Grad[Spotter]`, `Model.init`. A bare lowercase name without
        `_` (`hoist`, `state`) counts only as a call (`hoist(f)`); constants only qualified.
        """
        m = CODE_NAME.fullmatch(html.unescape(code).strip())
        if not m:
            return None
        parts = m["name"].split(".")
        for n in range(len(parts), 0, -1):
            name = ".".join(parts[:n])
            if name not in self.targets:
                continue
            if n == 1 and not _distinct(name, called=bool(m["rest"]) and len(parts) == 1):
                return None
            page, anchor = self.targets[name]
            extra = parts[n:]
            if len(extra) > 1 or (extra and not anchor):
                return None  # `sm.Model.init.foo`, `shapeml.nn.foo`: not something documented
            if extra and f"{anchor}.{extra[0]}" in self.members:
                anchor = f"{anchor}.{extra[0]}"
            return page, anchor, ".".join(parts)
        return None


def _distinct(name: str, called: bool) -> bool:
    """Whether a bare name is distinctive enough to be an API name in code."""
    if name.isupper():
        return False  # a constant (`SIZE`): only qualified
    return name[:1].isupper() or "_" in name or called


@dataclass
class Page:
    """One rendered page: its source, URL, title and HTML (rewritten in place)."""

    src: str
    url: str
    title: str
    html: str
    kind: str = "guide"  # or "api", "tutorial", "home", "script" (docs_search.page_kind)

    @property
    def is_api(self) -> bool:
        return self.kind == "api"

    @property
    def short_title(self) -> str:
        """The title without its subtitle ("Training: shapeml.training and ..." -> "Training")."""
        return self.title.split(": ", 1)[0] if self.kind == "guide" else self.title


def _href(from_url: str, to_url: str, anchor: str) -> str:
    if to_url == from_url:
        return f"#{anchor}" if anchor else "./"
    rel = get_relative_url(to_url or ".", from_url or ".")
    return f"{rel}#{anchor}" if anchor else rel


def _heading_id(token: str) -> str | None:
    m = re.search(r'\bid="([^"]+)"', token)
    return m.group(1) if m else None


def _code_uses(code: str, names: Names) -> list[tuple[str, str]]:
    """The API objects a code block uses: qualified names (`sm.shard`) and bare class names."""
    found = []
    for m in re.finditer(r"(?<![\w.])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", code):
        if "." in m.group(0) or m.group(0)[:1].isupper():
            hit = names.resolve(m.group(0))
            if hit and hit[1]:
                found.append(hit[:2])
    return found


def link_page(page: Page, names: Names, urls: dict[str, str], errors: tuple[str, dict]) -> list:
    """Links the API names in `page`'s inline code and its error codes; returns what it uses, in
    order: [(API page source, anchor, id of the heading it is under)]."""
    errors_url, error_ids = errors
    parts = tokens(page.html)
    depth = dict.fromkeys(NO_LINK | {"pre", "code"}, 0)
    used, pre_text, section = [], [], ""

    def code_link(m: re.Match) -> str:
        code = m.group(1)
        if code not in error_ids:
            return code
        return (
            f'<a class="sm-code" href="{_href(page.url, errors_url, error_ids[code])}">{code}</a>'
        )

    for i, token in enumerate(parts):
        tag = tag_of(token)
        if tag:
            name, closing = tag
            if name in depth and not token.endswith("/>"):
                depth[name] = max(0, depth[name] + (-1 if closing else 1))
            if name in ("h1", "h2", "h3", "h4") and not closing:
                section = _heading_id(token) or section
            if name == "pre" and closing and not depth["pre"] and not page.is_api:
                code = html.unescape("".join(pre_text))
                used += [(*hit, section) for hit in _code_uses(code, names)]
                pre_text = []
            continue
        if token.startswith("<") or not token.strip():
            continue
        blocked = any(depth[t] for t in NO_LINK)
        if depth["pre"]:
            pre_text.append(token)
        elif depth["code"] == 1 and not blocked and parts[i - 1] == "<code>":
            closes = i + 1 < len(parts) and parts[i + 1] == "</code>"
            hit = names.resolve(token) if closes else None
            if hit and hit[0] in urls:
                href = _href(page.url, urls[hit[0]], hit[1])
                parts[i - 1] = f'<a class="sm-xref" href="{href}" title="{hit[2]}"><code>'
                parts[i + 1] = "</code></a>"
                used.append((hit[0], hit[1], section))
                continue
        if not blocked and errors_url is not None:
            parts[i] = ERROR_CODE.sub(code_link, token)
    page.html = "".join(parts)
    return [] if page.is_api else used


# --------------------------------------------------------------------------- API pages


def _entry_span(page_html: str, anchor: str) -> tuple[int, int] | None:
    """Where `anchor`'s entry text lies: from after its heading to the start of its members (a
    class's `doc-children`) or the end of its `doc-contents`."""
    head = re.search(rf'<h[1-6] id="{re.escape(anchor)}"[^>]*>.*?</h[1-6]>', page_html, re.S)
    if not head:
        return None
    start = page_html.find('<div class="doc doc-contents', head.end())
    if start < 0:
        return None
    depth = 0
    for m in re.finditer(r"<div\b[^>]*>|</div\s*>", page_html[start:]):
        if m.group(0).startswith("</"):
            depth -= 1
            if depth == 0:
                return head.end(), start + m.start()
        else:
            if depth == 1 and "doc-children" in m.group(0):
                return head.end(), start + m.start()
            depth += 1
    return None


# An entry's first paragraph of text: not the "Bases:" line of a class, not its "Used in" line.
FIRST_PARAGRAPH = re.compile(
    r'<p(?! class="doc doc-class-bases")(?! class="sm-used-in")(?:\s[^>]*)?>(.*?)</p>', re.S
)
SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)[.!?](?=\s|$)")


def entry_summary(page_html: str, anchor: str) -> str:
    """The first sentence of `anchor`'s entry (its inline code kept as HTML); "" if it has none."""
    span = _entry_span(page_html, anchor)
    if not span:
        return ""
    m = FIRST_PARAGRAPH.search(page_html, *span)
    if not m:
        return ""
    text = re.sub(r"</?(?!code\b|/code\b)[a-zA-Z][^>]*>", "", m.group(1))  # keep only <code>
    text = " ".join(text.split())
    plain, depth = [], 0
    for token in tokens(text):
        if token.startswith("<"):
            depth += -1 if token.startswith("</") else 1
        elif depth == 0 and (end := SENTENCE_END.search(token)):
            plain.append(token[: end.end()])
            break
        plain.append(token)
    return "".join(plain)


USED_IN_ORDER = ["guide", "tutorial", "home", "script", "api"]


def used_in(entries: list[tuple[Page, str]]) -> str:
    """The "Used in" line of an API entry: one link per page, to the section of its first use."""
    links = []
    for page, href in sorted(entries, key=lambda e: USED_IN_ORDER.index(e[0].kind)):
        links.append(f'<a href="{href}">{html.escape(page.short_title)}</a>')
    return (
        '<p class="sm-used-in" data-search-exclude><span class="sm-used-in__title">Used in</span> '
        + ", ".join(links)
        + "</p>\n"
    )


SUMMARY_CELL = re.compile(r'<span class="api-summary" data-anchor="([^"]+)"></span>')


def fill_summaries(page: Page, summaries: dict[str, str]) -> None:
    """Fills `page`'s summary cells (docs_api.summary_cell) with the entries' first sentences."""

    def fill(m: re.Match) -> str:
        return f'<span class="api-summary">{summaries.get(m.group(1), "")}</span>'

    page.html = SUMMARY_CELL.sub(fill, page.html)


def add_used_in(page: Page, uses: dict[str, list]) -> None:
    """Adds each entry's "Used in" line at the end of its text (before a class's members)."""
    inserts = []
    for anchor, pages in uses.items():
        span = _entry_span(page.html, anchor)
        if span:
            inserts.append((span[1], used_in(pages)))
    for pos, text in sorted(inserts, reverse=True):
        page.html = page.html[:pos] + text + page.html[pos:]


def error_anchors(errors_html: str) -> dict[str, str]:
    """Each code on the error index -> the id of its heading (`E0901` -> `e0901-no-such-field`)."""
    found = re.finditer(r'<h2 id="([^"]+)"[^>]*>\s*([EW]\d{4})\b', errors_html)
    return {m.group(2): m.group(1) for m in found}


def link_site(pages: list[Page], errors_src: str = "errors.md") -> None:
    """Cross-links every page (see the module docstring); rewrites each `page.html`."""
    names = Names.build()
    urls = {p.src: p.url for p in pages}
    by_src = {p.src: p for p in pages}
    api = [p for p in pages if p.is_api]
    summaries = {}
    for p in api:  # from the entries as rendered, before any link is added to them
        names.members |= set(re.findall(r'<h[1-6] id="(shapeml\.[\w.]+)"', p.html))
        for anchor in SUMMARY_CELL.findall(p.html):
            home = by_src.get(names.homes.get(anchor, p.src), p)
            summaries[anchor] = entry_summary(home.html, anchor)
    for p in api:
        fill_summaries(p, summaries)
    errors = by_src.get(errors_src)
    codes = (errors.url, error_anchors(errors.html)) if errors else (None, {})
    uses: dict[str, dict[str, list]] = {}  # API page -> anchor -> [(page, href)]
    for p in pages:
        first: dict[tuple[str, str], str] = {}
        for src, anchor, section in link_page(p, names, urls, codes):
            first.setdefault((src, anchor), section)
        for (src, anchor), section in first.items():
            if src in by_src and anchor:
                href = _href(by_src[src].url, p.url, section)
                uses.setdefault(src, {}).setdefault(anchor, []).append((p, href))
    for p in api:
        add_used_in(p, uses.get(p.src, {}))
