"""Opens the built site in headless Chromium and checks that its pages work.

    python scripts/check_site.py [SITE_DIR] [--shots DIR]

Serves SITE_DIR (default `build/site`, built by `mkdocs build`) on a local port, loads the home
page, a tutorial with a plot and an API page, and fails (exit status 1, one line per problem) if a
page is blank, logs a console error or an uncaught exception, fails to load a resource, or shows an
image that did not load, and checks that the site's search finds pages. Exit status 2 (and a
message) when no Chromium or no built site is found. `--shots DIR` saves a PNG screenshot of each
page there.

Chromium is driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`), so nothing
beyond the standard library and a Chromium binary is needed: `CHROMIUM` names the binary, else the
first of chromium, chromium-browser, google-chrome on the PATH.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent


class Page(NamedTuple):
    """A page to check: its name (and screenshot's), its path under the site, a text it must show,
    how many plots (loaded PNG images) it must show at least, and a search to run on it."""

    name: str
    path: str
    must_show: str
    min_plots: int = 0
    search: str = ""  # a query typed into the site's search box: it must find pages


PAGES = [
    Page("home", "", "shapeml user guide", search="hoist"),
    Page("tutorial", "tutorials/02_gradients_and_optimizers/", "Gradients and optimizers", 3),
    Page("api", "api/optim/", "adamw"),
]
# Types a query into the theme's search box (the search runs in a web worker on the site's index).
SEARCH = """(() => {
  const box = document.querySelector('input.md-search__input');
  if (!box) return false;
  box.focus(); box.value = QUERY;
  box.dispatchEvent(new Event('input', {bubbles: true}));
  return true;
})()"""
RESULTS = "document.querySelectorAll('.md-search-result__item').length"
# What the page reports once loaded: its text, and each image with whether it loaded.
PROBE = """(() => {
  const imgs = Array.from(document.images).map(i => ({
    src: i.currentSrc.slice(0, 80), ok: i.complete && i.naturalWidth > 0,
    w: i.naturalWidth, h: i.naturalHeight,
    top: i.getBoundingClientRect().top + window.scrollY}));
  return JSON.stringify({title: document.title, text: document.body.innerText, imgs: imgs});
})()"""


def find_chromium() -> str | None:
    """The Chromium binary: `$CHROMIUM`, or the first known name on the PATH."""
    if os.environ.get("CHROMIUM"):
        return shutil.which(os.environ["CHROMIUM"])  # None when it names no executable
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if path := shutil.which(name):
            return path
    return None


class Browser:
    """Headless Chromium driven over the DevTools protocol on fds 3 (commands) and 4 (events)."""

    def __init__(self, binary: str):
        self._profile = tempfile.TemporaryDirectory(prefix="shapeml-chromium-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        args = [
            binary, "--headless=new", "--remote-debugging-pipe", "--no-sandbox",
            "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
            "--disable-background-networking", "--disable-extensions", "--hide-scrollbars",
            f"--user-data-dir={self._profile.name}", "--window-size=1280,900", "about:blank",
        ]  # fmt: skip

        def fds():  # the child's fd 3 reads our commands, its fd 4 writes its answers
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_chrome_r, from_chrome_w)]
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        # preexec_fn runs before the child closes the fds it does not keep: keep 3 and 4.
        self._proc = subprocess.Popen(
            args, pass_fds=(3, 4), preexec_fn=fds,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._from_chrome, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe (did it start?)")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method: str, params=None, session: str | None = None, timeout=60.0) -> dict:
        """Sends one command and returns its result; events seen meanwhile go to `events`."""
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            answer = self._read_message(deadline)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self.events.append(answer)

    def wait_for(self, method: str, session: str, timeout=60.0) -> None:
        deadline = time.monotonic() + timeout
        seen = len(self.events)
        while True:
            for event in self.events[seen:]:
                if event.get("method") == method and event.get("sessionId") == session:
                    return
            seen = len(self.events)
            self.events.append(self._read_message(deadline))

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, TimeoutError, OSError):  # it may be gone already
            self.send("Browser.close", timeout=10)
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)
        self._profile.cleanup()


@dataclass
class PageResult:
    name: str
    url: str
    title: str = ""
    text_chars: int = 0
    images: list[dict] = field(default_factory=list)
    search_results: int | None = None
    problems: list[str] = field(default_factory=list)


def _problems_from_events(events: list[dict], session: str) -> list[str]:
    out = []
    mine = [e for e in events if e.get("sessionId") == session]
    urls = {
        e["params"]["requestId"]: e["params"]["request"]["url"][:120]
        for e in mine
        if e.get("method") == "Network.requestWillBeSent"
    }
    for e in mine:
        p = e.get("params", {})
        if e.get("method") == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            out.append(f"uncaught exception: {d.get('exception', {}).get('description', d)}")
        elif e.get("method") == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"])
            out.append(f"console.{p['type']}: {args}")
        elif e.get("method") == "Log.entryAdded" and p["entry"]["level"] == "error":
            entry = p["entry"]
            out.append(f"console error ({entry['source']}): {entry['text']} {entry.get('url', '')}")
        elif e.get("method") == "Network.loadingFailed" and not p.get("canceled"):
            url = urls.get(p["requestId"], p["requestId"])
            out.append(f"resource failed to load: {p.get('errorText')} {url}")
    return out


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
        result.search_results = _search(browser, session, page.search)
        if not result.search_results:
            result.problems.append(f"searching the site for {page.search!r} found nothing")
    result.problems += _problems_from_events(browser.events, session)
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


def _search(browser: Browser, session: str, query: str, timeout: float = 10.0) -> int:
    """How many results the site's search box lists for `query` (0: none, or no search box)."""
    typed = browser.send(
        "Runtime.evaluate",
        {"expression": SEARCH.replace("QUERY", json.dumps(query)), "returnByValue": True},
        session=session,
    )
    if not typed["result"]["value"]:
        return 0
    deadline = time.monotonic() + timeout
    while True:
        found = browser.send(
            "Runtime.evaluate", {"expression": RESULTS, "returnByValue": True}, session=session
        )["result"]["value"]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.25)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # the check reports failures itself
        pass


def check_site(site: Path, shots: Path | None = None, pages=PAGES) -> list[PageResult]:
    """Serves `site` on a free local port and checks `pages` in headless Chromium."""
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
        return [check_page(browser, page, base + page.path, shots) for page in pages]
    finally:
        browser.close()
        server.shutdown()
        server.server_close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site", nargs="?", default=str(ROOT / "build" / "site"))
    parser.add_argument("--shots", help="save a screenshot of each page in this folder")
    args = parser.parse_args(argv)
    try:
        results = check_site(Path(args.site), Path(args.shots) if args.shots else None)
    except FileNotFoundError as e:  # no Chromium, or no built site: say so, it is not a failure
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
    return 1 if any(r.problems for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
