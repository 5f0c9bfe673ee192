"""The API reference pages of the shapeml site, generated from `__all__` (scripts/mkdocs_hooks.py
adds them to the build; mkdocstrings renders each name from its docstring).

One page per public subpackage (`api/optim.md`; `api/index.md` for `shapeml` itself): the package's
docstring, then its names grouped by theme (as optax groups its API), each theme a section with a
summary table (name, first sentence of its docstring) followed by the names' entries; a submodule
in `__all__` (`shapeml.data.shapes`) gets a section of its own. A name exported from several public
packages (`sm.Model` is `shapeml.models.Model`) is documented once, at its home, and the other
pages' tables link to it. A theme is the one `THEMES` gives the module that defines the name (a
module not listed there is a theme of its own, named after it); errors and warnings, and
constants, are themes of their own. A new subpackage (`shapeml.nn`, `shapeml.sharding`) gets its
page by itself; `API_ORDER` only sets the order of the pages.

The summary cells are filled in from the rendered entries (`summary_cell`, filled by
scripts/docs_xref.py), so a table says what the entry says.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import posixpath
import types

# The order of the API pages (guide order); public subpackages not listed here come after them.
API_ORDER = [
    "shapeml",
    "shapeml.models",
    "shapeml.optim",
    "shapeml.training",
    "shapeml.state",
    "shapeml.hoisting",
    "shapeml.int8",
    "shapeml.nn",
    "shapeml.sharding",
    "shapeml.data",
    "shapeml.testing",
    "shapeml.zoo",
    "shapeml.apps",
]
# Public modules that are not a library API: the command line has its own help (`shapeml --help`).
API_SKIP = {"shapeml.cli"}


def public_packages() -> list[str]:
    """`shapeml` and its public subpackages and modules, in `API_ORDER` then by name."""
    import shapeml

    found = {"shapeml"} | {
        f"shapeml.{m.name}"
        for m in pkgutil.iter_modules(shapeml.__path__)
        if not m.name.startswith("_") and f"shapeml.{m.name}" not in API_SKIP
    }
    ordered = [name for name in API_ORDER if name in found]
    return ordered + sorted(found - set(ordered))


def exported(module: types.ModuleType) -> list[str]:
    """The module's `__all__`; without one, a package's public submodules, or the public names a
    module defines itself."""
    if hasattr(module, "__all__"):
        return list(module.__all__)
    if hasattr(module, "__path__"):
        return [m.name for m in pkgutil.iter_modules(module.__path__) if not m.name.startswith("_")]
    return [
        name
        for name, obj in vars(module).items()
        if not name.startswith("_") and getattr(obj, "__module__", None) == module.__name__
    ]


def _member(module: types.ModuleType, name: str) -> object:
    """`module.name`, importing it when it is a submodule the package does not import itself."""
    if hasattr(module, name):
        return getattr(module, name)
    return importlib.import_module(f"{module.__name__}.{name}")


def api_src(package: str) -> str:
    """The site source of `package`'s API page."""
    return "api/index.md" if package == "shapeml" else f"api/{package.removeprefix('shapeml.')}.md"


def api_entries() -> dict[str, tuple[str, str]]:
    """Every exported name (`shapeml.optim.adamw`) -> (its API page, the anchor documenting it).

    A top-level name re-exported from a public subpackage (`sm.Model` is `shapeml.models.Model`)
    is documented once, on the subpackage's page; a submodule in `__all__` (`shapeml.data.shapes`)
    has its names documented on its package's page.
    """
    entries = {}
    packages = public_packages()
    for package in reversed(packages):  # subpackages first: the top level links to them
        module = importlib.import_module(package)
        for name in exported(module):
            obj = _member(module, name)
            if isinstance(obj, types.ModuleType):
                for sub in exported(obj):  # unless documented on its own page already
                    qualified = f"{obj.__name__}.{sub}"
                    if not isinstance(_member(obj, sub), types.ModuleType):
                        entries.setdefault(qualified, (api_src(package), qualified))
                continue
            entries[f"{package}.{name}"] = _home(name, obj, packages[1:]) or (
                api_src(package),
                f"{package}.{name}",
            )
    return entries


def _home(name: str, obj: object, packages: list[str]) -> tuple[str, str] | None:
    """Where a top-level name re-exported from a public subpackage is documented."""
    for package in packages:
        module = importlib.import_module(package)
        if name in getattr(module, "__all__", ()) and getattr(module, name) is obj:
            return api_src(package), f"{package}.{name}"
    return None


