"""Every shapeml error and warning, each with a code, a one-line title and a long explanation.

A subsystem declares its own codes next to the code that raises them, by subclassing
`ShapemlError` (or `ShapemlWarning`) with `code=`, `title=` and `explanation=`, and is listed in
`CODE_MODULES`; the registry, filled from that list, is what `shapeml explain CODE` and the error
index in `docs/errors.md` read. A shapeml error shows with the user's frames only: the public entry
points are API boundaries (`_traceback`).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from collections.abc import Iterable
from typing import ClassVar

from ._traceback import api_boundary

__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "CODE_MODULES",
    "DtypeUnavailableError",
    "Explanation",
    "ShapemlError",
    "ShapemlWarning",
    "errors_markdown",
    "explain",
    "registry",
    "similar",
]


@dataclasses.dataclass(frozen=True)
class Explanation:
    """The long form of one code, as `shapeml explain` prints it."""

    code: str
    title: str
    explanation: str
    kind: str  # "error" or "warning"

    def render(self) -> str:
        body = self.explanation.strip("\n")
        return f"{self.code}: {self.title}\n\n{body}\n"

    __str__ = render

    def __repr__(self) -> str:  # shows the long form as is in a REPL or notebook
        return self.render()


_REGISTRY: dict[str, Explanation] = {}

# Every module that declares codes: the one list the registry is filled from (a test keeps it
# complete), so `shapeml explain` knows every code without the core importing what is built on it.
CODE_MODULES = (
    "shapeml._errors",
    "shapeml.state._index",
    "shapeml.state._state_errors",
    "shapeml._step._inputs",
    "shapeml._step._program",
    "shapeml._io._errors",
    "shapeml._job._errors",
    "shapeml.models._limits",
    "shapeml._dead_params",
    "shapeml._grad",
    "shapeml._shaped._check",
    "shapeml.models._dims",
    "shapeml.models._fields",
    "shapeml.models._model",
    "shapeml.models._checkpoint",
    "shapeml.models._partial",
    "shapeml.optim._errors",
    "shapeml.state._errors",
    "shapeml.hoisting._errors",
    "shapeml.int8._errors",
    "shapeml.testing._contract",
    "shapeml.training._loop",
    "shapeml.zoo.transformer",
    "shapeml.zoo._errors",
    "shapeml.zoo.gpt2._errors",
    "shapeml.zoo.llama._errors",
    "shapeml.lora._errors",
    "shapeml.sharding._errors",
    "shapeml.distributed._errors",
    "shapeml.nn._errors",
    "shapeml.apps._flags",
)


def _load_code_modules() -> None:
    for name in CODE_MODULES:
        importlib.import_module(name)


def _register(cls: type, code: str | None, title: str | None, explanation: str | None, kind: str):
    if code is None:
        return  # an abstract family (e.g. a base class for E12xx) that groups codes
    if title is None or explanation is None:
        raise TypeError(f"{cls.__name__} declares code {code} without title= and explanation=")
    if code in _REGISTRY and _REGISTRY[code].title != title:
        raise TypeError(f"code {code} is declared twice ({cls.__name__})")
    _REGISTRY[code] = Explanation(code, title, explanation, kind)
    cls.code = code
    cls.title = title
    if cls.__dict__.get("__doc__") is None:  # `help()` and the API reference show the long form
        cls.__doc__ = f"{title[:1].upper()}{title[1:]} ({code}).\n\n{explanation.strip()}\n"


def _format(code: str, message: str, fix: str | None) -> str:
    lines = [f"[{code}] {message}"]
    if fix:
        lines += [
            f"  help: {line}" if i == 0 else f"        {line}"
            for i, line in enumerate(fix.splitlines())
        ]
    lines.append(f"  (run `shapeml explain {code}` for the long explanation)")
    return "\n".join(lines)


class _Coded:
    """What errors and warnings share: a registered code, a message and a fix."""

    code: ClassVar[str]
    title: ClassVar[str]
    _kind: ClassVar[str]

    def __init_subclass__(
        cls,
        *,
        code: str | None = None,
        title: str | None = None,
        explanation: str | None = None,
        **kwargs,
    ):
        super().__init_subclass__(**kwargs)
        _register(cls, code, title, explanation, cls._kind)

    def __init__(self, message: str, *, fix: str | None = None):
        self.message = message
        self.fix = fix
        super().__init__(_format(self.code, message, fix))

    def __str__(self) -> str:
        return _format(self.code, self.message, self.fix)


class ShapemlError(_Coded, Exception):
    """Base of every shapeml error. `str(error)` holds the code, the message and the fix.

    Subclasses that users catch by a builtin meaning also derive from it (an unknown field is an
    `AttributeError`, a wrong shape a `ValueError`), so `hasattr` and ordinary handlers keep working.
    """

    code: ClassVar[str] = "E0000"
    title: ClassVar[str] = "shapeml error"
    _kind: ClassVar[str] = "error"
    # Shown with the user's frames only once it leaves the public API (`_traceback`).
    __shapeml_error__: ClassVar[bool] = True


class ShapemlWarning(_Coded, UserWarning):
    """Base of every shapeml warning; like errors, each has a code and a long form."""

    code: ClassVar[str] = "W0000"
    title: ClassVar[str] = "shapeml warning"
    _kind: ClassVar[str] = "warning"


class UnknownCodeError(
    ShapemlError,
    LookupError,
    code="E0001",
    title="unknown error code",
    explanation="""
