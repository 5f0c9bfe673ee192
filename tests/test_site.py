"""The documentation site: `mkdocs build --strict` passes (which also fails on a reference
mkdocs-autorefs cannot resolve, a page left out of the nav, a build-machine path in a page),
every page the site promises is there and every link in it resolves, API names and error codes
are links and API entries link back, every public object is documented, and the pages work in a
real browser (headless Chromium): no code block wider than its column at 1280 px, and search
ranks the guide and the API first.

The build here shows the notebooks as the suite ran them: each runs once per test run
(tests/test_tutorials.py's `executed_once`, quick values of its knobs), and the build reads those
outputs (`SHAPEML_DOCS_NOTEBOOKS`) instead of running them again; under xdist the workers share
the one build. The full build, which executes every notebook with its full values, is `mkdocs
build --strict`.

Chromium: the browser tests skip without it on a workstation, and fail without it in CI (`CI` or
`SHAPEML_CI` set: `.ci/run` sets `SHAPEML_CI` and installs Chromium first).
"""

from __future__ import annotations

import fcntl
import html.parser
import os
import posixpath
import re
import subprocess
import sys
import types
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import check_site  # noqa: E402
import docs_gen  # noqa: E402
import docs_hooks  # noqa: E402
from test_tutorials import NOTEBOOKS, executed_once  # noqa: E402

SHOTS = os.environ.get("SHAPEML_SITE_SHOTS")  # a folder: the browser test saves screenshots there


