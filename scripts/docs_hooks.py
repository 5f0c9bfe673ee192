"""MkDocs hooks for what no plugin does (mkdocs.yml loads this file):

- `SHAPEML_DOCS_EXECUTE` picks the notebooks mkdocs-jupyter runs: `1` (default) all, `0` none
  (the quick build; such a page says so), or names; mkdocs.yml fixes the plugin's own options.
- the guide's `../tutorials/*.ipynb` and `../examples/*.py` links point at their site pages.
- inline code naming a public API object (`sm.shard(m, mesh)`, `Graph`) and error codes (`E0901`)
  become mkdocs-autorefs references (the strict build fails on one it cannot resolve), with
  backlinks: the guide needs no link markup.
- no build-machine path in a page: scrubbed from the notebooks' outputs, else a strict failure.
"""

from __future__ import annotations

import collections
import functools
import html
import logging
import os
import re
import sys
import sysconfig
import tempfile
import types
from pathlib import Path

import docs_gen  # scripts/docs_gen.py: mkdocs puts this file's folder on the path to load it
from markdown.extensions.toc import slugify
from mkdocs.plugins import event_priority

log = logging.getLogger("mkdocs.hooks.shapeml")
ROOT = docs_gen.ROOT
STEMS = [p.stem for p in sorted((ROOT / "tutorials").glob("*.ipynb"))]
# Packages whose names link only when written qualified: tutorials define their own `forward`.
QUALIFIED_ONLY = ("shapeml.zoo", "shapeml.apps", "shapeml.data")
CODE = re.compile(r"@?([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)([(\[].*)?", re.S)
ERROR = re.compile(r"(?<![\w/#-])[EW]\d{4}(?![\w-])")
QUICK_NOTE = """<div class="admonition note"><p class="admonition-title">Quick build</p><p>This
notebook was not executed for this build (SHAPEML_DOCS_EXECUTE), so it shows no outputs.</p></div>"""


def executed() -> set[str]:
    """The tutorials (by name) this build runs, from `SHAPEML_DOCS_EXECUTE`."""
    value = os.environ.get("SHAPEML_DOCS_EXECUTE", "1").strip()
    run = set(STEMS) if value == "1" else {v.strip() for v in value.split(",") if v not in "0"}
    if unknown := run - set(STEMS):
        raise ValueError(f"SHAPEML_DOCS_EXECUTE: {sorted(unknown)} is not 1, 0 or one of {STEMS}")
    return run


def on_config(config):
    ignore = [f"*/tutorials/{stem}.ipynb" for stem in sorted(set(STEMS) - executed())]
    config.plugins["mkdocs-jupyter"].config["execute_ignore"] = ignore
    os.environ.pop("MPLBACKEND", None)  # the kernels inherit it: `Agg` would leave out the plots
    return config


@functools.cache
def api_names() -> dict[str, str]:
    """Each way a page writes a public name (`sm.shard`, `optim.adamw`, `adamw`) -> its entry."""
    found = collections.defaultdict(set)
    for package in docs_gen.public_packages():
        found[package].add(package)
        found[package.replace("shapeml", "sm", 1)].add(package)
        for name, obj in docs_gen.exported(package).items():
            items = [(f"{package}.{name}", docs_gen.home(package, name, obj))]
            if isinstance(obj, types.ModuleType):
                subs = getattr(obj, "__all__", [n for n in vars(obj) if not n.startswith("_")])
                items += [(f"{obj.__name__}.{n}", f"{obj.__name__}.{n}") for n in subs]
            for qualified, ident in items:
                parts = qualified.split(".")[1:]
                aliases = {qualified, ".".join(["sm", *parts])}
                aliases |= {".".join(parts[i:]) for i in range(len(parts) - 1)}
                if not qualified.startswith(QUALIFIED_ONLY):
                    aliases.add(parts[-1])
                for alias in aliases:
                    found[alias].add(ident)
    return {alias: idents.pop() for alias, idents in found.items() if len(idents) == 1}


def resolve(code: str) -> tuple[str, str] | None:
    """The entry inline `code` names (`sm.shard(m, mesh)`, `Grad[M]`, `Model.init`) and the one to
    link if it has none (a member: its class). A bare name in lowercase only called (`hoist(f)`)."""
    m = CODE.fullmatch(html.unescape(code).strip())
    if not m:
        return None
    parts, names = m[1].split("."), api_names()
    for n in range(len(parts), 0, -1):
        ident = names.get(".".join(parts[:n]))
        if ident is None:
            continue
        bare = parts[0]
        if n == 1 and (bare.isupper() or bare[0].islower() and "_" not in bare and not m[2]):
            return None
        extra = parts[n:]
        if len(extra) > 1 or (extra and ident in docs_gen.public_packages()):
            return None
        return (f"{ident}.{extra[0]}", ident) if extra else (ident, ident)
    return None


