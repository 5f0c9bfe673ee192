"""Checks the built site: its HTML, then its pages in headless Chromium.

    python scripts/check_site.py [SITE_DIR] [--shots DIR] [--error-cells]

Checks SITE_DIR (default `build/site`, built by `mkdocs build`) and fails (exit status 1, one line
per problem) on:

- in the HTML (scripts/site_checks.py): inline code naming an API object that is not a link, an
  error code that does not link to the error index, a public object without documentation, a
  path of the build machine in a page or the search index, an empty sitemap;
- in Chromium at 1280 px, with the site served on a local port: a page that is blank, logs a
  console error or an uncaught exception, fails to load a resource or shows an image that did not
  load; a search that finds nothing, or whose first result is not the page it should be; on
  every page, a code block or table wider than its column;
- with `--error-cells` (a site whose tutorials were executed): a tutorial's error cell longer
  than `ERROR_CELL_LINES` lines or showing a path of the build machine
  (`tutorial_error_cells`).

Exit status 2 (and a message) when no Chromium or no built site is found. `--shots DIR` saves a
PNG screenshot of each checked page there. Chromium is driven by scripts/chromium.py (the
standard library and a Chromium binary; `CHROMIUM` names the binary).
"""

from __future__ import annotations

import argparse
import base64
import functools
import html
import http.server
import json
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import docs_paths
import site_checks
from chromium import Browser, find_chromium, problems_from_events

__all__ = ["Browser", "Page", "check_site", "find_chromium", "tutorial_error_cells"]

ROOT = Path(__file__).resolve().parent.parent


class Page(NamedTuple):
    """A page to check: its name (and screenshot's), its path under the site, a text it must show,
    how many plots (loaded PNG images) it must show at least, a search to run on it, and the pages
    (paths under the site) one of which must be the search's first result."""

    name: str
    path: str
    must_show: str
    min_plots: int = 0
    search: str = ""  # a query typed into the site's search box: it must find pages
    search_first: tuple[str, ...] = ()


PAGES = [
    Page(
        "home",
        "",
        "shapeml user guide",
        search="weight decay",
        search_first=("gradients_and_optim/", "api/optim/"),
    ),  # fmt: skip
    Page("tutorial", "tutorials/02_gradients_and_optimizers/", "Gradients and optimizers", 3),
    Page("api", "api/optim/", "adamw"),
    Page("guide", "gradients_and_optim/", "weight decay"),
    Page("errors", "errors/", "E0901"),
]
# Types a query into the theme's search box (the search runs in a web worker on the site's index).
SEARCH = """(() => {
  const box = document.querySelector('input.md-search__input');
  if (!box) return false;
  box.focus(); box.value = QUERY;
  box.dispatchEvent(new Event('input', {bubbles: true}));
  return true;
})()"""
RESULTS = """JSON.stringify(Array.from(
  document.querySelectorAll('.md-search-result__item > a.md-search-result__link'), a => a.href))"""
# Every code block and table wider than its column, or scrolling sideways, on the page as shown.
WIDTHS = """(() => {
  const column = document.querySelector('.md-content__inner');
  if (!column) return '[]';
  const right = column.getBoundingClientRect().right + 1;
  const wide = [];
  const blocks = 'pre, pre > code, table, .md-typeset__scrollwrap, .jp-OutputArea-output';
  for (const el of column.querySelectorAll(blocks)) {
    const box = el.getBoundingClientRect();
    if (!box.width) continue;  // not shown
    const scrolls = el.scrollWidth > el.clientWidth + 1 &&
      ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
    // the theme's table wrapper reaches into the margins on purpose: only its scrolling counts
    const past = box.right > right && !el.classList.contains('md-typeset__scrollwrap');
    if (scrolls || past) wide.push({
      tag: el.tagName.toLowerCase(), width: Math.round(Math.max(el.scrollWidth, box.width)),
      column: Math.round(column.clientWidth), text: el.innerText.trim().slice(0, 60)});
  }
  return JSON.stringify(wide);
})()"""
# What the page reports once loaded: its text, and each image with whether it loaded.
PROBE = """(() => {
  const imgs = Array.from(document.images).map(i => ({
    src: i.currentSrc.slice(0, 80), ok: i.complete && i.naturalWidth > 0,
    w: i.naturalWidth, h: i.naturalHeight,
    top: i.getBoundingClientRect().top + window.scrollY}));
  return JSON.stringify({title: document.title, text: document.body.innerText, imgs: imgs});
})()"""


@dataclass
class PageResult:
    name: str
    url: str
    title: str = ""
    text_chars: int = 0
    images: list[dict] = field(default_factory=list)
    search_results: int | None = None
    problems: list[str] = field(default_factory=list)


