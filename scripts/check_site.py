"""Checks the built site in headless Chromium, which no plugin does (Playwright drives the system's
Chromium; `CHROMIUM` names the binary): `python scripts/check_site.py [SITE_DIR]`.

Serves SITE_DIR (default build/site) on a local port; fails (exit status 1) on a blank page, a
console error, an uncaught exception, a resource that failed to load, missing plots, a search that
ranks the wrong page first, and a code block or table wider than its column at 1280 px on any
page. Exit status 2 without Chromium or a built site.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import shutil
import sys
import threading
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent


class Page(NamedTuple):
    """A page to open: its name, path under the site, a text it shows, how many plots at least."""

    name: str
    path: str
    must_show: str
    min_plots: int = 0


PAGES = [
    Page("home", "", "shapeml user guide"),
    Page("tutorial", "tutorials/02_gradients_and_optimizers/", "Gradients and optimizers", 3),
    Page("api", "api/optim/", "adamw"),
    Page("guide", "gradients_and_optim/", "weight decay"),
    Page("errors", "errors/", "E0901"),
]
# A query typed into the home page's search box, and the pages one of which it must find first.
SEARCH = ("weight decay", ("gradients_and_optim/", "api/optim/"))
# Every code block and table wider than its column, or scrolling sideways, as laid out.
WIDTHS = """() => {
  const column = document.querySelector('.md-content__inner'), wide = [];
  const blocks = 'pre, pre > code, table, .md-typeset__scrollwrap, .jp-OutputArea-output';
  for (const el of column ? column.querySelectorAll(blocks) : []) {
    const box = el.getBoundingClientRect();
    const scrolls = el.scrollWidth > el.clientWidth + 1 &&
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
IMAGES = "() => Array.from(document.images, i => [i.currentSrc, i.complete && i.naturalWidth > 0])"
SEARCH_BOX = "input.md-search__input"
RESULTS = ".md-search-result__item > a.md-search-result__link"


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
        tab.fill(SEARCH_BOX, query)
        tab.press(SEARCH_BOX, "End")  # the theme searches on a key, not on an input event
        with contextlib.suppress(Exception):  # Playwright's TimeoutError: nothing found
            tab.wait_for_selector(RESULTS, timeout=10_000)
        found = tab.eval_on_selector_all(RESULTS, "links => links.map(a => a.pathname)")
        if not found or not found[0].lstrip("/").startswith(first):
            problems.append(f"searching for {query!r} finds {found[:1] or 'nothing'} first")
    tab.close()
    return problems


def check_widths(browser, base: str, paths: list[str]) -> list[str]:
    """Each page at 1280 px: a code block or table wider than its column is a problem."""
    tab = browser.new_page(viewport={"width": 1280, "height": 900}, java_script_enabled=False)
    problems = []
    for path in paths:  # layout needs no script: pages load fast without them
        tab.goto(base + path, wait_until="load")
        problems += [f"{path or '/'}: {wide}" for wide in tab.evaluate(WIDTHS)]
    return problems


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # the check reports failures itself
        pass


def check_site(site: Path, pages: list[Page] = PAGES) -> dict[str, list[str]]:
    """Serves `site` on a free local port and opens `pages` in headless Chromium, then the widths
    of every page ("widths"): each page's problems by name."""
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
            found["widths"] = check_widths(browser, base, paths)
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
