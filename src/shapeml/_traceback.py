"""Short tracebacks for shapeml's errors: the user's frames and the coded message, nothing else.

A shapeml error's message names what was wrong and says the fix, so its traceback needs only the
frames of the user's code: shapeml's own frames, those of the libraries it is built on (the
checker frames `@sm.shaped` adds, equinox's, JAX's) and the exceptions chained inside shapeml are
left out, as JAX leaves out its own (`jax._src.traceback_util`). This happens where a traceback is
shown: an uncaught error in a script (`sys.excepthook`, which shapeml wraps on import and which
passes every other exception on unchanged) and a notebook or IPython cell (the error's
`_render_traceback_`, IPython's hook for an exception's own display). The exception object itself
is never changed.

`SHAPEML_TRACEBACK_FILTERING=off` (read each time a traceback is shown) shows everything: every
frame and every chained exception, as Python and IPython print them.
"""

from __future__ import annotations

import os
import sys
import traceback
import types
from collections.abc import Callable
from pathlib import Path

__all__ = ["ENV", "filtering", "install_excepthook", "ipython_lines", "user_traceback"]

ENV = "SHAPEML_TRACEBACK_FILTERING"
_OFF = ("off", "0", "false", "no", "all")
# shapeml and the libraries whose frames sit between a user's call and shapeml's raise.
_BELOW = ("beartype", "jaxtyping", "equinox", "jax", "jaxlib", "optax", "safetensors")
_SHAPEML = str(Path(__file__).resolve().parent)


def filtering() -> bool:
    """Whether shapeml's errors show only the user's frames (`SHAPEML_TRACEBACK_FILTERING`)."""
    return os.environ.get(ENV, "").strip().lower() not in _OFF


def _roots(extra: tuple[str, ...]) -> tuple[str, ...]:
    """The folders whose frames are not the user's: shapeml's and each loaded library's."""
    roots = [_SHAPEML]
    for name in (*_BELOW, *extra):
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if path:
            roots.append(str(Path(path).resolve().parent))
    return tuple(roots)


def _hidden(frame: types.FrameType, roots: tuple[str, ...]) -> bool:
    filename = frame.f_code.co_filename
    if filename.startswith("<@beartype("):  # the checking wrapper beartype generates
        return True
    if frame.f_locals.get("__tracebackhide__"):  # IPython's and pytest's mark (JAX sets it too)
        return True
    path = os.path.realpath(filename) if os.path.isabs(filename) else filename
    return any(path == r or path.startswith(r + os.sep) for r in roots)


def user_traceback(
    tb: types.TracebackType | None, extra: tuple[str, ...] = ()
) -> types.TracebackType | None:
    """`tb` without the frames of shapeml and the libraries below it (and of the packages named
    in `extra`); `tb` itself when no frame is left (then there is no user's frame to show)."""
    roots = _roots(extra)
    kept = []
    entry = tb
    while entry is not None:
        if not _hidden(entry.tb_frame, roots):
            kept.append(entry)
        entry = entry.tb_next
    if not kept:
        return tb
    out = None
    for entry in reversed(kept):
        out = types.TracebackType(out, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return out


def _exception_lines(e: BaseException) -> list[str]:
    """`Name: message` and the exception's notes, as Python prints them (without the module)."""
    lines = f"{type(e).__name__}: {e}".splitlines()
    notes = getattr(e, "__notes__", None)
    if isinstance(notes, (list, tuple)):
        lines += [line for note in notes for line in str(note).splitlines()]
    return lines


def ipython_lines(e: BaseException) -> list[str]:
    """What a notebook or IPython shows for shapeml error `e`: its user's frames, most recent
    last, a cell named as IPython names it (`Cell In[3], line 2`, never the kernel's temporary
    file), and the message."""
    tb = user_traceback(e.__traceback__, extra=("IPython", "ipykernel"))
    try:
        shell = sys.modules["IPython"].get_ipython()
        name_of = shell.compile.format_code_name
    except (KeyError, AttributeError):
        name_of = lambda filename: None  # noqa: E731 - not in IPython: plain file names
    lines = []  # no "Traceback" heading: a cell's error shows under the cell, the frames in order
    for frame in traceback.extract_tb(tb):
        cell = name_of(frame.filename)
        where = f"{cell[0]} {cell[1]}" if cell else f'File "{frame.filename}"'
        func = "" if frame.name == "<module>" else f", in {frame.name}"
        lines.append(f"  {where}, line {frame.lineno}{func}")
        if frame.line:
            lines.append(f"    {frame.line.strip()}")
    name, *rest = _exception_lines(e)
    return [*lines, f"\x1b[31m{name.split(':', 1)[0]}\x1b[0m:{name.split(':', 1)[1]}", *rest]


def install_excepthook(short: Callable[[BaseException], bool]) -> None:
    """Wraps `sys.excepthook` once: an uncaught exception for which `short(e)` holds prints with
    its user's frames only and no chained exception; anything else goes to the previous hook."""
    previous = sys.excepthook
    if getattr(previous, "__shapeml__", False):
        return

    def excepthook(etype, value, tb):
        if not (filtering() and short(value)):
            return previous(etype, value, tb)
        tb = user_traceback(tb)
        if previous is not sys.__excepthook__:  # another library's hook (a crash reporter)
            return previous(etype, value, tb)
        traceback.print_exception(etype, value, tb, chain=False, file=sys.stderr)

    excepthook.__shapeml__ = True
    sys.excepthook = excepthook
