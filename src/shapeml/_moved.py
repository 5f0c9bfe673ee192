"""Names that moved out of the core to the zoo or the apps, still working under their old names.

The core never imports what is built on it, not even for an alias. So the aliases live here, on
the top floor: the root package imports this module last (it imports everything anyway), and it
attaches each old name to its old home without the old home importing anything: a module
`__getattr__` (PEP 562) for a moved attribute, an import finder for a moved module. Each use warns
(`DeprecationWarning`) and names the new home.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
import warnings

__all__ = ["install"]


def _int8_sort():
    from .apps.int8_sort import shipped

    return shipped


def _spotter_job():
    from .apps import spotter_job

    return spotter_job


def _zoo(name: str):
    from .zoo import mixer, spotter, transformer

    return {"spotter": spotter, "mixer": mixer, "transformer": transformer}[name]


# old home -> {name: (where it lives now, as text; the module holding it)}
_ATTRIBUTES = {
    "shapeml.int8": {
        n: ("shapeml.apps.int8_sort", _int8_sort)
        for n in ("TINY_FLOAT_PATH", "TINY_MODEL_PATH", "tiny_model")
    },
    "shapeml.training": {
        n: ("shapeml.apps.spotter_job", _spotter_job) for n in ("train_spotter", "evaluate_spotter")
    },
}
_MODULES = {f"shapeml.models.{n}": n for n in ("spotter", "mixer", "transformer")}


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} is deprecated: use {new}", DeprecationWarning, stacklevel=3)


def _getattr_for(home: types.ModuleType, moved: dict):
    def __getattr__(name: str):  # noqa: N807 - the module hook PEP 562 looks for
        if name not in moved:
            raise AttributeError(f"module {home.__name__!r} has no attribute {name!r}")
        new, module = moved[name]
        _warn(f"{home.__name__}.{name}", f"{new}.{name}")
        return getattr(module(), name)

    return __getattr__


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a moved module's old name as the new module itself (the same object)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        name = _MODULES[spec.name]
        _warn(spec.name, f"shapeml.zoo.{name}")
        module = _zoo(name)
        sys.modules[spec.name] = module
        return module

    def exec_module(self, module):
        pass  # already executed under its new name


def install() -> None:
    """Attaches every moved name to its old home (once)."""
    for home, moved in _ATTRIBUTES.items():
        module = sys.modules[home]
        module.__getattr__ = _getattr_for(module, moved)  # type: ignore[method-assign]
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())