def check_page(browser: Browser, page: Page, url: str, shots: Path | None) -> PageResult:
    """Loads `page` from `url` in a new tab; returns what it found (no `problems`: it is fine)."""
    name, must_show = page.name, page.must_show
    result = PageResult(name, url)
    target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
        "sessionId"
    ]
    for domain in ("Page", "Runtime", "Log", "Network"):
        browser.send(f"{domain}.enable", session=session)
    browser.send("Page.navigate", {"url": url}, session=session)
    browser.wait_for("Page.loadEventFired", session)
    time.sleep(1.0)  # let the theme's scripts (search index, palette) run and report errors
    probe = browser.send(
        "Runtime.evaluate", {"expression": PROBE, "returnByValue": True}, session=session
    )
    state = json.loads(probe["result"]["value"])
    result.title, result.images = state["title"], state["imgs"]
    result.text_chars = len(state["text"].strip())
    if result.text_chars < 200:
        result.problems.append(f"the page is blank ({result.text_chars} characters of text)")
    if must_show.lower() not in state["text"].lower():
        result.problems.append(f"the page does not show {must_show!r}")
    for img in result.images:
        if not img["ok"]:
            result.problems.append(f"image did not load: {img['src']}")
    plots = [i for i in result.images if i["ok"] and i["src"].startswith("data:image/png")]
    if len(plots) < page.min_plots:
        result.problems.append(
            f"expected at least {page.min_plots} plots, found {len(plots)} "
            "(was the site built without executing the notebooks? SHAPEML_DOCS_EXECUTE=0)"
        )
    if shots is not None:
        _screenshots(browser, session, name, plots, shots)
    if page.search:  # after the screenshots: the results cover the page
        found = _search(browser, session, page.search)
        result.search_results = len(found)
        if not found:
            result.problems.append(f"searching the site for {page.search!r} found nothing")
        elif page.search_first:
            first = found[0].split("://", 1)[-1].split("/", 1)[-1]
            if not first.startswith(page.search_first):
                result.problems.append(
                    f"searching for {page.search!r}: the first result is {first}, not one of "
                    f"{list(page.search_first)}"
                )
    result.problems += problems_from_events(browser.events, session)
    browser.send("Target.closeTarget", {"targetId": target})
    return result


def _screenshots(browser: Browser, session: str, name: str, plots: list[dict], shots: Path):
    """Saves the top of the page (a tutorial is much longer) and the page around its largest plot."""
    height = browser.send("Page.getLayoutMetrics", session=session)["cssContentSize"]["height"]
    clips = {name: (0, min(height, 2400))}
    if plots:
        biggest = max(plots, key=lambda i: i["w"] * i["h"])
        top = max(0, biggest["top"] - 300)
        clips[f"{name}-plot"] = (top, min(height - top, 1200))
    for shot_name, (y, h) in clips.items():
        clip = {"x": 0, "y": y, "width": 1280, "height": h, "scale": 1}
        shot = browser.send(
            "Page.captureScreenshot",
            {"format": "png", "captureBeyondViewport": True, "clip": clip},
            session=session,
        )
        (shots / f"{shot_name}.png").write_bytes(base64.b64decode(shot["data"]))


def _search(browser: Browser, session: str, query: str, timeout: float = 10.0) -> list[str]:
    """The links of the results the site's search box lists for `query`, best first."""
    typed = browser.send(
        "Runtime.evaluate",
        {"expression": SEARCH.replace("QUERY", json.dumps(query)), "returnByValue": True},
        session=session,
    )
    if not typed["result"]["value"]:
        return []
    deadline = time.monotonic() + timeout
    while True:
        found = json.loads(
            browser.send(
                "Runtime.evaluate", {"expression": RESULTS, "returnByValue": True}, session=session
            )["result"]["value"]
        )
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.25)


def check_widths(browser: Browser, base: str, paths: list[str], tabs: int = 4) -> list[str]:
    """Loads each page at 1280 px, `tabs` at a time; a code block or table wider than its column,
    or scrolling sideways, is a problem."""
    sessions = []
    for _ in range(tabs):
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})
        sessions.append((target, session["sessionId"]))
        browser.send("Page.enable", session=session["sessionId"])
        # Layout needs no script: without them a page loads fast (no search index, no widgets).
        browser.send(
            "Emulation.setScriptExecutionDisabled", {"value": True}, session=session["sessionId"]
        )
    problems = []
    for start in range(0, len(paths), tabs):
        batch = list(zip(paths[start : start + tabs], sessions))
        since = len(browser.events)
        for path, (_, session) in batch:
            browser.send("Page.navigate", {"url": base + path}, session=session)
        for path, (_, session) in batch:
            browser.wait_for("Page.loadEventFired", session, since=since)
            probe = browser.send(
                "Runtime.evaluate", {"expression": WIDTHS, "returnByValue": True}, session=session
            )
            for w in json.loads(probe["result"]["value"]):
                problems.append(
                    f"{path or '/'}: a {w['tag']} {w['width']} px wide in a {w['column']} px "
                    f"column: {w['text']!r}"
                )
    for target, _ in sessions:
        browser.send("Target.closeTarget", {"targetId": target})
    return problems


