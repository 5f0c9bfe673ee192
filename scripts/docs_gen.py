"""The site's pages made from other files, written at build time by mkdocs-gen-files: a script,
as which pages exist follows from the package and from files outside docs/.

- `api/<name>.md` per public subpackage, rendered by mkdocstrings from its `__all__`, and their nav
  `api/SUMMARY.txt` (mkdocs-literate-nav); `sm.Model` is documented once, as `shapeml.models.Model`.
- `tutorials/*.ipynb` (mkdocs-jupyter runs them there, in a scratch folder, unless the test suite
  ran them already: `SHAPEML_DOCS_NOTEBOOKS`), links made site links;
  `tutorials/solutions/*.md`, `examples/*.md`: a page showing each solution and example script.
"""

from __future__ import annotations

import functools
import json
import os
import pkgutil
import posixpath
import re
import types
from importlib import import_module
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The API pages in guide order; a public subpackage not listed comes after them, by name.
API_ORDER = ["models", "optim", "training", "state", "hoisting", "int8", "nn", "sharding"]
API_SKIP = {"cli"}  # the command line is documented by `shapeml --help`


def front(boost: float) -> str:  # a page's rank in Material's search (guide and API 2, else 1)
    return f"---\nsearch:\n  boost: {boost}\n---\n\n"


def public_packages() -> list[str]:
    """`shapeml` and its public subpackages, in `API_ORDER`, then by name."""
    import shapeml

    found = [m.name for m in pkgutil.iter_modules(shapeml.__path__) if not m.name.startswith("_")]
    found = [n for n in found if n not in API_SKIP]
    order = [n for n in API_ORDER if n in found] + sorted(set(found) - set(API_ORDER))
    return ["shapeml", *(f"shapeml.{n}" for n in order)]


@functools.cache
def exported(package: str) -> dict[str, object]:
    """The names `package` exports (its `__all__`, else its public submodules) -> objects."""
    module = import_module(package)
    names = getattr(module, "__all__", None)
    if names is None:
        names = [m.name for m in pkgutil.iter_modules(module.__path__) if m.name[0] != "_"]
    get = lambda n: getattr(module, n) if hasattr(module, n) else import_module(f"{package}.{n}")
    return {name: get(name) for name in names}  # importing the submodules it does not import


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
    subs = public_packages()[1:]
    return text + "\n## Subpackages\n\n" + "".join(f"- [`{s}`][{s}]\n" for s in subs)


# A notebook's links to repository files, as links to their pages from its own (`tutorials/NN/`).
NOTEBOOK_LINKS = {
    r"\]\(solutions/(\w+)\.py\)": r"](../solutions/\1/)",
    r"\]\(\.\./docs/(\w+)\.md(#[^)]*)?\)": r"](../../\1/\2)",
    r"\]\(\.\./examples/(\w+)\.py\)": r"](../../examples/\1/)",
    r"\]\((?:\.\./tutorials/)?(\d\d_\w+)\.ipynb(#[^)]*)?\)": r"](../\1/\2)",
}


def executed_elsewhere() -> dict[str, Path]:
    """The notebooks already executed for this build (`SHAPEML_DOCS_NOTEBOOKS`, a folder of
    `NN_name.ipynb` with outputs: the test suite's run of them), by name: shown as they are."""
    folder = os.environ.get("SHAPEML_DOCS_NOTEBOOKS")
    return {p.stem: p for p in sorted(Path(folder).glob("*.ipynb"))} if folder else {}


def notebook(path: Path) -> str:
    """`path`'s JSON (or its executed copy's, `executed_elsewhere`) with its Markdown cells' links
    to repository files pointing at their pages."""
    path = executed_elsewhere().get(path.stem, path)
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            cell["source"] = "".join(cell["source"])  # nbformat: a list of lines or one string
            for link, page in NOTEBOOK_LINKS.items():
                cell["source"] = re.sub(link, page, cell["source"])
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

    def write(src: str, text: str) -> None:
        with mkdocs_gen_files.open(src, "w") as f:
            f.write(text)

    nav = mkdocs_gen_files.Nav()
    for package in public_packages():
        write(api_src(package), api_page(package))
        nav[package] = posixpath.basename(api_src(package))
    write("api/SUMMARY.txt", "".join(nav.build_literate_nav()))
    for path in ROOT.glob("tutorials/*.ipynb"):
        write(f"tutorials/{path.name}", notebook(path))
    for path in [*ROOT.glob("tutorials/solutions/*.py"), *ROOT.glob("examples/*.py")]:
        write(path.relative_to(ROOT).with_suffix(".md").as_posix(), script_page(path))


if __name__ == "<run_path>":  # run by mkdocs-gen-files; scripts/docs_hooks.py imports the rest
    main()
