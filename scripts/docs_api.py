"""The API reference pages of the shapeml site, generated from `__all__` (scripts/mkdocs_hooks.py
adds them to the build; mkdocstrings renders each name from its docstring).

One page per public subpackage (`api/optim.md`; `api/index.md` for `shapeml` itself): one
mkdocstrings block per module listing the names in its `__all__`, a submodule in `__all__`
(`shapeml.data.shapes`) in its own section. A name exported from several public packages
(`sm.Model` is `shapeml.models.Model`) is documented once, at its home, and linked from the others.
A new subpackage (`shapeml.nn`, `shapeml.sharding`) gets its page by itself; `API_ORDER` only sets
the order of the pages.
"""

from __future__ import annotations

import importlib
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


def _directive(path: str, members: list[str], heading_level: int = 2) -> str:
    listed = "".join(f"\n        - {name}" for name in members)
    return (
        f"::: {path}\n    options:\n      heading_level: {heading_level}\n"
        f"      members:{listed or ' []'}\n"
    )


def _summary(module: types.ModuleType) -> str:
    doc = (module.__doc__ or "").strip()
    return " ".join(doc.split("\n\n", 1)[0].split())


def _api_page(package: str, entries: dict[str, tuple[str, str]]) -> str:
    """The Markdown of `package`'s API page: one mkdocstrings block per module."""
    module = importlib.import_module(package)
    names = exported(module)
    submodules = [n for n in names if isinstance(_member(module, n), types.ModuleType)]
    here = [
        n for n in names if n not in submodules and entries[f"{package}.{n}"][0] == api_src(package)
    ]
    lines = [f"# `{package}`\n", _directive(package, here)]
    elsewhere = [n for n in names if n not in submodules and n not in here]
    if elsewhere:
        lines.append("\n## Names documented with their subpackage\n")
        lines.append("| name | documented in |\n| --- | --- |")
        for n in sorted(elsewhere, key=str.lower):
            page, anchor = entries[f"{package}.{n}"]
            home = anchor.rsplit(".", 1)[0]
            rel = posixpath.relpath(page, posixpath.dirname(api_src(package)))
            lines.append(f"| [`{package}.{n}`][{anchor}] | [`{home}`]({rel}) |")
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
        lines.append(_directive(sub.__name__, exported(sub), heading_level=3))
    return "\n".join(lines) + "\n"


def api_pages() -> dict[str, str]:
    """Site source (`api/optim.md`) -> its Markdown, for every public package."""
    entries = api_entries()
    return {api_src(p): _api_page(p, entries) for p in public_packages()}