`shapeml explain` was given a code that no shapeml error or warning has.

Codes look like `E0901` (errors) or `W1101` (warnings); `shapeml explain --list` prints them all.
""",
):
    pass


class ArgumentError(
    ShapemlError,
    ValueError,
    code="E0002",
    title="invalid argument",
    explanation="""
A shapeml function was called with an argument value it cannot use: a non-positive step count, a
negative size, a batch size larger than the data, arrays of different lengths. The message names
the argument and the value given; pass a value in the range it states.
""",
):
    pass


class ArgumentTypeError(
    ShapemlError,
    TypeError,
    code="E0003",
    title="argument of the wrong type",
    explanation="""
A shapeml function was called with an argument of a type it does not take (a pytree where a model is
expected, an optimizer of another library, a model class where an instance is expected). The
message names the argument, what it got and what it takes.
""",
):
    pass


class DtypeUnavailableError(
    ShapemlError,
    TypeError,
    code="E0004",
    title="dtype this process cannot hold",
    explanation="""
A field, a state or a cache was declared with a dtype that JAX in this process cannot hold: without
64-bit mode (`jax_enable_x64`), JAX turns float64, int64, uint64 and complex128 into their 32-bit
kinds, so the tensor would silently be narrower than declared. shapeml refuses the declaration
where the tensor is made, naming it, instead of letting it change kind on the way.

    jax.config.update("jax_enable_x64", True)   # before any JAX array is made, or
    sm.param(init, dtype=jnp.float32)           # declare a dtype this process holds
""",
):
    pass


def registry() -> dict[str, Explanation]:
    """Every known code, sorted, mapped to its explanation."""
    _load_code_modules()
    return dict(sorted(_REGISTRY.items()))


@api_boundary
def explain(code: str) -> Explanation:
    """The long explanation of an error or warning code, e.g. `sm.explain("E0901")`.

    The result prints as the long form (`print(sm.explain("E0901"))`, or just the value in a
    REPL or notebook); `.title` and `.explanation` hold its parts.

    Raises:
        UnknownCodeError: (E0001) if no shapeml error or warning has this code.
    """
    if not isinstance(code, str):
        raise ArgumentTypeError(
            f"`code` must be a string such as 'E0901', got {code!r} ({type(code).__name__})",
            fix="pass the code as text: sm.explain('E0901')",
        )
    key = code.strip().upper()
    _load_code_modules()
    if key not in _REGISTRY:
        raise UnknownCodeError(
            f"no shapeml error or warning has the code `{code}`",
            fix=similar(key, _REGISTRY, what="code")
            or "run `shapeml explain --list` to see every code",
        )
    return _REGISTRY[key]


def similar(name: str, candidates: Iterable[str], *, what: str = "field") -> str | None:
    """A "did you mean" hint for `name` among `candidates`, or None when nothing is close."""
    candidates = list(candidates)
    by_case = [c for c in candidates if c.lower() == name.lower()]
    close = by_case or difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    if not close:
        return None
    return f"a {what} with a similar name exists: `{close[0]}`"


def errors_markdown() -> str:
    """Every code's long form as one Markdown page: `docs/errors.md` is this text."""
    parts = [
        "# Error and warning codes\n",
        "Generated by `shapeml explain --markdown` from the same source as `shapeml explain CODE`.\n",
        "A shapeml error that reaches the top of a script or a notebook cell shows your code's "
        "frames and its message only; `SHAPEML_TRACEBACK_FILTERING=off` shows every frame and "
        "every chained exception.\n",
    ]
    for code, e in registry().items():
        parts.append(f"## {code}: {e.title}\n\n{e.explanation.strip()}\n")
    return "\n".join(parts)