@functools.cache
def error_ids() -> dict[str, str]:
    """Each code -> the id of its heading on the error index (`E0901` -> `e0901-no-such-field`)."""
    text = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")
    return {m[2]: slugify(m[1], "-") for m in re.finditer(r"^## (([EW]\d{4})\b.*)$", text, re.M)}


REPO_LINK = re.compile(r"\]\(\.\./((?:tutorials|examples)/[\w/]+?)(\.py|\.ipynb)\b")


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.generated_by:
        return markdown
    return REPO_LINK.sub(lambda m: f"]({m[1]}{'.md' if m[2] == '.py' else m[2]}", markdown)


TAG = re.compile(r"(<[^>]*>)")
SCOPES = re.compile(r"<(/?)(a|autoref|pre|h[1-6])\b(?:[^>]*\bid=\"([^\"]*)\")?")


def link_html(text: str, backlinks: bool) -> str:
    """Inline code naming an API object, and error codes, in rendered HTML as autorefs (with
    `backlinks`, the entry lists this page's section that uses it)."""
    parts, depth, section = TAG.split(text), {"a": 0, "pre": 0, "h": 0}, ""
    codes = collections.defaultdict(str, error_ids())  # an unknown code fails the strict build

    def ref(ident: str, fallback: str) -> str:  # autorefs links `fallback` if `ident` is unknown
        back = backlinks and section and f'backlink-type="used-by" backlink-anchor="{section}"'
        return f'<autoref identifier="{ident}" slug="{fallback}" {back or ""}>'

    for i in range(0, len(parts), 2):
        if i and (m := SCOPES.match(parts[i - 1])):
            key = "a" if m[2] == "autoref" else m[2][0] if m[2][0] == "h" else m[2]
            depth[key] = max(0, depth[key] + (-1 if m[1] else 1))
            section = m[3] or section
        if depth["a"] or depth["h"] or not parts[i].strip():
            continue
        code = not depth["pre"] and parts[i - 1 : i] == ["<code>"]
        if code and parts[i + 1 : i + 2] == ["</code>"] and (found := resolve(parts[i])):
            parts[i - 1], parts[i + 1] = f"{ref(*found)}<code>", "</code></autoref>"
            continue
        parts[i] = ERROR.sub(lambda e: f"{ref(codes[e[0]], codes[e[0]])}{e[0]}</autoref>", parts[i])
    return "".join(parts)


@functools.cache
def _machine_folders() -> re.Pattern:
    import shapeml

    roots = {str(ROOT), str(Path(shapeml.__file__).resolve().parents[1]), str(Path.home())}
    roots |= {sys.prefix, os.path.realpath(sys.prefix), sysconfig.get_paths()["stdlib"]}
    temps = {tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"}
    temp, root = ("|".join(map(re.escape, sorted(xs, key=len)[::-1])) for xs in (temps, roots))
    packages = r"[\w./~+-]*?/(?:site|dist)-packages(?:/|(?![\w.-]))"
    return re.compile(
        rf"(?<![\w.~])(?:{packages}|(?:{temp})/[^/\s'\"<>:;,()]+/?|(?:{root})(?:/|(?![\w.-])))"
    )


def scrub(text: str) -> str:
    """`text` without the build machine's folders: a package's file by its path in the package
    (`IPython/core/interactiveshell.py`), a temporary file by its name, a folder by `.`."""
    return _machine_folders().sub(lambda m: "" if m[0].endswith("/") else ".", text)


def machine_paths(text: str) -> list[str]:
    """Paths of the build machine, or of any home, temporary or build folder, in `text`."""
    folders = rf"{re.escape(str(ROOT))}|/(?:home|root|Users|work|tmp|var/tmp|private)/"
    found = re.findall(rf"(?<![\w.~])(?:{folders})[\w.-]*", text)
    if "-packages" in text:  # a rare text: the pattern below is slow
        found += re.findall(r"[\w.~/-]*/(?:site|dist)-packages", text)
    return sorted(set(found))


def _toc(items) -> list:
    return [x for item in items for x in (item, *_toc(item.children))]


@event_priority(50)  # before autorefs reads the table of contents
def on_page_content(content: str, page, config, files) -> str:
    src = page.file.src_uri
    if src.startswith("tutorials/") and src.endswith(".ipynb"):
        content = scrub(content).replace('<script src=""> </script>', "")  # no MathJax loader
        # mkdocs-jupyter slugs a heading with code in it differently in its table of contents
        for item, heading in zip(_toc(page.toc), re.findall(r'<h[1-6] id="([^"]+)"', content)):
            item.id = heading
        if Path(src).stem not in executed():
            content = QUICK_NOTE + content
    for path in machine_paths(content):  # a warning fails the strict build
        log.warning("%s: a path of the build machine: %s", src, path)
    return link_html(content, backlinks=not src.startswith("api/"))
