"""The documentation site: `mkdocs build --strict` passes, every page the site promises is there and
every link in it resolves, and the pages work in a real browser (headless Chromium).

Time budget: the build here executes one tutorial (`EXECUTED`, a short one with plots) and renders
the others without outputs (`SHAPEML_DOCS_EXECUTE`, see scripts/mkdocs_hooks.py); under xdist the
workers share that one build. The full build, which executes every notebook, is `mkdocs build
--strict`; `tests/test_tutorials.py` runs and checks the notebooks themselves.
"""

from __future__ import annotations

import fcntl
import html.parser
import importlib
import importlib.util
import os
import posixpath
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import check_site  # noqa: E402
import docs_api  # noqa: E402

# The one tutorial the test build executes: it has plots and runs in seconds.
EXECUTED = "04_hoisting"
SHOTS = os.environ.get("SHAPEML_SITE_SHOTS")  # a folder: the browser test saves screenshots there


def _build(out: Path) -> None:
    env = dict(
        os.environ,
        SHAPEML_DOCS_EXECUTE=EXECUTED,
        SHAPEML_DOCS_CACHE=str(out / "cache"),
        NO_MKDOCS_2_WARNING="1",
    )
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{run.stderr[-6000:]}"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once per test run (xdist workers share it: the first one builds it)."""
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run_id is None:
        out = tmp_path_factory.mktemp("docs")
        _build(out)
        return out / "site"
    out = tmp_path_factory.getbasetemp().parent / f"docs-{run_id}"
    out.mkdir(exist_ok=True)
    with open(out / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "built").exists():
            _build(out)
            (out / "built").touch()
    return out / "site"


def _page(site: Path, src: str) -> Path:
    """The built HTML of site source `src` (`api/optim.md` -> `api/optim/index.html`)."""
    stem = src.rsplit(".", 1)[0]
    return site / ("index.html" if stem == "index" else f"{stem.removesuffix('/index')}/index.html")


def test_every_guide_page_tutorial_and_api_page_is_built(site):
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert _page(site, page.name).is_file(), f"docs/{page.name} was not built"
    for nb in sorted((ROOT / "tutorials").glob("*.ipynb")):
        assert _page(site, f"tutorials/{nb.name}").is_file(), f"{nb.name} was not rendered"
        assert _page(site, f"tutorials/solutions/{nb.stem}.md").is_file()
    for package in docs_api.public_packages():
        assert _page(site, docs_api.api_src(package)).is_file(), f"no API page for {package}"


def test_every_exported_name_is_documented_on_an_api_page(site):
    """Each name in a public `__all__` has an entry (an anchor with its dotted name)."""
    missing = []
    for name, (src, anchor) in docs_api.api_entries().items():
        if f'id="{anchor}"' not in _page(site, src).read_text(encoding="utf-8"):
            missing.append(f"{name}: no #{anchor} on {src}")
    assert not missing, "\n".join(missing)


def test_the_executed_tutorial_has_its_plots_and_the_others_say_they_were_not_run(site):
    text = (site / "tutorials" / EXECUTED / "index.html").read_text(encoding="utf-8")
    assert "data:image/png;base64," in text and "Quick build" not in text
    other = (site / "tutorials" / "01_models" / "index.html").read_text(encoding="utf-8")
    assert "Quick build" in other


def test_the_search_index_covers_guide_api_and_error_codes(site):
    index = (site / "search" / "search_index.json").read_text(encoding="utf-8")
    for needle in ("E0901", "shapeml.optim.adamw", "value_and_grad", "Hoisting"):
        assert needle in index, f"{needle!r} is not in the search index"


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        for key in ("href", "src"):
            if a.get(key) and not (tag == "link" and a.get("rel") == "canonical"):
                self.links.append(a[key])


