"""Checks of the built site's HTML that need no browser (scripts/check_site.py runs them, and
tests/test_site.py): each returns its problems, one line each, an empty list when all is well.

- `unlinked_api_names`: inline code naming an API object (by the rules of `docs_xref.Names`) that
  is not a link, on a page other than the API reference;
- `unlinked_error_codes`: an error or warning code in a page's text that does not link to the
  error index;
- `undocumented_objects`: a public object whose API entry has no text;
- `machine_paths`: a path of the build machine in a page, the search index or the sitemap;
- `sitemap`: an empty sitemap, or one without the site's address.

`static_problems` runs them all.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import docs_api
import docs_paths
import docs_xref

# Public objects without a docstring yet (module constants: an attribute docstring in their module
# documents them); `undocumented_objects` reports a listed one that gained text, so this shrinks.
UNDOCUMENTED: set[str] = set()
ROOT = Path(__file__).resolve().parent.parent
BODY = re.compile(r'<article class="md-content__inner[^"]*">(.*)</article>', re.S)
HEADINGS = {"h1", "h2", "h3", "h4", "h5", "h6"}


def pages(site: Path) -> dict[str, str]:
    """Each built page (its path under `site`) -> the HTML of its article (the page's content)."""
    found = {}
    for path in sorted(site.rglob("*.html")):
        m = BODY.search(path.read_text(encoding="utf-8"))
        if m:
            found[path.relative_to(site).as_posix()] = m.group(1)
    return found


def _is_api(path: str) -> bool:
    return path.startswith("api/")


def _walk(article: str):
    """(token, the tags it is inside) for each text token of `article`."""
    open_tags: list[str] = []
    for token in docs_xref.tokens(article):
        tag = docs_xref.tag_of(token)
        if tag:
            name, closing = tag
            if closing:
                if name in open_tags:
                    del open_tags[len(open_tags) - 1 - open_tags[::-1].index(name)]
            elif not token.endswith("/>") and name not in ("br", "img", "hr", "input", "meta"):
                open_tags.append(name)
        elif not token.startswith("<"):
            yield token, open_tags


def unlinked_api_names(site: Path, names: docs_xref.Names | None = None) -> list[str]:
    """Inline code naming an API object that is not a link (outside the API reference)."""
    names = names or docs_xref.Names.build()
    built = pages(site)
    for path, article in built.items():
        if _is_api(path):
            names.members |= set(re.findall(r'<h[1-6] id="(shapeml\.[\w.]+)"', article))
    problems = []
    for path, article in built.items():
        if _is_api(path):
            continue
        for token, inside in _walk(article):
            if inside[-1:] != ["code"] or {"pre", "a"} & set(inside) or HEADINGS & set(inside):
                continue
            if names.resolve(token):
                problems.append(f"{path}: `{html.unescape(token)}` names an API object, no link")
    return problems


def unlinked_error_codes(site: Path, codes: set[str] | None = None) -> list[str]:
    """Error and warning codes in a page's text that are not links to the error index."""
    if codes is None:
        from shapeml._errors import registry

        codes = set(registry())
    problems = []
    for path, article in pages(site).items():
        for token, inside in _walk(article):
            if "a" in inside or (path.startswith("errors/") and HEADINGS & set(inside)):
                continue
            for code in docs_xref.ERROR_CODE.findall(token):
                if code in codes:
                    problems.append(f"{path}: {code} is not a link to the error index")
    return sorted(set(problems))


def undocumented_objects(site: Path, entries=None) -> list[str]:
    """Public objects whose API entry has no text (a first paragraph)."""
    entries = entries if entries is not None else docs_api.api_entries()
    built = pages(site)
    problems = []
    for name, (src, anchor) in sorted(entries.items()):
        if name != anchor:
            continue  # documented at its home (`sm.Model` is `shapeml.models.Model`)
        page = src.removesuffix(".md").removesuffix("index").rstrip("/")
        article = built.get(f"{page}/index.html" if page else "index.html", "")
        has_text = bool(docs_xref.entry_summary(article, anchor))
        if has_text and name in UNDOCUMENTED:
            problems.append(f"{name} is documented now: remove it from UNDOCUMENTED")
        elif not has_text and name not in UNDOCUMENTED:
            problems.append(f"{name} ({src}) has no documentation: give it a docstring")
    return problems


def machine_paths(site: Path, root: Path = ROOT) -> list[str]:
    """Paths of the build machine in the pages, the search index and the sitemap."""
    problems = []
    files = [*site.rglob("*.html"), *site.glob("search/*.json"), *site.glob("sitemap.xml")]
    for path in sorted(files):
        for found in docs_paths.build_machine_paths(path.read_text(encoding="utf-8"), root):
            problems.append(f"{path.relative_to(site).as_posix()}: a build-machine path: {found}")
    return problems


def sitemap(site: Path) -> list[str]:
    """The sitemap lists every page at the site's address (mkdocs.yml: `site_url`)."""
    path = site / "sitemap.xml"
    if not path.is_file():
        return ["sitemap.xml is missing"]
    urls = re.findall(r"<loc>([^<]+)</loc>", path.read_text(encoding="utf-8"))
    if not urls:
        return ["sitemap.xml lists no page: set `site_url` in mkdocs.yml"]
    return [f"sitemap.xml: {u} is not an absolute URL" for u in urls if "://" not in u]


def site_pages(site: Path) -> list[str]:
    """The path of every page of the built site (`api/optim/`), the home page first."""
    paths = [p.relative_to(site).as_posix() for p in site.rglob("index.html")]
    return sorted(p.removesuffix("index.html") for p in paths)


def static_problems(site: Path) -> list[str]:
    """The problems scripts/py finds in the built HTML, all of them."""
    return [
        *unlinked_api_names(site),
        *unlinked_error_codes(site),
        *undocumented_objects(site),
        *machine_paths(site),
        *sitemap(site),
    ]
