"""Headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`): nothing
beyond the standard library and a Chromium binary is needed. `CHROMIUM` names the binary, else the
first of chromium, chromium-browser, google-chrome on the PATH (Debian: `apt-get install chromium`).
scripts/check_site.py checks the built site with it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time


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

    def wait_for(self, method: str, session: str, timeout=60.0, since: int | None = None) -> None:
        """Waits for event `method` of `session`: one after `events[since]` (default: a new one)."""
        deadline = time.monotonic() + timeout
        seen = len(self.events) if since is None else since
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


def problems_from_events(events: list[dict], session: str) -> list[str]:
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