def _build(out: Path, notebooks: Path) -> None:
    env = dict(
        os.environ,
        SHAPEML_DOCS_EXECUTE="0",  # every notebook comes executed from `notebooks`
        SHAPEML_DOCS_NOTEBOOKS=str(notebooks),
        NO_MKDOCS_2_WARNING="1",  # notices of the theme and of the plugins about MkDocs 2
        DISABLE_MKDOCS_2_WARNING="true",
    )
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{run.stderr[-6000:]}"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once per test run (xdist workers share it: the first one builds it), with
    the notebooks as the suite ran them."""
    notebooks = [executed_once(path.stem, tmp_path_factory) for path in NOTEBOOKS][-1]
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run_id is None:
        out = tmp_path_factory.mktemp("docs")
        _build(out, notebooks)
        return out / "site"
    out = tmp_path_factory.getbasetemp().parent / f"docs-{run_id}"
    out.mkdir(exist_ok=True)
    with open(out / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "built").exists():
            _build(out, notebooks)
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
    for package in docs_gen.public_packages():
        assert _page(site, docs_gen.api_src(package)).is_file(), f"no API page for {package}"


def test_every_public_object_is_documented_on_an_api_page(site):
    """Each name in a public `__all__` has an entry (an anchor with its dotted name) at its home
    (`sm.Model` at `shapeml.models.Model`); mkdocstrings shows no object without a docstring."""
    missing = []
    for package in docs_gen.public_packages():
        for name, obj in docs_gen.exported(package).items():
            if isinstance(obj, types.ModuleType):
                continue  # a subpackage has a page of its own, a submodule its own section
            anchor = docs_gen.home(package, name, obj)
            src = docs_gen.api_src(anchor.rsplit(".", 1)[0])
            if f'id="{anchor}"' not in _page(site, src).read_text(encoding="utf-8"):
                missing.append(f"{package}.{name}: no #{anchor} on {src}: give it a docstring")
    assert not missing, "\n".join(missing)


def test_every_tutorial_is_shown_executed_with_its_plots(site):
    for path in NOTEBOOKS:
        text = (site / "tutorials" / path.stem / "index.html").read_text(encoding="utf-8")
        assert "Quick build" not in text and "jp-OutputArea-output" in text, path.stem
    text = (site / "tutorials" / "02_gradients_and_optimizers" / "index.html").read_text()
    assert text.count("data:image/png;base64,") >= 3


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
    guide = (site / "gradients_and_optim" / "index.html").read_text(encoding="utf-8")
    link = 'class="autorefs autorefs-internal" href='
    assert f'{link}"../api/optim/#shapeml.optim.' in guide  # `optim.adamw(...)`
    assert f'{link}"../errors/#e' in guide  # `E1101`
    tutorial = (site / "tutorials" / "04_hoisting" / "index.html").read_text(encoding="utf-8")
    assert f'{link}"../../api/hoisting/#shapeml.hoisting.hoist"' in tutorial  # `sm.hoist`
    stderr = 'jp-OutputArea-output" data-mime-type="application/vnd.jupyter.stderr"'
    traceback = tutorial.split(stderr, 1)[1][:20000]
    assert f'{link}"../../errors/#e' in traceback  # a code in a traceback
    api = (site / "api" / "optim" / "index.html").read_text(encoding="utf-8")
    entry = api.split('id="shapeml.optim.adamw"', 1)[1].split("doc-backlinks", 1)[1]
    used_by = entry.split("</div>", 1)[0]  # the guide's and the tutorials' sections that use it
    assert 'href="../../gradients_and_optim/#' in used_by and "../../tutorials/" in used_by


def test_api_pages_have_summary_tables_and_errors_their_explanation(site):
    api = (site / "api" / "optim" / "index.html").read_text(encoding="utf-8")
    assert 'id="shapeml.optim-classes"' in api and 'id="shapeml.optim-functions"' in api
    rows = re.findall(r'<tr class="doc-section-item">.*?<p>(.*?)</p>', api, re.S)
    assert len(rows) >= 20 and all(r.strip() for r in rows), rows
    errors = (site / "api" / "state" / "index.html").read_text(encoding="utf-8")
    entry = errors.split('id="shapeml.state.StateIndexError"', 1)[1][:4000]
    assert "(E1401)" in entry or "E1401</a>)" in entry, "an error class shows its explanation"


def test_api_entries_show_how_to_build_a_model_and_hide_private_bases(site):
    nn = (site / "api" / "nn" / "index.html").read_text(encoding="utf-8")
    entry = nn.split('id="shapeml.nn.Linear"', 1)[1].split("doc-backlinks", 1)[0]
    signature = re.sub(r"<[^>]+>", "", entry.split("doc-signature", 1)[1].split("</code>", 1)[0])
    assert signature.lstrip().startswith('highlight">Linear.init(') and "bias: bool" in signature
    assert "dims: Dims" not in signature, signature  # not Model.__init__'s (*, dims, **values)
    pages = [p.read_text(encoding="utf-8") for p in (site / "api").rglob("*.html")]
    bases = [b for page in pages for b in re.findall(r"Bases: (.*?)</p>", page, re.S)]
    assert bases and not [b for b in bases if re.search(r">_\w+<", b)], "a private base shows"
    assert not [p for p in pages if docs_hooks.PRIVATE_TITLE.search(p)]


def test_used_in_lists_guide_pages_and_tutorials_once_each(site):
    api = (site / "api" / "optim" / "index.html").read_text(encoding="utf-8")
    for entry in api.split('class="doc-backlinks')[1:]:
        links = re.findall(r'href="([^"]+)"', entry.split("</div>", 1)[0])
        pages = [link.split("#", 1)[0] for link in links]
        assert len(pages) == len(set(pages)), f"a page twice in Used in: {links}"
        for page in pages:
            name = page.strip("./").split("/")[0]
            assert name in {"tutorials"} | {p.stem for p in (ROOT / "docs").glob("*.md")}, page
            assert not page.strip("./").startswith(("examples", "tutorials/solutions", "api"))


def test_error_codes_name_their_class_and_the_home_page_installs_from_the_repository(site):
    errors = (site / "errors" / "index.html").read_text(encoding="utf-8")
    sections = errors.split("<h2 ")[1:]
    assert len(sections) == len(docs_hooks.error_ids())
    assert all("Raised as " in section for section in sections)
    assert 'href="../api/state/#shapeml.state.StateIndexError"' in errors
    home = (site / "index.html").read_text(encoding="utf-8")
    repo = re.search(r"^repo_url: (\S+)$", (ROOT / "mkdocs.yml").read_text(), re.M)[1]
    assert f"git+{repo}" in home and f'href="{repo}"' in home  # the install line; the header
    import shapeml

    assert f"shapeml {shapeml.__version__}" in home  # the footer
    architecture = (site / "architecture" / "index.html").read_text(encoding="utf-8")
    assert f'href="{repo}/blob/main/tests/test_architecture.py"' in architecture  # a path


def test_searching_a_name_finds_its_api_entry_by_its_tag(site):
    import json

    index = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))
    tagged = {d["location"]: d["tags"] for d in index["docs"] if d.get("tags")}
    assert tagged["api/training/#shapeml.training.TrainStep"] == ["trainstep"]
    assert tagged["api/state/#shapeml.state.KVCache"] == ["kvcache"]
    assert all(location.startswith("api/") for location in tagged)


def test_no_page_or_search_entry_shows_a_build_machine_path_and_the_sitemap_lists_pages(site):
    """The strict build fails on a path in a page; the search index and sitemap come after it."""
    problems = []
    for path in [*site.glob("search/*.json"), site / "sitemap.xml"]:
        problems += [f"{path.name}: {p}" for p in docs_hooks.machine_paths(path.read_text())]
    assert not problems, "\n".join(problems[:40])
    urls = re.findall(r"<loc>([^<]+)</loc>", (site / "sitemap.xml").read_text(encoding="utf-8"))
    assert len(urls) > 20 and all("://" in u for u in urls), urls[:5]


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
    searches = check_site.class_searches()  # each public class's name finds its entry first
    assert (
        len(searches) > 50 and searches["TrainStep"] == "api/training/#shapeml.training.TrainStep"
    )
    home, api = (p for p in check_site.PAGES if p.name in ("home", "api"))
    pages = [home._replace(searches=searches), api]  # the home page searches
    pages += [p for p in check_site.PAGES if p.name == "tutorial"]  # 02, with its plots
    found = check_site.check_site(site, pages=pages)
    problems = [f"{name}: {p}" for name, problems in found.items() for p in problems]
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
    wide = "x = 1  # " + "a_long_comment_ " * 30
    column = '<html><body><div class="md-content__inner" style="width: 600px">'
    for name, body in {
        # a code block that wraps; one that scrolls sideways is what the site wants
        "wraps": f"<pre><code style='white-space: pre-wrap; display: block'>{wide}</code></pre>",
        "scrolls": f"<pre><code style='overflow: auto; display: block'>{wide}</code></pre>",
        "table": f"<table style='width: 900px'><tr><td>{wide}</td></tr></table>",
        "private": "<p title='shapeml._io.FileMissingError'>FileMissingError</p>",
        "issue": "<p>Measured when issue 21 was filed, within budget.</p>",
    }.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "index.html").write_text(f"{column}{text}{body}</div></body></html>")
    found = check_site.check_site(tmp_path, pages=pages, guide={"", "issue/"})
    found = {k: " | ".join(v) for k, v in found.items()}
    assert "blank" in found["blank"]
    assert "image did not load" in found["img"] and "missing.png" in found["img"]
    assert "console.error: boom" in found["err"] and "undefinedFn" in found["err"]
    assert "wraps/: a code block wraps its lines" in found["widths"]
    assert "scrolls/" not in found["widths"]
    assert "table/: a table" in found["widths"] and "600 px column" in found["widths"]
    assert "private/: a private name: shapeml._io" in found["widths"]
    assert "issue/: developer material: 'issue 21'" in found["widths"]
    assert "issue/: developer material: 'budget'" in found["widths"]
    assert "/: the home page shows no code block" in found["widths"]


def test_the_hooks_link_names_and_codes_and_scrub_and_find_build_machine_paths():
    assert docs_hooks.resolve("sm.shard(m, mesh, rules)")[0] == "shapeml.sharding.shard"
    assert docs_hooks.resolve("optim.adamw")[0] == "shapeml.optim.adamw"
    assert docs_hooks.resolve("Model.init") == ("shapeml.models.Model.init", "shapeml.models.Model")
    assert docs_hooks.resolve("hoist") is None and docs_hooks.resolve("m.w_h") is None
    html = docs_hooks.link_html('<h2 id="s">S</h2><p><code>sm.save</code> raises E0901</p>', "s")
    assert '<autoref identifier="shapeml.models.save"' in html and 'backlink-anchor="s"' in html
    assert ">E0901</autoref>" in html
    text = "Saved in /tmp/run-1/m.safetensors; see /home/me/x.py"
    assert docs_hooks.machine_paths(text) == ["/home/me", "/tmp/run-1"]
    assert "m.safetensors" in docs_hooks.scrub(text) and "/tmp" not in docs_hooks.scrub(text)
    linked = docs_hooks.link_html(
        "<p><code>tests/test_grad.py</code> <code>nope/x.py</code></p>", None
    )
    assert f'<a href="{docs_hooks.REPO_URL}/blob/main/tests/test_grad.py"><code>' in linked
    assert "<code>nope/x.py</code>" in linked
    assert docs_hooks.error_class_line("E1401").startswith("Raised as [`StateIndexError`][")
    assert docs_hooks.error_class_line("E0901").startswith("Raised as `UnknownFieldError`, caught")
    assert docs_hooks.backlink_anchor("models.md", '<h1 id="models">') == "models"
    for src in ("index.md", "errors.md", "examples_digits.md", "api/nn.md", "examples/x.md"):
        assert docs_hooks.backlink_anchor(src, '<h1 id="t">') is None, src
    assert docs_hooks.backlink_anchor("tutorials/01_models.ipynb", '<h1 id="t">') == "t"


def test_the_nav_is_docs_index_sections_then_the_generated_api_pages():
    """mkdocs.yml's nav lists the pages docs/index.md links, in its order (the strict build fails
    on a page left out); the API pages and their nav are generated (scripts/docs_gen.py)."""
    import yaml

    class Loader(yaml.SafeLoader):  # mkdocs.yml's `!ENV` tags
        pass

    Loader.add_constructor("!ENV", lambda loader, node: None)
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)
    nav = {title: pages for item in config["nav"] for title, pages in item.items()}
    sections = ["Home", "Tutorials", "Guide", "Examples", "API reference", "Contributing"]
    assert list(nav) == sections, list(nav)
    assert nav["API reference"] == "api/" and nav["Contributing"] == "contributing.md"
    assert "navigation.tabs" in config["theme"]["features"]  # each section one click away
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    notebooks = re.findall(r"\]\(\.\./(tutorials/\d\d_\w+\.ipynb)\)", index)
    assert nav["Tutorials"] == notebooks == sorted(notebooks)
    guide = index.split("## The guide", 1)[1].split("## Conventions", 1)[0]
    linked = re.findall(r"\]\((\w+\.md)\)", guide)
    assert nav["Guide"] + nav["Examples"] == list(dict.fromkeys(linked)), "docs/index.md's order"


def test_ci_installs_chromium_and_marks_itself_before_the_tests():
    """`.ci/run` gets a browser before the suite runs, so the browser tests run there for real."""
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    last = len(lines) - 1  # the README's test command (tests/test_readme.py)
    install = next(i for i, x in enumerate(lines) if "apt-get install" in x and "chromium" in x)
    marked = lines.index("export SHAPEML_CI=1")
    assert install < last and marked < last, "install Chromium and export SHAPEML_CI=1 first"
    assert any("command -v chromium" in x for x in lines[:install]), "install only when missing"
