"""The site's pages made from other files, written at build time by mkdocs-gen-files (mkdocs.yml);
a script because which pages exist follows from the package and from files outside docs/.

- `api/<name>.md`: one page per public subpackage, rendered by mkdocstrings from its `__all__`, and
  `api/SUMMARY.md`, their nav (mkdocs-literate-nav). A name the top level re-exports from a public
  subpackage (`sm.Model` is `shapeml.models.Model`) is documented there and linked from `api/`.
- `tutorials/*.ipynb`: the notebooks (mkdocs-jupyter executes them here, in a scratch folder),
  their links to repository files made links to the pages the site builds from those files.
- `tutorials/solutions/*.md`, `examples/*.md`: a page showing each exercise solution and script.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import posixpath
import re
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The API pages in guide order; a public subpackage not listed comes after them, by name.
API_ORDER = ["models", "optim", "training", "state", "hoisting", "int8", "nn", "sharding"]
API_SKIP = {"cli"}  # the command line is documented by `shapeml --help`
LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")


def front(boost: float) -> str:
    """Front matter setting the page's rank in Material's search (guide and API 2, default 1)."""
    return f"---\nsearch:\n  boost: {boost}\n---\n\n"


def public_packages() -> list[str]:
    """`shapeml` and its public subpackages, in `API_ORDER`, then by name."""
    import shapeml

    found = [m.name for m in pkgutil.iter_modules(shapeml.__path__) if not m.name.startswith("_")]
    found = [n for n in found if n not in API_SKIP]
    order = [n for n in API_ORDER if n in found] + sorted(set(found) - set(API_ORDER))
    return ["shapeml", *(f"shapeml.{n}" for n in order)]


def member(module: types.ModuleType, name: str) -> object:
    """`module.name`, importing it when it is a submodule the package does not import itself."""
    if hasattr(module, name):
        return getattr(module, name)
    return importlib.import_module(f"{module.__name__}.{name}")


def exported(package: str) -> dict[str, object]:
    """The names `package` exports (its `__all__`, else its public submodules) -> objects."""
    module = importlib.import_module(package)
    names = getattr(module, "__all__", None)
    if names is None:
        names = [m.name for m in pkgutil.iter_modules(module.__path__) if m.name[0] != "_"]
    return {name: member(module, name) for name in names}


def home(package: str, name: str, obj: object) -> str:
    """The identifier (and anchor) of the entry documenting `package.name`."""
    if package == "shapeml" and not isinstance(obj, types.ModuleType):
        for sub in public_packages()[1:]:
            if exported(sub).get(name) is obj:
                return f"{sub}.{name}"
    return f"{package}.{name}"


def api_src(package: str) -> str:
    return "api/index.md" if package == "shapeml" else f"api/{package.split('.', 1)[1]}.md"


def api_page(package: str) -> str:
    names = exported(package)
    # The package's own heading (h1) makes it an autorefs target: `shapeml.optim` links here.
    text = f"{front(2)}::: {package}\n    options:\n      show_root_heading: true\n"
    text += "      show_root_full_path: true\n      heading_level: 1\n"
    if package != "shapeml":
        subs = any(isinstance(obj, types.ModuleType) for obj in names.values())
        return f"{text}      show_submodules: {subs}\n"
    names = {n: obj for n, obj in names.items() if not isinstance(obj, types.ModuleType)}
    here = [n for n, obj in names.items() if home(package, n, obj) == f"{package}.{n}"]
    text += f"      members: {json.dumps(here)}\n"
    text += "\n## Re-exported\n\nDocumented in their subpackages, exported here too:\n\n"
    text += "".join(
        f"- [`sm.{n}`][{home(package, n, o)}]\n" for n, o in names.items() if n not in here
    )
    text += "\n## Subpackages\n\n"
    for sub in public_packages()[1:]:
        doc = (importlib.import_module(sub).__doc__ or "").strip().split("\n\n")[0]
        text += f"- [`{sub}`]({posixpath.basename(api_src(sub))}): {' '.join(doc.split())}\n"
    return text


def site_url(repo_path: str) -> str | None:
    """The URL (under the site) of the page built from a repository file; None: no such page."""
    for pattern, to in [
        (r"docs/index\.md", ""),
        (r"docs/(\w+)\.md", r"\1/"),
        (r"(tutorials/\w+)\.ipynb", r"\1/"),
        (r"((?:tutorials/solutions|examples)/\w+)\.py", r"\1/"),
    ]:
        if re.fullmatch(pattern, repo_path):
            return re.sub(pattern, to, repo_path)
    return None


def notebook(path: Path) -> str:
    """`path`'s JSON with its Markdown cells' links to repository files pointing at their pages."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    page_url = f"tutorials/{path.stem}/"

    def sub(m: re.Match) -> str:
        url = site_url(posixpath.normpath(posixpath.join("tutorials", m.group(2))))
        if url is None or "://" in m.group(2):
            return m.group(0)
        return f"{m[1]}{posixpath.relpath(url or '.', page_url)}/{m[3] or ''}{m[4]}"

    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            source = "".join(cell["source"])  # nbformat stores a list of lines or one string
            cell["source"] = LINK.sub(sub, source)
    return json.dumps(nb, indent=1)


def script_page(path: Path) -> str:
    repo_path = path.relative_to(ROOT).as_posix()
    if path.parent.name == "examples":
        head = f"# `{repo_path}`\n\nRun it from the repository root: `python {repo_path}`.\n\n"
    else:
        head = (
            f"# Solutions: {path.stem}\n\nThe exercises of [the tutorial](../{path.stem}.ipynb), "
            f"solved; the file checks itself: `python {repo_path}`.\n\n"
        )
    return f"{front(0.3)}{head}````python\n{path.read_text(encoding='utf-8')}````\n"


def main() -> None:
    import mkdocs_gen_files

    nav = mkdocs_gen_files.Nav()
    for package in public_packages():
        with mkdocs_gen_files.open(api_src(package), "w") as f:
            f.write(api_page(package))
        nav[package] = posixpath.basename(api_src(package))
    with mkdocs_gen_files.open("api/SUMMARY.md", "w") as f:
        f.writelines(nav.build_literate_nav())
    for path in sorted((ROOT / "tutorials").glob("*.ipynb")):
        with mkdocs_gen_files.open(f"tutorials/{path.name}", "w") as f:
            f.write(notebook(path))
    scripts = sorted((ROOT / "tutorials" / "solutions").glob("*.py"))
    for path in scripts + sorted((ROOT / "examples").glob("*.py")):
        with mkdocs_gen_files.open(path.relative_to(ROOT).with_suffix(".md").as_posix(), "w") as f:
            f.write(script_page(path))


if __name__ == "<run_path>":  # run by mkdocs-gen-files; scripts/docs_hooks.py imports the rest
    main()
