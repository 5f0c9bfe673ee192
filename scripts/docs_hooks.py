"""MkDocs hooks for what no plugin does (mkdocs.yml loads this file):

- `SHAPEML_DOCS_EXECUTE` picks the notebooks mkdocs-jupyter runs: `1` (default) all, `0` none
  (the quick build; such a page says so), or names; mkdocs.yml fixes the plugin's own options.
  `SHAPEML_DOCS_NOTEBOOKS` names a folder of notebooks executed already (the test suite's run),
  shown as they are and not run again.
- the guide's `../tutorials/*.ipynb` and `../examples/*.py` links point at their site pages.
- inline code naming a public API object (`sm.shard(m, mesh)`, `Graph`) and error codes (`E0901`)
  become mkdocs-autorefs references (the strict build fails on one it cannot resolve), with
  backlinks: the guide needs no link markup.
- no build-machine path in a page: scrubbed from the notebooks' outputs, else a strict failure.
- repository paths in inline code (`tests/test_grad.py`) link to the file in the repository.
- the error index names each code's class (linked when public); no private `shapeml._` name shows
  (mkdocstrings' hover titles of names it cannot link).
- the search index tags each API entry with its name, so searching a name finds its entry first.
- the footer shows the version (`copyright`).
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
    """The tutorials (by name) this build shows executed: those it runs (`SHAPEML_DOCS_EXECUTE`)
    and those run before it (`SHAPEML_DOCS_NOTEBOOKS`, see scripts/docs_gen.py)."""
    return to_run() | set(docs_gen.executed_elsewhere())


def to_run() -> set[str]:
    """The tutorials (by name) mkdocs-jupyter runs: `SHAPEML_DOCS_EXECUTE`, less those run
    before the build."""
    value = os.environ.get("SHAPEML_DOCS_EXECUTE", "1").strip()
    run = set(STEMS) if value == "1" else {v.strip() for v in value.split(",") if v not in "0"}
    if unknown := run - set(STEMS):
        raise ValueError(f"SHAPEML_DOCS_EXECUTE: {sorted(unknown)} is not 1, 0 or one of {STEMS}")
    return run - set(docs_gen.executed_elsewhere())


def on_config(config):
    import shapeml

    global REPO_URL
    REPO_URL = (config.repo_url or REPO_URL).rstrip("/")
    config.copyright = f"shapeml {shapeml.__version__}, Apache-2.0"
    ignore = [f"*/tutorials/{stem}.ipynb" for stem in sorted(set(STEMS) - to_run())]
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
    if page.file.src_uri == "errors.md":
        markdown = name_error_classes(markdown)
    return REPO_LINK.sub(lambda m: f"]({m[1]}{'.md' if m[2] == '.py' else m[2]}", markdown)


@functools.cache
def error_classes() -> dict[str, type]:
    """Each code -> the class that declares it (`E0901` -> `UnknownFieldError`)."""
    import shapeml
    from shapeml import _errors

    _errors._load_code_modules()
    found, todo = {}, [shapeml.ShapemlError, shapeml.ShapemlWarning]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if "code" in cls.__dict__:
            found[cls.code] = cls
    return found


@functools.cache
def public_classes() -> dict[type, str]:
    """Each public class -> the identifier of its API entry."""
    found = {}
    for package in docs_gen.public_packages():
        for name, obj in docs_gen.exported(package).items():
            if isinstance(obj, type):
                found.setdefault(obj, docs_gen.home(package, name, obj))
    return found


def error_class_line(code: str) -> str:
    """The sentence under a code's heading on the error index that names its class: linked when
    it is public, else with the public classes to catch it by."""
    cls, public = error_classes()[code], public_classes()
    if cls in public:
        return f"Raised as [`{cls.__name__}`][{public[cls]}]."
    bases = [b for b in cls.__mro__[1:] if b in public or b.__module__ == "builtins"]
    bases = [b for b in bases if b not in (object, BaseException, Exception, Warning)]
    named = ", ".join(f"[`{b.__name__}`][{public[b]}]" if b in public else f"`{b.__name__}`"
                      for b in bases)  # fmt: skip
    return f"Raised as `{cls.__name__}`, caught as {named}."


def name_error_classes(markdown: str) -> str:
    heading = re.compile(r"^(## ([EW]\d{4})\b.*)$", re.M)
    return heading.sub(lambda m: f"{m[1]}\n\n{error_class_line(m[2])}", markdown)


TAG = re.compile(r"(<[^>]*>)")
SCOPES = re.compile(r"<(/?)(a|autoref|pre|h[1-6])\b(?:[^>]*\bid=\"([^\"]*)\")?")


REPO_PATH = re.compile(r"(?:\.ci|src|tests|benchmarks|examples|tutorials|scripts|docs)/[\w./-]*"
                       r"|(?:pyproject\.toml|README\.md|mkdocs\.yml)")  # fmt: skip
REPO_URL = "https://github.com/shapeml/shapeml"  # mkdocs.yml's repo_url, set by on_config


def repo_link(code: str) -> str | None:
    """The repository URL of inline `code` when it is a path in the repository."""
    path = html.unescape(code).strip()
    if not REPO_PATH.fullmatch(path) or not (ROOT / path).exists():
        return None
    kind = "tree" if (ROOT / path).is_dir() else "blob"
    return f"{REPO_URL}/{kind}/main/{path.rstrip('/')}"


def link_html(text: str, backlinks: str | None) -> str:
    """Inline code naming an API object, and error codes, in rendered HTML as autorefs (with
    `backlinks`, an anchor of the page, the entry lists this page as using it); inline code naming
    a repository path as a link to the file."""
    parts, depth = TAG.split(text), {"a": 0, "pre": 0, "h": 0}
    codes = collections.defaultdict(str, error_ids())  # an unknown code fails the strict build

    def ref(ident: str, fallback: str) -> str:  # autorefs links `fallback` if `ident` is unknown
        back = backlinks and f'backlink-type="used-by" backlink-anchor="{backlinks}"'
        return f'<autoref identifier="{ident}" slug="{fallback}" {back or ""}>'

    for i in range(0, len(parts), 2):
        if i and (m := SCOPES.match(parts[i - 1])):
            key = "a" if m[2] == "autoref" else m[2][0] if m[2][0] == "h" else m[2]
            depth[key] = max(0, depth[key] + (-1 if m[1] else 1))
        if depth["a"] or depth["h"] or not parts[i].strip():
            continue
        code = not depth["pre"] and parts[i - 1 : i] == ["<code>"]
        if code and parts[i + 1 : i + 2] == ["</code>"] and (found := resolve(parts[i])):
            parts[i - 1], parts[i + 1] = f"{ref(*found)}<code>", "</code></autoref>"
            continue
        if code and parts[i + 1 : i + 2] == ["</code>"] and (url := repo_link(parts[i])):
            parts[i - 1], parts[i + 1] = f'<a href="{url}"><code>', "</code></a>"
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
    if src.startswith("api/"):
        content = init_signatures(content)
    return link_html(content, backlinks=backlink_anchor(src, content))


SIGNATURE = re.compile(
    r'(doc-signature highlight"><pre><span></span><code><span class="nf">)(\w+)(</span>)'
)


@functools.cache
def model_classes() -> frozenset[str]:
    """The API entries of `sm.Model` and its public subclasses (built with `Cls.init(...)`)."""
    from shapeml.models import Model

    return frozenset(i for cls, i in public_classes().items() if issubclass(cls, Model))


def init_signatures(content: str) -> str:
    """A model class's signature (its `init`'s, scripts/griffe_docstrings.py) as `Cls.init(...)`,
    which is how it is built: `Cls(...)` is equinox's field-by-field constructor."""

    def named(m: re.Match) -> str:
        at = content.rfind(' id="', 0, m.start())
        anchor = content[at + 5 : content.find('"', at + 5)]
        if anchor in model_classes() and anchor.rsplit(".", 1)[-1] == m[2]:
            return f'{m[1]}{m[2]}</span><span class="o">.</span><span class="n">init{m[3]}'
        return m[0]

    return SIGNATURE.sub(named, content)


