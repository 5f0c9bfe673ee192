"""MkDocs hooks for the few things no plugin does (mkdocs.yml loads this file):

- `SHAPEML_DOCS_EXECUTE` picks the notebooks mkdocs-jupyter runs (its options are fixed in
  mkdocs.yml): `1` (default) all, `0` none (the quick build: such a page says so), or names.
- the guide's links to `../tutorials/*.ipynb` and `../examples/*.py` point at their pages on the
  site: mkdocs resolves only links inside docs/.
- inline code naming a public API object (`sm.shard(m, mesh, rules)`, `optim.adamw`, `Graph`) and
  error codes (`E0901`) become mkdocs-autorefs references, so pages need no link markup; the strict
  build fails on one autorefs cannot resolve. API entries list the sections that use them.
- no path of the build machine in a tutorial's outputs (`scrub`): nbconvert shows them as printed.
"""

from __future__ import annotations

import functools
import html
import os
import re
import sys
import sysconfig
import tempfile
import types
from pathlib import Path

import docs_gen  # scripts/docs_gen.py: mkdocs puts this file's folder on the path to load it
from markdown.extensions.toc import slugify

ROOT = docs_gen.ROOT
STEMS = [p.stem for p in sorted((ROOT / "tutorials").glob("*.ipynb"))]
# Packages whose names link only when written qualified: tutorials define their own `forward`.
QUALIFIED_ONLY = ("shapeml.zoo", "shapeml.apps", "shapeml.data")
CODE = re.compile(r"@?([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)([(\[].*)?", re.S)
ERROR = re.compile(r"(?<![\w/#-])[EW]\d{4}(?![\w-])")
QUICK_NOTE = (
    '<div class="admonition note"><p class="admonition-title">Quick build</p><p>This notebook '
    "was not executed for this build, so its outputs are missing: <code>mkdocs build</code> "
    "without <code>SHAPEML_DOCS_EXECUTE=0</code> runs it.</p></div>"
)


def executed() -> set[str]:
    """The tutorials (by name) this build runs, from `SHAPEML_DOCS_EXECUTE`."""
    value = os.environ.get("SHAPEML_DOCS_EXECUTE", "1").strip()
    if value.lower() in ("0", "false", "no", ""):
        return set()
    if value.lower() in ("1", "true", "yes", "all"):
        return set(STEMS)
    chosen = {v.strip().removesuffix(".ipynb") for v in value.split(",") if v.strip()}
    if unknown := chosen - set(STEMS):
        raise ValueError(f"SHAPEML_DOCS_EXECUTE: no tutorial {sorted(unknown)} in {STEMS}")
    return chosen


def on_config(config):
    run = executed()
    ignore = [f"*/tutorials/{stem}.ipynb" for stem in STEMS if stem not in run]
    config.plugins["mkdocs-jupyter"].config["execute_ignore"] = ignore
    os.environ.pop("MPLBACKEND", None)  # the kernels inherit it: `Agg` would leave out the plots
    return config


@functools.cache
def api_names() -> dict[str, str]:
    """Each way the guide writes a public name (`sm.shard`, `optim.adamw`, `adamw`) -> the
    autorefs identifier of its entry; a name meaning two things (`param`) only qualified."""
    found: dict[str, set[str]] = {}
    for package in docs_gen.public_packages():
        found.setdefault(package, set()).add(package)
        found.setdefault(package.replace("shapeml", "sm", 1), set()).add(package)
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
                    found.setdefault(alias, set()).add(ident)
    return {alias: idents.pop() for alias, idents in found.items() if len(idents) == 1}


def resolve(code: str) -> tuple[str, str] | None:
    """The identifier of the API entry inline `code` names (`sm.shard(m, mesh, rules)`,
    `Grad[Spotter]`, `Model.init`) and the one to link if it has none (a member: its class), or
    None. A bare lowercase name without `_` counts only when called (`hoist(f)`), a bare constant
    never."""
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


REPO_LINK = re.compile(
    r"\]\(\.\./(tutorials/\w+\.ipynb|(?:tutorials/solutions|examples)/\w+)(\.py)?"
)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if page.file.generated_by:
        return markdown
    return REPO_LINK.sub(lambda m: f"]({m[1]}{'.md' if m[2] else ''}", markdown)


TAG = re.compile(r"(<[^>]*>)")
SCOPES = re.compile(r"<(/?)(a|autoref|pre|h[1-6])\b(?:[^>]*\bid=\"([^\"]*)\")?")


def link_html(text: str, backlinks: bool) -> str:
    """Inline code naming an API object, and error codes, in rendered HTML as autorefs (with
    `backlinks`, the entry lists this page's section that uses it)."""
    parts, depth, section = TAG.split(text), {"a": 0, "pre": 0, "h": 0}, ""
    codes = error_ids()

    def ref(ident: str, fallback: str) -> str:
        back = (
            f' backlink-type="used-by" backlink-anchor="{section}"' if backlinks and section else ""
        )
        return f'<autoref identifier="{ident}" slug="{fallback}"{back}>'

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
        parts[i] = ERROR.sub(
            lambda e: f"{ref(codes[e[0]], codes[e[0]])}{e[0]}</autoref>" if e[0] in codes else e[0],
            parts[i],
        )
    return "".join(parts)


@functools.cache
def _machine_paths() -> re.Pattern:
    import shapeml

    roots = {str(ROOT), str(Path(shapeml.__file__).resolve().parents[1]), sys.prefix}
    roots |= {os.path.realpath(sys.prefix), sysconfig.get_paths()["stdlib"], str(Path.home())}
    temps = {tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"}

    def alt(xs):
        return "|".join(re.escape(x.rstrip("/")) for x in sorted(xs, key=len, reverse=True))

    return re.compile(
        rf"(?<![\w.~])(?:[\w./~+-]*?/(?:site|dist)-packages(?:/|(?![\w.-]))"
        rf"|(?:{alt(temps)})/[^/\s'\"<>:;,()]+/?|(?:{alt(roots)})(?:/|(?![\w.-])))"
    )


def scrub(text: str) -> str:
    """`text` without the build machine's folders: a package's file by its path in the package
    (`IPython/core/interactiveshell.py`), a temporary file by its name, a folder by `.`."""
    return _machine_paths().sub(lambda m: "" if m[0].endswith("/") else ".", text)


def on_page_content(content: str, page, config, files) -> str:
    src = page.file.src_uri
    if src.startswith("tutorials/") and src.endswith(".ipynb"):
        content = scrub(content).replace('<script src=""> </script>', "")  # no MathJax loader
        if Path(src).stem not in executed():
            content = QUICK_NOTE + content
    return link_html(content, backlinks=not src.startswith("api/"))
