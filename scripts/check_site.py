"""Checks the built site in headless Chromium, which no plugin does (Playwright drives the system's
Chromium; `CHROMIUM` names the binary): `python scripts/check_site.py [SITE_DIR]`.

Serves SITE_DIR (default build/site) on a local port; fails (exit status 1) on a blank page, a
console error, an uncaught exception, a resource that failed to load, missing plots, a search that
ranks the wrong page first (a query of the guide, and each public class's name, which must find
its API entry first), a search results panel past the window's edge, and on any page at 1280 px:
a code block that wraps its lines, a table or block wider than its column, a private
`shapeml._...` name; on a guide page an issue number or the word "budget" (the contributor page
holds those); a home page without a code block. Exit status 2 without Chromium or a built site.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import re
import shutil
import sys
import threading
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent


class Page(NamedTuple):
    """A page to open: its name, path under the site, a text it shows, how many plots at least;
    for the home page, names to search for and the API entry each must find first."""

    name: str
    path: str
    must_show: str
    min_plots: int = 0
    searches: dict[str, str] | None = None


PAGES = [
    Page("home", "", "Models whose every tensor has a declared, checked shape"),
    Page("tutorial", "tutorials/02_gradients_and_optimizers/", "Gradients and optimizers", 3),
    Page("api", "api/optim/", "adamw"),
    Page("guide", "gradients_and_optim/", "weight decay"),
    Page("errors", "errors/", "E0901"),
]
# A query typed into the home page's search box, and the pages one of which it must find first.
# (A query whose word begins a class's name finds that class first, by its tag: "weight decay"
# finds `WeightWriteError`. scripts/docs_hooks.py's `on_post_build` says why.)
SEARCH = ("decay mask", ("gradients_and_optim/", "api/optim/"))
# Every block wider than its column, and every table scrolling sideways, as laid out.
WIDTHS = """() => {
  const column = document.querySelector('.md-content__inner'), wide = [];
  const blocks = 'pre, pre > code, table, .md-typeset__scrollwrap, .jp-OutputArea-output';
  for (const el of column ? column.querySelectorAll(blocks) : []) {
    const box = el.getBoundingClientRect();
    // a code block scrolls sideways by design; a table or its wrapper should fit
    const scrolls = !el.matches('pre, pre > code, .jp-OutputArea-output') &&
      el.scrollWidth > el.clientWidth + 1 &&
      ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
    // the theme's table wrapper reaches into the margins on purpose: only its scrolling counts
    const past = box.right > column.getBoundingClientRect().right + 1 &&
      !el.classList.contains('md-typeset__scrollwrap');
    if (box.width && (scrolls || past)) wide.push(`a ${el.tagName.toLowerCase()} ${Math.round(
      Math.max(el.scrollWidth, box.width))} px wide in a ${Math.round(column.clientWidth)} px ` +
      `column: ${JSON.stringify(el.innerText.trim().slice(0, 60))}`);
  }
  return wide;
}"""
# Every code block whose lines wrap (laid out taller than with `white-space: pre`).
WRAPS = """() => {
  const column = document.querySelector('.md-content__inner'), wrapped = [];
  const blocks = 'pre > code, .jp-InputArea pre, .highlight pre';
  for (const el of column ? column.querySelectorAll(blocks) : []) {
    const before = el.getBoundingClientRect().height, style = el.style.whiteSpace;
    el.style.whiteSpace = 'pre';
    const after = el.getBoundingClientRect().height;
    el.style.whiteSpace = style;
    if (before > after + 1) wrapped.push(`a code block wraps its lines (${Math.round(before)} ` +
      `px tall, ${Math.round(after)} px unwrapped): ${JSON.stringify(el.innerText.trim().slice(0, 60))}`);
  }
  return wrapped;
}"""
# What a reader can see of a page: its text and the titles shown on hover.
SEEN = """() => [document.body.innerText,
  ...Array.from(document.querySelectorAll('[title]'), e => e.getAttribute('title'))].join('\\n')"""
PRIVATE = re.compile(r"\bshapeml(?:\.\w+)*\._[a-z]\w*")
# Developer material kept off the guide pages: issue numbers and budgets.
DEVELOPER = re.compile(r"\b[Ii]ssues? #?\d+|\(#\d+\)|\b[Bb]udgets?\b")
CODE_BLOCKS = "() => document.querySelectorAll('.md-content__inner pre > code').length"
IMAGES = "() => Array.from(document.images, i => [i.currentSrc, i.complete && i.naturalWidth > 0])"
SEARCH_BOX = "input.md-search__input"
RESULTS = ".md-search-result__item > a.md-search-result__link"
PANEL = ".md-search__output"
# Every link of the results' first group (the best page and its matching sections).
FIRST_GROUP = """() => Array.from(document.querySelectorAll(
  '.md-search-result__list > .md-search-result__item:first-child a.md-search-result__link'),
  a => a.pathname.replace(/^\\//, '') + a.hash)"""


def find_chromium() -> str | None:  # `$CHROMIUM`, else the first known name on the PATH
    names = [os.environ["CHROMIUM"]] if os.environ.get("CHROMIUM") else []
    names += ["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"]
    return next(filter(None, map(shutil.which, names)), None)


def check_page(browser, base: str, page: Page) -> list[str]:
    """Opens `page` in a new tab; returns its problems."""
    tab, problems = browser.new_page(viewport={"width": 1280, "height": 900}), []
    tab.on("pageerror", lambda e: problems.append(f"uncaught exception: {e}"))
    tab.on("requestfailed", lambda r: problems.append(f"failed to load: {r.url[:120]}"))
    tab.on("console", lambda m: m.type == "error" and problems.append(f"console.error: {m.text}"))
    tab.goto(base + page.path, wait_until="load")
    tab.wait_for_timeout(1000)  # the theme's scripts (search index, palette) run and report
    text = tab.inner_text("body").strip()
    if len(text) < 200:
        problems.append(f"the page is blank ({len(text)} characters of text)")
    if page.must_show.lower() not in text.lower():
        problems.append(f"the page does not show {page.must_show!r}")
    images = tab.evaluate(IMAGES)
    problems += [f"image did not load: {src[:80]}" for src, ok in images if not ok]
    plots = sum(ok and src.startswith("data:image/png") for src, ok in images)
    if plots < page.min_plots:
        problems.append(f"{plots} plots, expected {page.min_plots} (a quick build?)")
    if page.path == "" and tab.query_selector(SEARCH_BOX):
        query, first = SEARCH
        found = search(tab, query)
        if not found or not found[0].startswith(first):
            problems.append(f"searching for {query!r} finds {found[:1] or 'nothing'} first")
        panel = tab.query_selector(PANEL)
        box = panel.bounding_box() if panel else None
        if box and box["x"] + box["width"] > tab.viewport_size["width"] + 1:
            problems.append(f"the search results panel ends at x={box['x'] + box['width']:.0f}")
        for name, entry in (page.searches or {}).items():
            found = search(tab, name)
            page_of = entry.split("#", 1)[0]
            if not found or not found[0].startswith(page_of) or entry not in found:
                problems.append(f"searching for {name!r} finds {found[:2] or 'nothing'} first")
    tab.close()
    return problems


def search(tab, query: str) -> list[str]:
    """The links of the best group of results for `query` typed into the search box."""
    tab.fill(SEARCH_BOX, "")
    tab.press(SEARCH_BOX, "End")
    with contextlib.suppress(Exception):  # Playwright's TimeoutError: the results were empty
        tab.wait_for_selector(RESULTS, state="detached", timeout=5_000)
    tab.fill(SEARCH_BOX, query)
    tab.press(SEARCH_BOX, "End")  # the theme searches on a key, not on an input event
    with contextlib.suppress(Exception):  # Playwright's TimeoutError: nothing found
        tab.wait_for_selector(RESULTS, timeout=10_000)
    return tab.evaluate(FIRST_GROUP)


def check_layout(browser, base: str, paths: list[str], guide: set[str]) -> list[str]:
    """Each page at 1280 px: a code block that wraps, a block wider than its column, a private
    name; on a `guide` page (a path) developer material; the home page needs a code block."""
    tab = browser.new_page(viewport={"width": 1280, "height": 900}, java_script_enabled=False)
    problems = []
    for path in paths:  # layout needs no script: pages load fast without them
        tab.goto(base + path, wait_until="load")
        found = [*tab.evaluate(WIDTHS), *tab.evaluate(WRAPS)]
        seen = tab.evaluate(SEEN)
        found += [f"a private name: {n}" for n in sorted(set(PRIVATE.findall(seen)))]
        if path in guide:
            found += [f"developer material: {n!r}" for n in sorted(set(DEVELOPER.findall(seen)))]
        if path == "" and not tab.evaluate(CODE_BLOCKS):
            found.append("the home page shows no code block")
        problems += [f"{path or '/'}: {problem}" for problem in found]
    return problems


def guide_paths(site: Path) -> set[str]:
    """The site paths of the home page and mkdocs.yml's Guide and Examples sections."""
    import yaml

    class Loader(yaml.SafeLoader):  # mkdocs.yml's `!ENV` tags
        pass

    Loader.add_constructor("!ENV", lambda loader, node: None)
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)
    nav = {title: pages for item in config["nav"] for title, pages in item.items()}
    pages = [p for section in ("Guide", "Examples") for p in nav.get(section, [])]
    return {""} | {f"{p.removesuffix('.md')}/" for p in pages}


def class_searches() -> dict[str, str]:
    """Each public class's name -> its API entry's path in the site (`api/training/#...`)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import docs_gen

    found = {}
    for package in docs_gen.public_packages():
        for name, obj in docs_gen.exported(package).items():
            if isinstance(obj, type):
                home = docs_gen.home(package, name, obj)
                src = docs_gen.api_src(home.rsplit(".", 1)[0])
                page = src.removesuffix(".md").removesuffix("index").rstrip("/")
                found.setdefault(name, set()).add(f"{page}/#{home}".removeprefix("/"))
    # a name two classes share (none today) finds both: neither can be first for sure
    return {name: entries.pop() for name, entries in found.items() if len(entries) == 1}


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # the check reports failures itself
        pass


def check_site(
    site: Path, pages: list[Page] | None = None, guide: set[str] | None = None
) -> dict[str, list[str]]:
    """Serves `site` on a free local port and opens `pages` (default: `PAGES`, the home page
    searching for every public class) in headless Chromium, then the layout of every page
    ("widths"; `guide`: the guide's paths, default mkdocs.yml's): each page's problems by name."""
    if pages is None:
        searches = class_searches()
        pages = [p._replace(searches=searches) if p.name == "home" else p for p in PAGES]
    guide = guide_paths(site) if guide is None else guide
    from playwright.sync_api import sync_playwright

    binary = find_chromium()
    if binary is None:
        raise FileNotFoundError("no Chromium found: install it (apt-get install chromium)")
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    paths = sorted(
        f"{p.parent.relative_to(site)}/".removeprefix("./") for p in site.rglob("index.html")
    )
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=binary, args=["--no-sandbox"])
            found = {page.name: check_page(browser, base, page) for page in pages}
            found["widths"] = check_layout(browser, base, paths, guide)
            browser.close()
            return found
    finally:
        server.shutdown()
        server.server_close()


def main(site: Path) -> int:
    if not (site / "index.html").is_file():
        print(f"site check skipped: {site}/index.html is missing: build it", file=sys.stderr)
        return 2
    try:
        found = check_site(site)
    except FileNotFoundError as e:  # no Chromium: say so, it is not a failure of the site
        print(f"site check skipped: {e}", file=sys.stderr)
        return 2
    for name, problems in found.items():
        print(f"{name:>8}: {'FAILED' if problems else 'ok'}", *[f"\n    {p}" for p in problems])
    return 1 if any(found.values()) else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if sys.argv[1:] else ROOT / "build" / "site")))
