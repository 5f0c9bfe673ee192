"""Checks the built site for what the strict build does not: a script, since no plugin opens the
pages in a browser.

    python scripts/check_site.py [SITE_DIR] [--error-cells]

Fails (exit status 1, one line per problem) on: a path of the build machine in a page or the
search index; with `--error-cells` (the tutorials executed), an error cell of a tutorial longer
than `ERROR_CELL_LINES` lines; in headless Chromium (Playwright; `CHROMIUM` names the binary) at
1280 px, with the site served on a local port: a blank page, a console error, an uncaught
exception, a resource or image that failed to load, missing plots, a search that finds nothing or
ranks the wrong page first, and on every page a code block or table wider than its column. Exit
status 2 without Chromium or without a built site.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import html
import http.server
import os
import re
import shutil
import sys
import threading
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
ERROR_CELL_LINES = 8


class Page(NamedTuple):
    """A page to open: its name, path under the site, a text it shows, how many plots (PNG images)
    at least, a query for the search box and the pages one of which must be its first result."""

    name: str
    path: str
    must_show: str
    min_plots: int = 0
    search: str = ""
    search_first: tuple[str, ...] = ()


PAGES = [
    Page(
        "home", "", "shapeml user guide", 0, "weight decay", ("gradients_and_optim/", "api/optim/")
    ),
    Page("tutorial", "tutorials/02_gradients_and_optimizers/", "Gradients and optimizers", 3),
    Page("api", "api/optim/", "adamw"),
    Page("guide", "gradients_and_optim/", "weight decay"),
    Page("errors", "errors/", "E0901"),
]
# Every code block and table wider than its column, or scrolling sideways, as laid out.
WIDTHS = """() => {
  const column = document.querySelector('.md-content__inner');
  if (!column) return [];
  const right = column.getBoundingClientRect().right + 1, wide = [];
  const blocks = 'pre, pre > code, table, .md-typeset__scrollwrap, .jp-OutputArea-output';
  for (const el of column.querySelectorAll(blocks)) {
    const box = el.getBoundingClientRect();
    if (!box.width) continue;  // not shown
    const scrolls = el.scrollWidth > el.clientWidth + 1 &&
      ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
    // the theme's table wrapper reaches into the margins on purpose: only its scrolling counts
    const past = box.right > right && !el.classList.contains('md-typeset__scrollwrap');
    if (scrolls || past) wide.push(`a ${el.tagName.toLowerCase()} ${Math.round(Math.max(
      el.scrollWidth, box.width))} px wide in a ${Math.round(column.clientWidth)} px column: ` +
      JSON.stringify(el.innerText.trim().slice(0, 60)));
  }
  return wide;
}"""
IMAGES = "() => Array.from(document.images, i => [i.currentSrc, i.complete && i.naturalWidth > 0])"
SEARCH_BOX = "input.md-search__input"
RESULTS = ".md-search-result__item > a.md-search-result__link"


def find_chromium() -> str | None:
    """The Chromium binary: `$CHROMIUM`, or the first known name on the PATH."""
    names = [os.environ["CHROMIUM"]] if os.environ.get("CHROMIUM") else []
    names += ["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"]
    return next(filter(None, map(shutil.which, names)), None)


def machine_paths(text: str) -> list[str]:
    """Paths of the build machine, or of any home, temporary or build folder, in `text`."""
    folders = rf"{re.escape(str(ROOT))}|/(?:home|root|Users|work|tmp|var/tmp|private)/"
    found = re.findall(rf"(?<![\w.~])(?:{folders})[\w.-]*|[\w.~/-]*/(?:site|dist)-packages", text)
    return sorted(set(found))


def site_problems(site: Path) -> list[str]:
    """Build-machine paths in the pages, the search index and the sitemap."""
    files = [*site.rglob("*.html"), *site.glob("search/*.json"), site / "sitemap.xml"]
    return [
        f"{path.relative_to(site).as_posix()}: a build-machine path: {found}"
        for path in sorted(files)
        for found in machine_paths(path.read_text(encoding="utf-8"))
    ]


STDERR = re.compile(
    r'data-mime-type="application/vnd\.jupyter\.stderr"[^>]*>\s*<pre>(.*?)</pre>', re.S
)
PROMPT = re.compile(r'jp-InputPrompt jp-InputArea-prompt">In(?:\s|&nbsp;)*\[([\d ]*)\]:')


def tutorial_error_cells(site: Path, max_lines: int = ERROR_CELL_LINES) -> list[str]:
    """Each executed tutorial's error cells (tagged `raises-exception`) show at most `max_lines`
    lines on stderr and no path of the build machine."""
    problems = []
    for page in sorted((site / "tutorials").glob("*/index.html")):
        for cell in page.read_text(encoding="utf-8").split('<div class="jp-Cell ')[1:]:
            prompt = PROMPT.search(cell)
            if not prompt or "celltag_raises-exception" not in cell.split(">", 1)[0]:
                continue
            where = f"{page.parent.name}, cell In [{prompt[1].strip()}]"
            for out in STDERR.findall(cell):
                lines = html.unescape(re.sub(r"<[^>]+>", "", out)).strip("\n").splitlines()
                if len(lines) > max_lines:
                    first = next((x for x in lines if x.strip(" -")), "")[:60]
                    problems.append(f"{where}: {len(lines)} lines of error output: {first!r}")
                problems += [f"{where}: a build-machine path: {p}" for p in machine_paths(out)]
    return problems


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
    if page.search:
        tab.fill(SEARCH_BOX, page.search)
        tab.press(SEARCH_BOX, "End")  # the theme searches on a key, not on an input event
        with contextlib.suppress(Exception):  # Playwright's TimeoutError: nothing found
            tab.wait_for_selector(RESULTS, timeout=10_000)
        found = tab.eval_on_selector_all(RESULTS, "links => links.map(a => a.pathname)")
        if not found or not found[0].lstrip("/").startswith(page.search_first):
            first = found[0] if found else "nothing"
            problems.append(f"searching for {page.search!r} finds {first} first")
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
    paths = sorted(f"{p.parent.relative_to(site).as_posix()}/" for p in site.rglob("index.html"))
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=binary, args=["--no-sandbox"])
            found = {page.name: check_page(browser, base, page) for page in pages}
            found["widths"] = check_widths(browser, base, [p.removeprefix("./") for p in paths])
            browser.close()
            return found
    finally:
        server.shutdown()
        server.server_close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site", nargs="?", default=str(ROOT / "build" / "site"))
    parser.add_argument("--error-cells", action="store_true", help="check the tutorials' errors")
    args = parser.parse_args(argv)
    site = Path(args.site)
    if not (site / "index.html").is_file():
        print(f"site check skipped: {site}/index.html is missing: build it", file=sys.stderr)
        return 2
    found = {"html": site_problems(site) + (tutorial_error_cells(site) if args.error_cells else [])}
    try:
        found |= check_site(site)
    except FileNotFoundError as e:  # no Chromium: say so, it is not a failure of the site
        print(f"site check skipped: {e}", file=sys.stderr)
        return 2
    for name, problems in found.items():
        print(
            f"{name:>8}: {'FAILED' if problems else 'ok'}", *(f"\n          {p}" for p in problems)
        )
    return 1 if any(found.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
