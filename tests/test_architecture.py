"""The shape of the code base: no import cycles, the core never imports what is built on it, every
module that declares error codes is in the one list, every
module says what it is for, and the package root stays small."""

import ast
import re
from pathlib import Path

import pytest

import shapeml as sm
from shapeml._errors import CODE_MODULES

SRC = Path(sm.__file__).parent
ROOT = "shapeml"
# Built on the core, never imported by it.
LAYERS_ON_TOP = ("shapeml.zoo", "shapeml.apps", "shapeml.cli")
# The package root holds the public API and the few modules everything shares; every other
# concept has its folder (`_io/`, `_step/`, `_shaped/`, `models/`, `state/`, ...).
MAX_ROOT_MODULES = 12


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _resolve(current: str, node: ast.ImportFrom) -> list[str]:
    if node.level:
        base = current.split(".")
        if not _is_package(current):
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    names = [f"{target}.{a.name}" for a in node.names]
    return [n for n in names if n in MODULES] or [target]


def _imports(name: str) -> set[str]:
    """Every shapeml module `name` imports (at module level or in a function), with the packages
    each import initialises on the way (`a.b.c` imports `a.b` first)."""
    tree = ast.parse(MODULES[name].read_text())
    targets: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            targets += _resolve(name, node)
        elif isinstance(node, ast.Import):
            targets += [a.name for a in node.names]
    # A module's own packages are initialised before it: importing a sibling adds no edge to them.
    ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    out = set()
    for t in targets:
        parts = t.split(".")
        for i in range(2, len(parts) + 1):  # the root package imports everything: leave it out
            prefix = ".".join(parts[:i])
            if prefix in MODULES and prefix != name and prefix not in ancestors:
                out.add(prefix)
    return out


GRAPH = {name: _imports(name) for name in MODULES}


def test_the_import_graph_has_no_cycles():
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(n: str):
        state[n] = 1
        path.append(n)
        for m in sorted(GRAPH[n]):
            if state.get(m) == 1:
                cycle = path[path.index(m) :] + [m]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if m not in state:
                visit(m)
        path.pop()
        state[n] = 2

    for n in sorted(GRAPH):
        if n not in state:
            visit(n)


def _is_core(name: str) -> bool:
    on_top = any(name == p or name.startswith(p + ".") for p in LAYERS_ON_TOP)
    return name != ROOT and not on_top


@pytest.mark.parametrize("name", sorted(n for n in MODULES if _is_core(n)))
def test_the_core_never_imports_the_zoo_or_the_apps(name):
    above = sorted(
        m for m in GRAPH[name] if any(m == p or m.startswith(p + ".") for p in LAYERS_ON_TOP)
    )
    assert not above, f"{name} imports {above}, which are built on the core"


def test_every_module_that_declares_codes_is_listed():
    declaring = sorted(
        name for name, path in MODULES.items() if re.search(r'code="[EW]\d{4}"', path.read_text())
    )
    assert sorted(CODE_MODULES) == declaring


def test_every_code_is_known_to_explain_in_a_fresh_process():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", "import shapeml as sm; print(len(sm._errors.registry()))"],
        capture_output=True,
        text=True,
        check=True,
    )
    codes = set()
    for name in CODE_MODULES:
        codes |= set(re.findall(r'code="([EW]\d{4})"', MODULES[name].read_text()))
    assert int(out.stdout) == len(codes)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_says_what_it_is_for(name):
    """One concept per file, whatever its length: its docstring names it."""
    doc = ast.get_docstring(ast.parse(MODULES[name].read_text()))
    assert doc and len(doc.split()) >= 4, f"{MODULES[name]} has no docstring saying what it is for"


def test_the_package_root_holds_at_most_a_dozen_modules():
    root = sorted(p.name for p in SRC.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, f"{len(root)} modules in the package root: {root}"
