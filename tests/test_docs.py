"""The user guide: the error-code page is generated from the registry `shapeml explain` reads, and
every public name of shapeml is taught in at least one tutorial or docs page."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

import shapeml
from shapeml._errors import errors_markdown

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
TUTORIALS = ROOT / "tutorials"
REGENERATE = "regenerate it: shapeml explain --markdown > docs/errors.md"

# Every public module (no `_` in its dotted path), so the error registry is complete.
PUBLIC_MODULES = sorted(
    name
    for _, name, _ in pkgutil.walk_packages(shapeml.__path__, "shapeml.")
    if not any(part.startswith("_") for part in name.split("."))
)
GUIDE_PAGES = [
    "index.md",
    "architecture.md",
    "models.md",
    "gradients_and_optim.md",
    "training.md",
    "nn.md",
    "scaling.md",
    "state.md",
    "hoisting.md",
    "int8.md",
    "gpt2.md",
    "llama.md",
    "testing.md",
    "performance.md",
    "errors.md",
]


def _import_public_modules() -> list:
    return [importlib.import_module(name) for name in PUBLIC_MODULES]


def _top_level_names() -> list[str]:
    """`shapeml.__all__` when defined, else the public names `shapeml/__init__.py` re-exports."""
    if hasattr(shapeml, "__all__"):
        return list(shapeml.__all__)
    tree = ast.parse(Path(shapeml.__file__).read_text())
    names = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names += [a.asname or a.name for a in node.names]
    return [n for n in names if not n.startswith("_")]


def _public_names() -> dict[str, list[str]]:
    names = {"shapeml": _top_level_names()}
    for module in _import_public_modules():
        if hasattr(module, "__all__") and module.__name__ != "shapeml.cli":
            names[module.__name__] = list(module.__all__)
    return names


def _guide_text() -> str:
    parts = [p.read_text(encoding="utf-8") for p in sorted(DOCS.glob("*.md"))]
    for path in sorted(TUTORIALS.glob("*.ipynb")):
        parts += [c.source for c in nbformat.read(path, as_version=4).cells]
    return "\n".join(parts)


def test_guide_pages_exist_and_the_index_links_them_and_the_tutorials_in_order():
    for page in GUIDE_PAGES:
        assert (DOCS / page).is_file(), f"docs/{page} is missing"
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(\.\./tutorials/(\d\d_\w+\.ipynb)\)", index)
    assert links == sorted(p.name for p in TUTORIALS.glob("*.ipynb")), links
    for page in GUIDE_PAGES[1:]:
        assert f"]({page})" in index, f"docs/index.md does not link {page}"


def test_errors_page_is_generated_from_the_registry():
    _import_public_modules()
    assert (DOCS / "errors.md").read_text(encoding="utf-8") == errors_markdown(), REGENERATE


def test_shapeml_explain_knows_every_code_of_the_library():
    # A fresh process, as a user runs it: every error class of every public module must be
    # registered there too, or `shapeml explain CODE` cannot explain an error a user just got.
    _import_public_modules()
    run = subprocess.run(
        [sys.executable, "-m", "shapeml.cli", "explain", "--markdown"],
        capture_output=True,
        text=True,
        check=True,
    )
    fresh = set(re.findall(r"^## ([EW]\d{4}):", run.stdout, flags=re.M))
    every = set(re.findall(r"^## ([EW]\d{4}):", errors_markdown(), flags=re.M))
    assert every - fresh == set(), (
        "`shapeml explain` does not know these codes (import their modules)"
    )


# The command line and its demo jobs (`shapeml.apps`) are programs, documented by `--help`.
LIBRARY_MODULES = [
    m for m in PUBLIC_MODULES if m != "shapeml.cli" and not m.startswith("shapeml.apps")
]


@pytest.mark.parametrize("module", ["shapeml", *LIBRARY_MODULES])
def test_every_public_name_is_in_a_tutorial_or_guide_page(module):
    names = _public_names().get(module, [])
    text = _guide_text()
    missing = [n for n in names if not re.search(rf"(?<!\w){re.escape(n)}(?!\w)", text)]
    assert not missing, f"{module}: not mentioned in docs/ or tutorials/: {missing}"
