"""The documentation site: `mkdocs build --strict` passes, every page the site promises is there and
every link in it resolves, the site links itself together (API names and error codes are links,
every public object is documented), no page shows a path of the build machine, a tutorial's error
cell shows at most `check_site.ERROR_CELL_LINES` lines, and the pages work
in a real browser (headless Chromium): no code block wider than its column at 1280 px, and search
ranks the guide and the API first.

Time budget: the build here executes one tutorial (`EXECUTED`, a short one with plots) and renders
the others without outputs (`SHAPEML_DOCS_EXECUTE`, see scripts/mkdocs_hooks.py); under xdist the
workers share that one build. The full build, which executes every notebook, is `mkdocs build
--strict`; `tests/test_tutorials.py` runs and checks the notebooks themselves.

Chromium: the browser tests skip without it on a workstation, and fail without it in CI (`CI` or
`SHAPEML_CI` set: `.ci/run` sets `SHAPEML_CI` and installs Chromium first).
"""

from __future__ import annotations

import fcntl
import html.parser
import importlib
import importlib.util
import os
import posixpath
import re
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
import site_checks  # noqa: E402

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


def test_api_names_and_error_codes_are_links_and_api_entries_link_back(site):
    problems = site_checks.unlinked_api_names(site) + site_checks.unlinked_error_codes(site)
    assert not problems, "\n".join(problems[:40])
    guide = (site / "gradients_and_optim" / "index.html").read_text(encoding="utf-8")
    assert 'class="sm-xref" href="../api/optim/#shapeml.optim.' in guide  # `optim.adamw(...)`
    assert 'class="sm-code" href="../errors/#e' in guide  # `E1101`
    tutorial = (site / "tutorials" / EXECUTED / "index.html").read_text(encoding="utf-8")
    stderr = 'jp-OutputArea-output" data-mime-type="application/vnd.jupyter.stderr"'
    traceback = tutorial.split(stderr, 1)[1][:20000]
    assert 'class="sm-code" href="../../errors/#e' in traceback  # a code in a traceback
    api = (site / "api" / "optim" / "index.html").read_text(encoding="utf-8")
    used = api.split('id="shapeml.optim.adamw"', 1)[1].split('class="sm-used-in"', 1)[1]
    assert 'href="../../gradients_and_optim/#' in used.split("</p>", 1)[0]


def test_every_public_object_is_documented_and_api_pages_have_summary_tables(site):
    problems = site_checks.undocumented_objects(site)
    assert not problems, "\n".join(problems)
    api = (site / "api" / "optim" / "index.html").read_text(encoding="utf-8")
    themes = ["Optimizers", "Transforms and masks", "Schedules", "Optimizer checkpoints"]
    assert [t for t in themes if f">{t}<a" in api] == themes, "themes missing or out of order"
    cells = re.findall(r'<span class="api-summary">(.*?)</span>', api, re.S)
    assert len(cells) >= 20 and all(c.strip() for c in cells), cells
    errors = (site / "api" / "state" / "index.html").read_text(encoding="utf-8")
    entry = errors.split('id="shapeml.state.StateIndexError"', 1)[1][:4000]
    assert "(E1401)" in entry or "E1401</a>)" in entry, "an error class shows its explanation"


def test_no_page_shows_a_build_machine_path_and_the_sitemap_lists_the_pages(site):
    problems = site_checks.machine_paths(site) + site_checks.sitemap(site)
    assert not problems, "\n".join(problems[:40])


# Starting Chromium forks a process that also runs JAX's threads; an at-fork hook of another
# library complains about it, harmlessly, after the test has finished.
_FORK_NOISE = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _chromium() -> None:
    """Skips the test without Chromium, except in CI, where the browser check must run."""
    if check_site.find_chromium() is not None:
        return
    why = "Chromium is not installed (apt-get install chromium, or set CHROMIUM)"
    if os.environ.get("SHAPEML_CI") or os.environ.get("CI"):
        pytest.fail(f"{why}: CI must run the browser check of the site (.ci/run installs it)")
    pytest.skip(f"{why}: the browser check of the site (scripts/check_site.py) did not run")


@_FORK_NOISE
def test_the_site_works_in_headless_chromium(site):
    _chromium()
    pages = [p for p in check_site.PAGES if p.name in ("home", "api")]  # the others: screenshots
    pages.append(check_site.Page("tutorial", f"tutorials/{EXECUTED}/", "sm.hoist", min_plots=1))
    results = check_site.check_site(site, Path(SHOTS) if SHOTS else None, pages=pages)
    problems = [f"{r.name} ({r.url}): {p}" for r in results for p in r.problems]
    assert not problems, "\n".join(problems)