def backlink_anchor(src: str, content: str) -> str | None:
    """The anchor an API entry's "Used in" links for page `src`: its title's, once per page, for a
    guide page or a tutorial (not the home page, the error index, examples, solutions, API)."""
    guide = "/" not in src and src not in ("index.md", "errors.md") and src.endswith(".md")
    guide = guide and not src.startswith("examples_")
    tutorial = re.fullmatch(r"tutorials/\d\d_\w+\.ipynb", src) is not None
    title = re.search(r'<h1 id="([^"]+)"', content)
    return title[1] if (guide or tutorial) and title else None


PRIVATE_TITLE = re.compile(r' title="shapeml(?:\.\w+)*\._[a-z]\w*(?:\.\w+)*"')


def on_post_page(output: str, page, config) -> str:
    # mkdocstrings titles a name it shows unlinked with its full path, a private one included
    return PRIVATE_TITLE.sub("", output)


def on_post_build(config) -> None:
    """Tags each class's API entry in the search index with its name in one lowercase word
    (Material's search weighs a tag match above all, and its query `TrainStep` is `train* step*`,
    whose `train*` matches the tag `trainstep`), so the entry is found first. Functions are not
    tagged: `train_spotter`'s tag would match `train*` as well as `TrainStep`'s does. The price: a
    query whose word begins a class's name (`weight decay`, `WeightWriteError`) lists the class
    first, since Material's query matches every word as a prefix."""
    import json

    path = Path(config.site_dir) / "search" / "search_index.json"
    if not path.is_file():
        return
    index = json.loads(path.read_text(encoding="utf-8"))
    homes = set(public_classes().values())
    for doc in index["docs"]:
        anchor = doc["location"].partition("#")[2]
        if doc["location"].startswith("api/") and anchor in homes:
            doc["tags"] = [anchor.rsplit(".", 1)[-1].lower()]
    path.write_text(json.dumps(index, separators=(",", ":")), encoding="utf-8")