# IPython's own display of an error: its heading, each frame (all the notebook's cells: shapeml's
# are gone at its API boundary) with a few lines around it, the coded message. The longest
# tutorial cell (07's E1803, three cells deep) shows 18.
ERROR_CELL_LINES = 20
STDERR = re.compile(
    r'<div class="jp-RenderedText jp-OutputArea-output" data-mime-type="application/vnd\.'
    r'jupyter\.stderr"[^>]*>\s*<pre>(.*?)</pre>',
    re.S,
)


PROMPT = re.compile(
    r'<div class="jp-InputPrompt jp-InputArea-prompt">In(?:\s|&nbsp;)*\[([\d ]*)\]:'
)


def tutorial_error_cells(site: Path, max_lines: int = ERROR_CELL_LINES) -> list[str]:
    """Each executed tutorial's error cells (tagged `raises-exception`): what they show on stderr
    is at most `max_lines` lines and names no path of the build machine.

    tests/test_site.py runs it on the test build (one tutorial executed), tests/test_tutorials.py
    on every tutorial's run; `--error-cells` runs it on a site built with the tutorials executed.
    """
    problems = []
    for page in sorted((site / "tutorials").glob("*/index.html")):
        name = page.parent.name
        for cell in page.read_text(encoding="utf-8").split('<div class="jp-Cell '):
            prompt = PROMPT.search(cell)
            if not prompt or "celltag_raises-exception" not in cell.split(">", 1)[0]:
                continue
            for out in STDERR.findall(cell):
                text = html.unescape(re.sub(r"<[^>]+>", "", out)).strip("\n")
                lines = text.splitlines()
                where = f"{name}, cell In [{prompt.group(1).strip()}]"
                if len(lines) > max_lines:
                    first = next((x for x in lines if x.strip(" -")), "")[:60]
                    problems.append(f"{where}: {len(lines)} lines of error output: {first!r}")
                for path in docs_paths.build_machine_paths(text, site_checks.ROOT):
                    problems.append(f"{where}: a build-machine path: {path}")
    return problems


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # the check reports failures itself
        pass


def check_site(
    site: Path, shots: Path | None = None, pages=PAGES, widths: bool = True
) -> list[PageResult]:
    """Serves `site` on a free local port and checks `pages` in headless Chromium, then (with
    `widths`) the widths of the code blocks and tables of every page (a result named "widths")."""
    binary = find_chromium()
    if binary is None:
        raise FileNotFoundError("no Chromium found: install it (apt-get install chromium)")
    if not (site / "index.html").is_file():
        raise FileNotFoundError(f"{site}/index.html is missing: build the site (mkdocs build)")
    if shots is not None:
        shots.mkdir(parents=True, exist_ok=True)
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    browser = Browser(binary)
    try:
        browser.send("Browser.getVersion", timeout=30)
        results = [check_page(browser, page, base + page.path, shots) for page in pages]
        if widths:
            paths = site_checks.site_pages(site)
            wide = PageResult("widths", f"{base} ({len(paths)} pages)")
            wide.problems = check_widths(browser, base, paths)
            results.append(wide)
        return results
    finally:
        browser.close()
        server.shutdown()
        server.server_close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site", nargs="?", default=str(ROOT / "build" / "site"))
    parser.add_argument("--shots", help="save a screenshot of each page in this folder")
    parser.add_argument(
        "--error-cells", action="store_true", help="check the executed tutorials' error cells"
    )
    args = parser.parse_args(argv)
    site = Path(args.site)
    if not (site / "index.html").is_file():
        print(f"site check skipped: {site}/index.html is missing: build it", file=sys.stderr)
        return 2
    problems = site_checks.static_problems(site)
    if args.error_cells:
        problems += tutorial_error_cells(site)
    print(f"    html: {'ok' if not problems else 'FAILED'}  {site}")
    for p in problems:
        print(f"          {p}")
    try:
        results = check_site(site, Path(args.shots) if args.shots else None)
    except FileNotFoundError as e:  # no Chromium: say so, it is not a failure of the site
        print(f"site check skipped: {e}", file=sys.stderr)
        return 2
    for r in results:
        plots = sum(1 for i in r.images if i["ok"])
        status = "ok" if not r.problems else "FAILED"
        search = "" if r.search_results is None else f"  search results={r.search_results}"
        print(f"{r.name:>8}: {status}  {r.url}  title={r.title!r}  text={r.text_chars} chars  "
              f"images loaded={plots}/{len(r.images)}{search}")  # fmt: skip
        for p in r.problems:
            print(f"          {p}")
    return 1 if problems or any(r.problems for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