@_FORK_NOISE
def test_the_browser_check_catches_a_blank_page_a_broken_image_and_a_console_error(tmp_path):
    _chromium()
    text = "<p>" + "words " * 60 + "</p>"
    (tmp_path / "index.html").write_text("<html><body></body></html>")
    (tmp_path / "img.html").write_text(f"<html><body>{text}<img src='missing.png'></body></html>")
    (tmp_path / "err.html").write_text(
        f"<html><body>{text}<script>console.error('boom'); undefinedFn();</script></body></html>"
    )
    page = check_site.Page
    pages = [page("blank", "", ""), page("img", "img.html", "words"), page("err", "err.html", "")]
    wide = "x = 1  # " + "a_long_comment_" * 30
    (tmp_path / "wide").mkdir()
    (tmp_path / "wide" / "index.html").write_text(
        '<html><body><div class="md-content__inner" style="width: 600px">'
        f"{text}<pre><code style='overflow: auto; display: block'>{wide}</code></pre>"
        "</div></body></html>"
    )
    results = check_site.check_site(tmp_path, pages=pages)
    found = {r.name: " | ".join(r.problems) for r in results}
    assert "blank" in found["blank"]
    assert "image did not load" in found["img"] and "missing.png" in found["img"]
    assert "console.error: boom" in found["err"] and "undefinedFn" in found["err"]
    assert "wide/: a code" in found["widths"] and "600 px column" in found["widths"]


def test_the_html_checks_catch_unlinked_names_and_codes_paths_and_undocumented_objects(tmp_path):
    def page(path: str, body: str) -> None:
        (tmp_path / path).mkdir(parents=True, exist_ok=True)
        article = f'<article class="md-content__inner md-typeset">{body}</article>'
        (tmp_path / path / "index.html").write_text(f"<html><body>{article}</body></html>")

    page("guide", "<p>Place it with <code>sm.shard</code> (<a href='x'><code>sm.load</code></a>)."
         " Raises E0901; <a href='e'>E0902</a>. Saved in /tmp/run-1/m.safetensors.</p>")  # fmt: skip
    page("api/foo", '<h3 id="shapeml.foo">foo</h3><div class="doc doc-contents first"></div>')
    names = site_checks.unlinked_api_names(tmp_path)
    assert names == ["guide/index.html: `sm.shard` names an API object, no link"], names
    codes = site_checks.unlinked_error_codes(tmp_path, codes={"E0901", "E0902"})
    assert codes == ["guide/index.html: E0901 is not a link to the error index"], codes
    assert "/tmp/run-1/" in " ".join(site_checks.machine_paths(tmp_path))
    entries = {"shapeml.foo": ("api/foo.md", "shapeml.foo")}
    assert site_checks.undocumented_objects(tmp_path, entries) == [
        "shapeml.foo (api/foo.md) has no documentation: give it a docstring"
    ]
    (tmp_path / "sitemap.xml").write_text("<urlset></urlset>")
    assert "lists no page" in site_checks.sitemap(tmp_path)[0]


def test_the_executed_tutorials_error_cells_are_short_and_show_no_path(site):
    """The error cells of the tutorial the test build executes, as the site shows them: at most
    `check_site.ERROR_CELL_LINES` lines each, no path of the build machine. (Every tutorial's
    error cells get the same check on the runs of tests/test_tutorials.py, rendered the same way,
    so the notebooks run once.)"""
    page = (site / "tutorials" / EXECUTED / "index.html").read_text(encoding="utf-8")
    assert "celltag_raises-exception" in page and "application/vnd.jupyter.stderr" in page
    problems = check_site.tutorial_error_cells(site)
    assert not problems, "\n".join(problems)


def test_the_error_cell_check_catches_a_long_traceback_and_a_path(tmp_path):
    """`check_site.tutorial_error_cells`, on a made-up page."""
    cell = (
        '<div class="jp-Cell jp-CodeCell jp-Notebook-cell celltag_raises-exception" id="c">'
        '<div class="jp-InputPrompt jp-InputArea-prompt">In&nbsp;[3]:</div>'
        '<div class="jp-RenderedText jp-OutputArea-output" '
        'data-mime-type="application/vnd.jupyter.stderr"><pre>{}</pre></div></div>'
    )
    long = "\n".join(f"frame {i}" for i in range(30))
    short = "ValueError: [E0901] bad\n  File /home/me/x.py:3"
    (tmp_path / "tutorials" / "01_x").mkdir(parents=True)
    (tmp_path / "tutorials" / "01_x" / "index.html").write_text(
        cell.format(long) + cell.format(short).replace("[3]", "[4]")
    )
    found = check_site.tutorial_error_cells(tmp_path)
    assert found[0] == "01_x, cell In [3]: 30 lines of error output: 'frame 0'", found
    assert len(found) == 2 and found[1].startswith("01_x, cell In [4]: a build-machine path")


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


def test_ci_installs_chromium_and_marks_itself_before_the_tests():
    """`.ci/run` gets a browser before the suite runs, so the browser tests run there for real."""
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    last = len(lines) - 1  # the README's test command (tests/test_readme.py)
    install = next(i for i, x in enumerate(lines) if "apt-get install" in x and "chromium" in x)
    marked = lines.index("export SHAPEML_CI=1")
    assert install < last and marked < last, "install Chromium and export SHAPEML_CI=1 first"
    assert any("command -v chromium" in x for x in lines[:install]), "install only when missing"
