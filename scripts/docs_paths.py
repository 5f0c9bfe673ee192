"""Paths of the machine that builds the site, kept out of its pages.

A rendered notebook shows what its cells printed: tracebacks name the installed package's files,
warnings the interpreter's, and the tutorials print the temporary folders they save into. The
build replaces each such path by what a reader can use: a file of a package by its path inside
the package (`shapeml/_shaped.py`, `IPython/core/interactiveshell.py`), a file in a temporary
folder by its name (`head.safetensors`), the repository by nothing (`docs/int8.md`), the home
folder by `~`. scripts/mkdocs_hooks.py scrubs every notebook's outputs and every page;
scripts/check_site.py fails on any path `build_machine_paths` finds in the built site.
"""

from __future__ import annotations

import functools
import os
import re
import site
import sys
import sysconfig
import tempfile
from pathlib import Path

# A folder of installed packages, wherever it is (a venv, `~/.local`, the system's).
PACKAGES = (
    r"(?<![\w.~/\\:-])(?:[A-Za-z]:)?[\w.~/\\-]*?[/\\](?:site|dist)-packages(?:[/\\]|(?![\w.-]))"
)
# Temporary folders: the platform's, and the usual names, whatever `TMPDIR` says.
TEMP_ROOTS = ["/tmp", "/var/tmp", "/dev/shm", r"/var/folders/[\w-]+/[\w-]+/T"]
# A path's component: what a temporary folder's name or a file name is made of.
PART = r"[^/\s'\"`<>:,;()\[\]{}|]+"
# Folders that are a person's or a build's, never a reader's: the check's last resort.
GENERIC = r"(?<![\w.~])/(?:home|root|Users|work|tmp|var/tmp|private)/[\w.-]"


def _prefixes(root: Path) -> list[tuple[str, str]]:
    """(folder, what it becomes) for the folders this build machine has; longest first."""
    import shapeml  # the installed package: its parent is site-packages, or `src` when editable

    folders = {
        str(Path(shapeml.__file__).resolve().parent.parent): "",
        str(root.resolve()): "",
        str(root): "",
        sysconfig.get_paths()["stdlib"]: "",
        sys.prefix: "",
        os.path.realpath(sys.prefix): "",
        str(Path.home()): "~",
    }
    for folder in [*site.getsitepackages(), site.getusersitepackages()]:
        folders[folder] = ""
    found = [(f.rstrip("/"), to) for f, to in folders.items() if len(f.rstrip("/")) > 1]
    return sorted(found, key=lambda item: -len(item[0]))


@functools.lru_cache(maxsize=4)
def _scrubber(root: Path) -> tuple[re.Pattern, dict[str, str]]:
    prefixes = _prefixes(root)
    temp = sorted({re.escape(tempfile.gettempdir()), *TEMP_ROOTS}, key=len, reverse=True)
    pattern = re.compile(
        rf"(?P<temp>(?<![\w.~])(?:{'|'.join(temp)})/{PART}(?P<tslash>/)?)"
        rf"|(?P<packages>{PACKAGES})"
        rf"|(?P<prefix>(?:{'|'.join(re.escape(f) for f, _ in prefixes)})"
        r"(?:(?P<pslash>/)|(?![\w.-])))"
    )
    return pattern, dict(prefixes)


def scrub_text(text: str, root: Path) -> str:
    """`text` with every path of this machine replaced (see the module docstring)."""
    pattern, prefixes = _scrubber(root)

    def replace(m: re.Match) -> str:
        if m["temp"]:
            return "" if m["tslash"] else "."
        if m["packages"]:
            return ""
        to = prefixes[m["prefix"].rstrip("/")]
        if m["pslash"]:
            return f"{to}/" if to else ""
        return to or "."

    return pattern.sub(replace, text)


def scrub_notebook(nb, root: Path) -> None:
    """Scrubs the text of every output of notebook `nb` in place (images are left alone)."""
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if "text" in out:
                out["text"] = scrub_text(out["text"], root)
            if "traceback" in out:
                out["traceback"] = [scrub_text(line, root) for line in out["traceback"]]
            if "evalue" in out:
                out["evalue"] = scrub_text(out["evalue"], root)
            for mime, value in out.get("data", {}).items():
                textual = mime.startswith("text/") or mime.endswith(("+json", "/json"))
                if textual and isinstance(value, str):
                    out["data"][mime] = scrub_text(value, root)


def _markers(root: Path) -> tuple[str, ...]:
    """Texts one of which is in every path `build_machine_paths` finds (a fast first look)."""
    _, prefixes = _scrubber(root)
    temp = ("/tmp", "/var/", "/dev/shm", tempfile.gettempdir())
    return (*prefixes, *temp, "-packages", "/home/", "/root/", "/Users/", "/work/", "/private/")


def build_machine_paths(text: str, root: Path) -> list[str]:
    """The paths of this build machine (or of any home, temporary or build folder) in `text`."""
    if not any(marker in text for marker in _markers(root)):
        return []
    pattern, _ = _scrubber(root)
    found = [m.group(0) for m in pattern.finditer(text)]
    found += [text[m.start() : m.start() + 40].split()[0] for m in re.finditer(GENERIC, text)]
    return sorted(set(found))
