"""MkDocs hooks for the shapeml site (`mkdocs.yml` loads this file).

The guide pages stay plain Markdown that reads well on a code host; this file adds what the site
needs on top of them, all generated at build time so nothing generated is committed:

- the API reference: one page per public subpackage, listing the names in its `__all__` and
  rendered from the docstrings by mkdocstrings (`api/<name>.md`, written by scripts/docs_api.py).
- the nav: Home, the sections of docs/index.md with the pages they link in their order, then the
  API reference; a page docs/index.md links needs no edit of mkdocs.yml.
- the tutorials: `tutorials/*.ipynb`, executed in a fresh kernel each (outputs are produced by the
  build, never stored in git) and rendered by mkdocs-jupyter; the exercise solutions as pages.
- links: the guide's `../tutorials/NN_name.ipynb` and the notebooks' `solutions/NN_name.py` and
  `../docs/page.md` point at the pages the site builds from them; API names in inline code and
  error codes link to their entries, and API entries list the pages that use them
  (scripts/docs_xref.py, run once every page is rendered).
- search: guide and API pages rank above tutorials and whole-file pages; the notebooks' outputs
  and the whole files of the script pages are left out of the index (scripts/docs_search.py).
- no path of the build machine in a page: the notebooks' outputs are scrubbed (`scrub_paths`).

Environment:
- `SHAPEML_DOCS_EXECUTE`: `1` (default) runs every notebook; `0` runs none (the quick build: code
  cells render without outputs, and each such tutorial says so at its top); a comma-separated list
  of notebook names (`02_gradients_and_optimizers`) runs only those.
- `SHAPEML_DOCS_JOBS`: how many notebooks run at once (default 2).
- `SHAPEML_DOCS_CACHE`: where executed notebooks are kept (default `build/docs_notebooks/`), keyed
  by the notebook and the shapeml sources, so `mkdocs serve` re-runs a notebook only when it or
  the library changed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docs_api  # scripts/docs_api.py: mkdocs puts this file's folder on the path to load it
import docs_paths
import docs_search
import docs_xref
import nbformat
from docs_search import page_kind
from mkdocs.plugins import CombinedEvent, event_priority
from mkdocs.structure.files import File, Files
from mkdocs.utils import get_relative_url

log = logging.getLogger("mkdocs.hooks.shapeml")

ROOT = Path(__file__).resolve().parent.parent
TUTORIALS = ROOT / "tutorials"
EXAMPLES = ROOT / "examples"
API_NAV = "API reference"
# Nav titles of docs/index.md's sections (a section not listed keeps its heading).
NAV_TITLES = {"The tutorials, in order": "Tutorials", "Reference pages": "Guide"}
LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")


def _executed(stems: list[str]) -> set[str]:
    """The notebooks (by name) this build runs, from `SHAPEML_DOCS_EXECUTE`."""
    value = os.environ.get("SHAPEML_DOCS_EXECUTE", "1").strip()
    if value.lower() in ("0", "false", "no", ""):
        return set()
    if value.lower() in ("1", "true", "yes", "all"):
        return set(stems)
    chosen = {v.strip().removesuffix(".ipynb") for v in value.split(",") if v.strip()}
    if unknown := chosen - set(stems):
        raise ValueError(
            f"SHAPEML_DOCS_EXECUTE names no such tutorial: {sorted(unknown)}; "
            f"the tutorials are {stems} (or use 1 for all, 0 for none)"
        )
    return chosen


def _cache() -> Path:
    return Path(os.environ.get("SHAPEML_DOCS_CACHE") or ROOT / "build" / "docs_notebooks")


# --------------------------------------------------------------------------- API pages, nav


def _api_files(config) -> list[File]:
    return [File.generated(config, src, content=md) for src, md in docs_api.api_pages().items()]


def guide_nav() -> list[dict]:
    """The nav sections of `docs/index.md`: each `## ` section's linked pages, in their order."""
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    nav = []
    for section in re.split(r"^## ", index, flags=re.M)[1:]:
        title, body = section.split("\n", 1)
        pages = []
        for m in LINK.finditer(body):
            src = _site_src(posixpath.normpath(posixpath.join("docs", m.group(2))))
            if src and src not in pages and src.endswith((".md", ".ipynb")):
                pages.append(src)
        if pages:
            nav.append({NAV_TITLES.get(title.strip(), title.strip()): pages})
    return nav


def on_config(config):
    """Builds the nav: Home, the sections of `docs/index.md`, a page per public subpackage."""
    if config.nav != [{"Home": "index.md"}, {API_NAV: "api/index.md"}]:
        raise ValueError(
            f"mkdocs.yml: the nav is `- Home: index.md` and `- {API_NAV}: api/index.md`; the rest "
            "comes from docs/index.md's sections (scripts/mkdocs_hooks.py)"
        )
    api = [{name: docs_api.api_src(name)} for name in docs_api.public_packages()]
    config.nav = [config.nav[0], *guide_nav(), {API_NAV: api}]
    return config


