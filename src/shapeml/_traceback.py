"""Short tracebacks for shapeml's errors: the public entry points are API boundaries, as JAX's are.

A shapeml error's message names what was wrong and says the fix, so its traceback needs only the
user's frames. Every public function and class is decorated with `api_boundary` (the pattern of
`jax._src.traceback_util.api_boundary`): when a `ShapemlError` leaves the outermost boundary, its
`__traceback__` is rebuilt without the frames of shapeml and of the libraries between the user's
call and the raise (the checker frames `@sm.shaped` adds, equinox's, JAX's, optax's, ...), and the
exceptions chained inside them are cut off. The user's frames stay, their callbacks (a loss
shapeml calls) included. Scripts, IPython, Jupyter and pytest then all show the short form, with
no process hook: the exception itself is short. Until an error passes, a boundary costs one
Python call (a `try` block is free in Python 3.11); nested boundaries leave the work to the
outermost one.

`SHAPEML_TRACEBACK_FILTERING=off`, read when an error passes a boundary, leaves every frame and
every chained exception in place.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import sysconfig
import types
from pathlib import Path
from typing import TypeVar

import equinox as eqx
import jax

__all__ = [
    "ENV", "api_boundary", "filtering", "is_boundary", "user_stacklevel", "user_traceback",
]  # fmt: skip

T = TypeVar("T")

ENV = "SHAPEML_TRACEBACK_FILTERING"
_OFF = ("off", "0", "false", "no", "all")
# The libraries whose frames can sit between a user's call into shapeml and shapeml's raise.
_LIBRARIES = (
    "beartype", "jaxtyping", "equinox", "jax", "jaxlib", "optax", "safetensors", "numpy",
    "ml_dtypes", "orbax",
)  # fmt: skip
# Frames of code that no file holds, which are never the user's: beartype's checking wrappers and
# the import system's frozen modules. (`<string>` and `<stdin>` can be the user's, so they stay.)
_GENERATED = ("<@beartype(", "<frozen ")
_CALL = "api_boundary_call"  # the name of every boundary's frame (see `_outermost`)
# Methods of a class that are entry points besides its public ones (`m.W`, `m.w = x`, `step(...)`).
_DUNDERS = frozenset(
    {"__init__", "__call__", "__getattr__", "__setattr__", "__delattr__", "__getitem__",
     "__setitem__", "__enter__", "__exit__", "__class_getitem__", "__add__", "__radd__",
     "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__", "__neg__"}
)  # fmt: skip
# The note a JAX API boundary inside shapeml's adds (JAX's `quiet_remove_frames` mode): it would
# point at JAX's switch, while the frames it speaks of are gone by shapeml's.
_JAX_NOTE = "For simplicity, JAX has removed its internal frames"


def filtering() -> bool:
    """Whether shapeml's errors show only the user's frames (`SHAPEML_TRACEBACK_FILTERING`)."""
    return os.environ.get(ENV, "").strip().lower() not in _OFF


def api_boundary(obj: T) -> T:
    """Makes a public function, or every public method of a class, an API boundary.

    On a function: a wrapper that calls it and, when a `ShapemlError` leaves the outermost
    boundary, rebuilds the error's traceback from the user's frames (`user_traceback`) and
    re-raises it with a bare `raise`, which adds no frame of its own. On a class: each method,
    class method, static method and property defined in its body whose name is public (or
    `__init__`, `__call__`, `__getattr__`, `__setattr__`, ...), replaced by its boundary in place;
    subclasses inherit them. Applying it twice changes nothing.
    """
    if isinstance(obj, type):
        module = issubclass(obj, eqx.Module)
        for name, member in list(vars(obj).items()):
            if name.startswith("_") and name not in _DUNDERS:
                continue
            wrapped = _member(member)
            if module and not name.startswith("_") and isinstance(wrapped, types.FunctionType):
                wrapped = _ModuleMethod(wrapped)
            if wrapped is not member:
                setattr(obj, name, wrapped)
        return obj
    if is_boundary(obj) or not callable(obj):
        return obj
    fn = obj

    if inspect.isgeneratorfunction(fn):  # its body runs as it is iterated

        @functools.wraps(fn)
        def api_boundary_call(*args, **kwargs):
            try:
                return (yield from fn(*args, **kwargs))
            except Exception as e:
                _leaving(e)
                raise

    else:

        @functools.wraps(fn)
        def api_boundary_call(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                _leaving(e)
                raise  # bare: the traceback set in `_leaving`, and no entry for this frame

    api_boundary_call.__shapeml_boundary__ = True
    return api_boundary_call  # type: ignore[return-value]


def is_boundary(obj) -> bool:
    """Whether `obj` is a function `api_boundary` made (a method's boundary included)."""
    return getattr(obj, "__shapeml_boundary__", False) is True


class _ModuleMethod:
    """A public method of an equinox module, bound as a `jax.tree_util.Partial`.

    Equinox binds `m.method` to a pytree whose `__call__` is a Python frame of its own, above the
    boundary, so it would stay in every traceback; a `Partial` is a pytree too (`jax.jit` and
    `eqx.filter_jit` take `m.method` as before), and its call adds no Python frame.
    """

    def __init__(self, fn):
        self.__func__ = fn
        functools.update_wrapper(self, fn)  # name, docs and the boundary's mark

    def __get__(self, obj, cls=None):
        if obj is None:
            return self.__func__
        bound = jax.tree_util.Partial(self.__func__, obj)
        bound.__doc__ = self.__doc__  # `help(m.method)` shows the method's documentation
        return bound


def _member(member):
    """A class body's `member` as a boundary: functions and the functions inside a class method,
    a static method or a property; anything else (a constant, a nested class) as it is."""
    if isinstance(member, (staticmethod, classmethod)):  # around a function or a cached one
        fn = api_boundary(member.__func__)
        return member if fn is member.__func__ else type(member)(fn)
    inner = getattr(member, "__func__", None)
    if isinstance(inner, types.FunctionType) and not isinstance(member, types.MethodType):
        member.__func__ = api_boundary(inner)  # a binding descriptor of shapeml's own
        return member
    if isinstance(member, property):
        parts = [_member(f) if f is not None else None for f in (member.fget, member.fset)]
        if parts == [member.fget, member.fset]:
            return member
        return property(*parts, member.fdel, member.__doc__)
    if isinstance(member, types.FunctionType) and not _generated(member):
        return api_boundary(member)
    return member


def _generated(fn) -> bool:
    """Whether `fn` is code no file holds: a dataclass's generated `__init__` or `__setattr__`."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    return code is None or code.co_filename.startswith("<")


def _leaving(e: Exception) -> None:
    """At a boundary's `except`: a shapeml error leaving the outermost boundary keeps the user's
    frames only, and loses the exceptions chained inside shapeml and the libraries below it.
    (`ShapemlError` marks itself `__shapeml_error__`: `_errors` is built on this file.)"""
    if not getattr(type(e), "__shapeml_error__", False) or not filtering():
        return
    if not _outermost():
        return  # the outermost boundary filters, once, what every boundary below it added
    e.with_traceback(user_traceback(e.__traceback__))
    _cut_internal_chain(e)
    notes = getattr(e, "__notes__", None)
    if isinstance(notes, list):
        notes[:] = [n for n in notes if not (isinstance(n, str) and _JAX_NOTE in n)]
        if not notes:
            del e.__notes__


def _outermost() -> bool:
    """Whether one boundary's frame only is on the stack: the one an error is leaving."""
    here, seen = _leaving.__code__.co_filename, 0
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        seen += code.co_name == _CALL and code.co_filename == here
        if seen > 1:
            return False
        frame = frame.f_back
    return True


def user_traceback(tb: types.TracebackType | None) -> types.TracebackType | None:
    """`tb` without the frames of shapeml, of the libraries it is built on and of Python's own
    modules: the user's frames, in order (None when there is none)."""
    kept = []
    while tb is not None:
        if not _hidden(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    out = None
    for entry in reversed(kept):
        out = types.TracebackType(out, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return out


def user_stacklevel() -> int:
    """The `stacklevel` that makes a warning raised by the caller point at the user's line: the
    first frame outward that is not shapeml's, a library's it is built on or Python's own (the
    frames `user_traceback` removes), so a warning names the script's line or the notebook's cell
    whichever JAX transformations and shapeml calls lie between. (Python 3.12's
    `skip_file_prefixes` does the same by folder.)"""
    frame = sys._getframe(1)
    while frame is not None and _checker(frame.f_code.co_filename):
        frame = frame.f_back  # a type checker's wrapper around this function (a test's hook)
    level, frame = 2, frame and frame.f_back  # 1: the caller, which calls `warnings.warn`
    while frame is not None and _hidden(frame.f_code.co_filename):
        level, frame = level + 1, frame.f_back
    return level if frame is not None else 1


def _checker(filename: str) -> bool:
    checkers = (sys.modules.get(n) for n in ("jaxtyping", "beartype"))
    folders = [os.path.realpath(f) for m in checkers for f in getattr(m, "__path__", ())]
    return filename.startswith(_GENERATED) or any(_inside(filename, f) for f in folders)


def _cut_internal_chain(e: BaseException) -> None:
    """Cuts the chain of `e` at the first exception raised and handled inside shapeml and the
    libraries below it (a beartype violation a shape check turned into E1001); an exception of
    the user's code on the way (their callback's) stays, with its user frames only."""
    seen = {id(e)}
    while True:
        linked = e.__cause__ if e.__cause__ is not None else e.__context__
        if linked is None or (e.__cause__ is None and e.__suppress_context__) or id(linked) in seen:
            return
        seen.add(id(linked))
        tb = user_traceback(linked.__traceback__)
        if tb is None:
            e.__cause__ = None
            e.__suppress_context__ = True
            return
        linked.with_traceback(tb)
        e = linked


@functools.lru_cache(maxsize=4096)
def _hidden(filename: str) -> bool:
    """Whether code of `filename` is not the user's: shapeml's, a library's, Python's own."""
    if filename.startswith(_GENERATED):
        return True
    if filename.startswith("<"):
        return False
    path = os.path.realpath(filename)
    stdlib, sites = _python_folders()
    if not any(_inside(path, site) for site in sites) and any(_inside(path, s) for s in stdlib):
        return True
    return any(_inside(path, root) for root in _roots())


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + os.sep)


def _roots() -> list[str]:
    """shapeml's folder and the imported libraries' (a library counts once it is imported)."""
    roots = [os.path.realpath(Path(__file__).parent)]
    for name in _LIBRARIES:
        module = sys.modules.get(name)
        for folder in getattr(module, "__path__", None) or ():  # namespace packages included
            roots.append(os.path.realpath(folder))
    return roots


@functools.cache
def _python_folders() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Python's standard library, and the `site-packages` folders (which may lie inside it)."""
    paths = sysconfig.get_paths()
    real = lambda *keys: tuple({os.path.realpath(paths[k]) for k in keys})  # noqa: E731
    return real("stdlib", "platstdlib"), real("purelib", "platlib")