def test_every_link_and_anchor_inside_the_site_resolves(site):
    """mkdocs checks the Markdown pages' links; this also covers the rendered notebooks'."""
    pages = {}
    for path in site.rglob("*.html"):
        parser = _Links()
        parser.feed(path.read_text(encoding="utf-8"))
        pages[path] = parser
    broken = []
    for path, parser in pages.items():
        for link in parser.links:
            parts = urlsplit(link)
            if parts.scheme or link.startswith(("/", "data:", "mailto:")):
                continue  # another site, inline data, or 404.html's links from the site's root
            target = path if not parts.path else path.parent / unquote(parts.path)
            target = Path(posixpath.normpath(target))
            if target.is_dir():
                target = target / "index.html"
            rel = path.relative_to(site)
            if not target.is_file():
                broken.append(f"{rel}: {link}")
            elif parts.fragment and target in pages and parts.fragment not in pages[target].ids:
                broken.append(f"{rel}: {link} (no such anchor)")
    assert not broken, "broken links:\n" + "\n".join(sorted(set(broken))[:40])


# Starting Chromium forks a process that also runs JAX's threads; an at-fork hook of another
# library complains about it, harmlessly, after the test has finished.
_FORK_NOISE = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@_FORK_NOISE
def test_the_site_works_in_headless_chromium(site):
    if check_site.find_chromium() is None:
        pytest.skip(
            "Chromium is not installed (apt-get install chromium, or set CHROMIUM): the browser "
            "check of the site (scripts/check_site.py) did not run"
        )
    pages = [p for p in check_site.PAGES if p.name != "tutorial"]
    pages.append(check_site.Page("tutorial", f"tutorials/{EXECUTED}/", "sm.hoist", min_plots=1))
    results = check_site.check_site(site, Path(SHOTS) if SHOTS else None, pages=pages)
    problems = [f"{r.name} ({r.url}): {p}" for r in results for p in r.problems]
    assert not problems, "\n".join(problems)


@_FORK_NOISE
def test_the_browser_check_catches_a_blank_page_a_broken_image_and_a_console_error(tmp_path):
    if check_site.find_chromium() is None:
        pytest.skip("Chromium is not installed (apt-get install chromium, or set CHROMIUM)")
    text = "<p>" + "words " * 60 + "</p>"
    (tmp_path / "index.html").write_text("<html><body></body></html>")
    (tmp_path / "img.html").write_text(f"<html><body>{text}<img src='missing.png'></body></html>")
    (tmp_path / "err.html").write_text(
        f"<html><body>{text}<script>console.error('boom'); undefinedFn();</script></body></html>"
    )
    page = check_site.Page
    pages = [page("blank", "", ""), page("img", "img.html", "words"), page("err", "err.html", "")]
    found = {r.name: " | ".join(r.problems) for r in check_site.check_site(tmp_path, pages=pages)}
    assert "blank" in found["blank"]
    assert "image did not load" in found["img"] and "missing.png" in found["img"]
    assert "console.error: boom" in found["err"] and "undefinedFn" in found["err"]


def test_the_nav_is_the_guide_index_then_a_page_per_public_subpackage():
    from mkdocs.config import load_config

    config = load_config(str(ROOT / "mkdocs.yml"))
    config = config.plugins.on_config(config)
    sections = {title: pages for item in config.nav for title, pages in item.items()}
    titles = list(sections)  # docs/index.md's sections may add more (e.g. examples)
    assert titles[:3] == ["Home", "Tutorials", "Guide"] and titles[-1] == "API reference", titles
    in_nav = {page for pages in list(sections.values())[1:-1] for page in pages}
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert page.name == "index.md" or page.name in in_nav, (
            f"docs/{page.name} is not linked from a `## ` section of docs/index.md: the site's "
            "nav is built from those sections"
        )
    notebooks = sorted(f"tutorials/{p.name}" for p in (ROOT / "tutorials").glob("*.ipynb"))
    assert sections["Tutorials"] == notebooks  # docs/index.md lists them in order
    assert "errors.md" in sections["Guide"]
    api = [name for page in sections["API reference"] for name in page]
    must = ["shapeml", "shapeml.optim", "shapeml.state", "shapeml.hoisting", "shapeml.int8"]
    must += ["shapeml.training", "shapeml.testing", "shapeml.data"]
    assert api[0] == "shapeml" and set(must) <= set(api), api
    for optional in ("shapeml.nn", "shapeml.sharding"):  # a page as soon as the package exists
        assert (optional in api) == (importlib.util.find_spec(optional) is not None)