# The theme of each name, by the module that defines it; the order of the themes on a page.
THEMES = {
    "shapeml.models._model": "Models and dims",
    "shapeml.models._dims": "Models and dims",
    "shapeml.models._fields": "Fields",
    "shapeml.models._initializers": "Initializers",
    "shapeml.models._introspect": "Introspection",
    "shapeml.models._checkpoint": "Saving and loading",
    "shapeml.models._load": "Saving and loading",
    "shapeml.models._partial": "Saving and loading",
    "shapeml.sharding._load": "Saving and loading",
    "shapeml._grad": "Gradients",
    "shapeml._shaped": "Shape checks",
    "shapeml._errors": "Errors and explanations",
    "shapeml.optim._aliases": "Optimizers",
    "shapeml.optim._from_optax": "Optimizers",
    "shapeml.optim._optimizer": "Optimizers",
    "shapeml.optim._transforms": "Transforms and masks",
    "shapeml.optim._masks": "Transforms and masks",
    "shapeml.optim._schedules": "Schedules",
    "shapeml.optim._checkpoint": "Optimizer checkpoints",
    "shapeml.training._step": "The compiled step",
    "shapeml.training._loop": "The training loop",
    "shapeml.state._graph": "Graphs",
    "shapeml.state._decl": "Graphs",
    "shapeml.state._handles": "Graphs",
    "shapeml._kvcache": "KV cache",
    "shapeml._index": "Index checks",
    "shapeml.hoisting._hoist": "Hoisting",
    "shapeml.hoisting._report": "Hoisting",
    "shapeml.hoisting._split": "Hoisting",
    "shapeml.hoisting._bake": "Baking",
    "shapeml.hoisting._export": "Export",
    "shapeml.hoisting._load": "Export",
    "shapeml.int8._model": "The model",
    "shapeml.int8._tokenizer": "The model",
    "shapeml.int8._numerics": "Numerics",
    "shapeml.int8._decode": "Decoding",
    "shapeml.int8._reference": "Decoding",
    "shapeml.int8._tp": "Tensor parallel",
    "shapeml.nn._linear": "Layers",
    "shapeml.nn._embedding": "Layers",
    "shapeml.nn._mlp": "Layers",
    "shapeml.nn._attention": "Layers",
    "shapeml.nn._conv": "Layers",
    "shapeml.nn._pool": "Layers",
    "shapeml.nn._dropout": "Layers",
    "shapeml.nn._norms": "Normalization",
    "shapeml.nn._batchnorm": "Normalization",
    "shapeml.nn._layer": "Building blocks",
    "shapeml.nn._init": "Building blocks",
    "shapeml.sharding._place": "Placement",
    "shapeml.sharding._rules": "Placement",
    "shapeml.sharding._mesh": "Meshes and rule tables",
    "shapeml.sharding._memory": "Memory",
    "shapeml.data._batches": "Batches",
    "shapeml.testing._contract": "Shape contracts",
}
ERRORS = "Errors and warnings"
CONSTANTS = "Constants"


def theme(obj: object) -> str:
    """The theme `obj` is listed under on its API page."""
    if isinstance(obj, type) and issubclass(obj, (BaseException, Warning)):
        return ERRORS
    if not (isinstance(obj, type) or inspect.isroutine(obj) or callable(obj)):
        return CONSTANTS
    module = getattr(obj, "__module__", None) or ""
    if module in THEMES:
        return THEMES[module]
    words = module.rsplit(".", 1)[-1].strip("_").replace("_", " ")
    return words[:1].upper() + words[1:] if words else "Other"


def _theme_order(title: str) -> tuple[int, int]:
    order = list(dict.fromkeys(THEMES.values()))
    if title in (CONSTANTS, ERRORS):  # after the themes: constants, then errors and warnings
        return (2, title == ERRORS)
    return (0, order.index(title)) if title in order else (1, 0)


def summary_cell(anchor: str) -> str:
    """A table cell that scripts/docs_xref.py fills with the first sentence of `anchor`'s entry."""
    return f'<span class="api-summary" data-anchor="{anchor}"></span>'


def _entry(path: str, heading_level: int) -> str:
    return (
        f"::: {path}\n    options:\n      show_root_heading: true\n"
        f"      show_root_toc_entry: true\n      heading_level: {heading_level}\n"
    )


def _summary(module: types.ModuleType) -> str:
    doc = (module.__doc__ or "").strip()
    return " ".join(doc.split("\n\n", 1)[0].split())


def _themed(module: types.ModuleType, names: list[str], page: str, entries, level: int) -> list:
    """The sections of `names` (of `module`, shown on `page`): per theme a table and the entries."""
    groups: dict[str, list[str]] = {}
    for name in sorted(names, key=lambda n: (not n[:1].isupper(), n.lower())):  # classes first
        groups.setdefault(theme(_member(module, name)), []).append(name)
    lines = []
    for title in sorted(groups, key=_theme_order):
        lines.append(f"\n{'#' * level} {title}\n")
        lines.append("| name | summary |\n| --- | --- |")
        here = []
        for name in groups[title]:
            src, anchor = entries[f"{module.__name__}.{name}"]
            lines.append(f"| [`{name}`][{anchor}] | {summary_cell(anchor)} |")
            if src == page and anchor == f"{module.__name__}.{name}":
                here.append(anchor)
        lines.append("")
        lines += [_entry(anchor, level + 1) for anchor in here]
    return lines


def _api_page(package: str, entries: dict[str, tuple[str, str]]) -> str:
    """The Markdown of `package`'s API page: its docstring, then its names by theme."""
    module = importlib.import_module(package)
    names = exported(module)
    submodules = [n for n in names if isinstance(_member(module, n), types.ModuleType)]
    page = api_src(package)
    lines = [f"# `{package}`\n", f"::: {package}\n    options:\n      members: []\n"]
    lines += _themed(module, [n for n in names if n not in submodules], page, entries, 2)
    if package == "shapeml":
        lines.append("\n## Subpackages\n")
        for other in public_packages()[1:]:
            rel = posixpath.relpath(api_src(other), "api")
            summary = _summary(importlib.import_module(other))
            lines.append(f"- [`{other}`]({rel}): {summary}")
        return "\n".join(lines) + "\n"
    for n in submodules:
        sub = _member(module, n)
        lines.append(f"\n## `{sub.__name__}`\n")
        lines.append(f"::: {sub.__name__}\n    options:\n      members: []\n")
        names = [x for x in exported(sub) if not isinstance(_member(sub, x), types.ModuleType)]
        lines += _themed(sub, names, page, entries, 3)
    return "\n".join(lines) + "\n"


def api_pages() -> dict[str, str]:
    """Site source (`api/optim.md`) -> its Markdown, for every public package."""
    entries = api_entries()
    return {api_src(p): _api_page(p, entries) for p in public_packages()}