# --------------------------------------------------------------------------- tutorials


def _sources_digest() -> str:
    """A hash of the shapeml sources: an executed notebook is stale once the library changed."""
    import shapeml

    package = Path(shapeml.__file__).parent
    h = hashlib.sha256()
    for path in sorted(package.rglob("*")):
        if path.is_file() and path.suffix in (".py", ".json"):
            h.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _run(path: Path, digest: str) -> nbformat.NotebookNode:
    """`path` executed top to bottom in a fresh kernel and a scratch directory (cached)."""
    from nbclient import NotebookClient

    raw = path.read_bytes()
    key = hashlib.sha256(raw + digest.encode()).hexdigest()[:20]
    cache = _cache()
    cached = cache / f"{path.stem}-{key}.ipynb"
    if cached.is_file():
        log.info("tutorial %s: executed copy cached (%s)", path.name, cached.name)
        return nbformat.read(cached, as_version=4)
    log.info("tutorial %s: executing", path.name)
    nb = nbformat.reads(raw.decode("utf-8"), as_version=4)
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "MPLBACKEND")}
    with tempfile.TemporaryDirectory(prefix="shapeml-docs-") as cwd:
        # Cells tagged `raises-exception` show an error on purpose; any other error fails the build.
        client = NotebookClient(
            nb, kernel_name="python3", timeout=600, allow_errors=False,
            resources={"metadata": {"path": cwd}},
        )  # fmt: skip
        client.execute(env=env)
    for stale in cache.glob(f"{path.stem}-*.ipynb"):
        stale.unlink(missing_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(f".{os.getpid()}.tmp")
    nbformat.write(nb, partial)
    os.replace(partial, cached)  # a concurrent build never reads a half-written copy
    return nb


def _site_src(repo_path: str) -> str | None:
    """The site source a repository path is published as (None: not part of the site)."""
    if repo_path.startswith("docs/"):
        return repo_path.removeprefix("docs/")
    if re.fullmatch(r"tutorials/[^/]+\.ipynb", repo_path):
        return repo_path
    if re.fullmatch(r"(tutorials/solutions|examples)/[^/]+\.py", repo_path):
        return repo_path[: -len(".py")] + ".md"  # the script's page (`_script_files`)
    return None


def _rewrite(text: str, repo_dir: str, target) -> str:
    """Rewrites each relative link in Markdown `text` (written from `repo_dir`) by `target`."""

    def sub(m: re.Match) -> str:
        url = m.group(2)
        if "://" in url or url.startswith(("/", "mailto:")):
            return m.group(0)
        src = _site_src(posixpath.normpath(posixpath.join(repo_dir, url)))
        new = target(src) if src else None
        return f"{m.group(1)}{new}{m.group(3) or ''}{m.group(4)}" if new else m.group(0)

    return LINK.sub(sub, text)


def _notebook_files(config, files: Files) -> list[File]:
    paths = sorted(TUTORIALS.glob("*.ipynb"))
    executed = _executed([p.stem for p in paths])
    digest = _sources_digest() if executed else ""
    jobs = max(1, int(os.environ.get("SHAPEML_DOCS_JOBS", "2")))

    def load(path: Path) -> nbformat.NotebookNode:
        if path.stem in executed:
            return _run(path, digest)
        return nbformat.read(path, as_version=4)

    with ThreadPoolExecutor(jobs) as pool:
        notebooks = list(pool.map(load, paths))
    out = _cache() / "site" / "tutorials"
    out.mkdir(parents=True, exist_ok=True)
    made = []
    for path, nb in zip(paths, notebooks):
        src = f"tutorials/{path.name}"
        # A file with a real source directory: mkdocs-jupyter's wrapper reads it from there.
        page = File(src, str(out.parent), config.site_dir, config.use_directory_urls)
        # Its URL once mkdocs-jupyter made it a page (`tutorials/01_models/`): that of a .md page.
        url = File(f"tutorials/{path.stem}.md", None, "", config.use_directory_urls).url
        urls = {f.src_uri: f.url for f in files} | {src: url}

        def target(site_src, url=url, urls=urls):
            return get_relative_url(urls[site_src], url) if site_src in urls else None

        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = _rewrite(cell.source, "tutorials", target)
        if path.stem not in executed:
            note = (  # the theme's admonition, in HTML: nbconvert renders the cell, not mkdocs
                '<div class="admonition note"><p class="admonition-title">Quick build</p><p>This '
                "notebook was not executed for this build, so its outputs are missing: "
                "<code>mkdocs build</code> without <code>SHAPEML_DOCS_EXECUTE=0</code> runs it."
                "</p></div>"
            )
            nb.cells.insert(1, nbformat.v4.new_markdown_cell(note))
        docs_paths.scrub_notebook(nb, ROOT)
        nbformat.write(nb, out / path.name)
        made.append(page)
    return made


def _script_files(config) -> list[File]:
    """A page showing each exercise solution and example script, which the guide links."""
    made = []
    for path in sorted((TUTORIALS / "solutions").glob("*.py")) + sorted(EXAMPLES.glob("*.py")):
        repo_path = path.relative_to(ROOT).as_posix()
        if path.parent == EXAMPLES:
            head = f"# `{repo_path}`\n\nRun it from the repository root: `python {repo_path}`.\n\n"
        else:
            head = (
                f"# Solutions: {path.stem}\n\nThe exercises of [the tutorial](../{path.stem}.ipynb), "
                f"solved; the file checks itself: `python {repo_path}`.\n\n"
            )
        code = f"````python\n{path.read_text(encoding='utf-8')}````\n"
        made.append(File.generated(config, _site_src(repo_path), content=head + code))
    return made


@event_priority(100)  # before mkdocs-jupyter wraps the notebooks it renders
def on_files(files: Files, config) -> Files:
    for f in _api_files(config) + _script_files(config):
        files.append(f)
    for f in _notebook_files(config, files):
        files.append(f)
    return files


def on_page_markdown(markdown: str, page, config, files: Files) -> str:
    """The guide's links to `../tutorials/NN_name.ipynb` and `../examples/name.py` point at the
    pages the site makes of them."""
    if page.file.generated_by or not page.file.src_uri.endswith(".md"):
        return markdown
    repo_dir = posixpath.dirname(f"docs/{page.file.src_uri}")
    page_dir = posixpath.dirname(page.file.src_uri)

    def target(site_src: str) -> str | None:
        if not files.get_file_from_path(site_src):
            return None
        return posixpath.relpath(site_src, page_dir or ".")

    return _rewrite(markdown, repo_dir, target)


HEADING_ID = re.compile(r"<h[1-6][^>]*\bid=\"([^\"]+)\"")


def _toc_items(items) -> list:
    return [x for item in items for x in (item, *_toc_items(item.children))]


@event_priority(50)  # before other plugins read the page's table of contents
def on_page_content(html: str, page, config, files: Files) -> str:
    """Search boost and exclusions (scripts/docs_search.py); a tutorial's table of contents links
    its headings' ids, and no empty MathJax loader is left.

    mkdocs-jupyter slugs the headings twice, differently: "## `sm.hoist`" gets the id `smhoist`
    in the page but `_1` in the table of contents. The headings come in the same order in both.
    """
    kind = page_kind(page.file.src_uri)
    html = docs_search.prepare(html, kind, page.meta)
    if kind != "tutorial":
        return html
    items, ids = _toc_items(page.toc), HEADING_ID.findall(html)
    if len(items) == len(ids):
        for item, heading_id in zip(items, ids):
            item.id = heading_id
    else:
        log.info("%s: %d headings but %d TOC entries", page.file.src_uri, len(ids), len(items))
    return html.replace('<script src=""> </script>', "")


@event_priority(-60)  # after autorefs made its links (-50), before the pages are written
def on_env(env, config, files: Files):
    """Cross-links every rendered page (scripts/docs_xref.py) and scrubs build-machine paths."""
    pages = [
        docs_xref.Page(f.src_uri, f.page.url, f.page.title or "", f.page.content, page_kind(src))
        for f in files.documentation_pages()
        if f.page is not None and f.page.content and (src := f.src_uri)
    ]
    docs_xref.link_site(pages)
    by_src = {p.src: p for p in pages}
    for f in files.documentation_pages():
        if f.src_uri in by_src:  # the notebooks' outputs are scrubbed already (`_notebook_files`)
            text = by_src[f.src_uri].html
            tutorial = page_kind(f.src_uri) == "tutorial"
            f.page.content = text if tutorial else docs_paths.scrub_text(text, ROOT)
    return env


@event_priority(100)  # before mkdocs-material's search indexes the page (at 0)
def _index_view(context, page, config, nav):
    if page_kind(page.file.src_uri) == "tutorial":
        page.shown_content = page.content
        page.content = docs_search.index_view(page.content)
    return context


@event_priority(-100)  # after the search indexed it: the page shows its content as rendered
def _shown_view(context, page, config, nav):
    shown = getattr(page, "shown_content", None)
    if shown is not None:
        page.content = re.sub(r'\s?data-search-\w+(="[^"]*")?', "", shown)
        del page.shown_content
    return context


on_page_context = CombinedEvent(_index_view, _shown_view)
