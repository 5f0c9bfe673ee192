"""What a user sees when a shapeml error reaches the top: their own frames and the coded message.

The public entry points are API boundaries (`shapeml._traceback`), so the exception itself is
short: a script, a notebook and pytest all show it without shapeml's frames, the library frames
below them (beartype's checker, JAX's, equinox's) or the exceptions chained inside them, and no
process hook is installed. Each is run as a user runs it, in a fresh process; with
`SHAPEML_TRACEBACK_FILTERING=off` every frame and chained exception is shown.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys
import traceback
import types
from pathlib import Path

import jax.numpy as jnp
import nbformat
import pytest
from jaxtyping import Array, Float
from nbclient import NotebookClient

import shapeml as sm
from shapeml._traceback import is_boundary

PACKAGE = str(Path(sm.__file__).resolve().parent)
# Folders no frame of a short traceback may come from: shapeml's and the libraries' below it.
LIBRARIES = ("site-packages", PACKAGE)

# Each case: (name, the code, the code it raises). The code runs in a function of the script.
CASES = [
    ("shape check", "forward(m, jnp.ones((8, 31)))", "E1001"),
    ("numpy of a wrong shape", "forward(m, np.ones((8, 31), np.float32))", "E1001"),
    ("layer call", "nn.Linear.init(seed=0, In=3, Out=2)(jnp.ones((2, 4)))", "E1001"),
    ("call signature", "forward(m)", "E1003"),
    ("unknown field", "m.W", "E0901"),
    ("assigning a field", "m.w = m.w * 0", "E1102"),
    ("replace with a wrong shape", "m.replace(w=m.w.T)", "E0902"),
    ("building a model", "Head(dims=m.dims, W=m.w)", "E0901"),
    ("a derived dim overridden", "Head.init(seed=0, H=3)", "E0904"),
    ("a missing file", "sm.load('missing.safetensors', Head)", "E1304"),
    ("a file of other dims", "sm.load(sm.save('h64.safetensors', m64), like=m)", "E1303"),
    ("a checkpoint of other dims", "sm.load_checkpoint(ckpt64, Head, like=optim.adamw(m, lr=0.1))",
     "E1303"),
    ("an optimizer of another model", "optim.update(m, optim.adamw(Other.init(), lr=0.1), g)",
     "E1201"),
    ("a loss that reads no param", "sm.value_and_grad(lambda m, x: jnp.mean(x), m, x)", "E1101"),
    ("a shape check in the loss", "sm.value_and_grad(loss, m, jnp.ones((8, 31)))", "E1001"),
    ("a shape check in a train step", "TrainStep(loss, m, optim.sgd(m, lr=0.1))(jnp.ones((8, 31)))",
     "E1001"),
    ("a shape check under jit", "jax.jit(forward)(m, jnp.ones((8, 31)))", "E1001"),
]  # fmt: skip
# The cases whose error is raised below a callback of the user's (the loss): its frame is shown.
IN_LOSS = ("a shape check in the loss", "a shape check in a train step")

SETUP = """
import sys
HOOK = sys.excepthook
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float
import shapeml as sm
from shapeml import nn, optim
from shapeml.training import TrainStep


class Head(sm.Model):
    dims = sm.Dims(D=32, C=4, H="2 * D")
    w: Float[Array, "D C"] = sm.param(sm.normal(std=0.1))


class Other(sm.Model):
    dims = sm.Dims(D=32)
    v: Float[Array, " D"] = sm.param(sm.zeros)


@sm.shaped
def forward(m: Head, x: Float[Array, "b D"]) -> Float[Array, "b C"]:
    return x @ m.w


def loss(m, x):
    return jnp.mean(forward(m, x) ** 2)


m, m64, x = Head.init(seed=0), Head.init(seed=0, D=64), jnp.ones((8, 32))
g = sm.grad(loss, m, x)
ckpt64 = sm.save_checkpoint("c64.safetensors", m64, optim.adamw(m64, lr=0.1))
"""
RUN = """
for name, case in CASES:
    print(f"=== {name}", file=sys.stderr)
    try:
        case()
    except sm.ShapemlError:
        sys.excepthook(*sys.exc_info())  # what the interpreter shows for an uncaught error
    else:
        print(f"raised nothing: {name}", file=sys.stderr)
print(f"=== hook\\n{sys.excepthook is HOOK and sys.excepthook is sys.__excepthook__}", file=sys.stderr)
print("=== uncaught", file=sys.stderr)
forward(m, jnp.ones((8, 31)))
"""


def _script() -> str:
    """The script: the set-up, a function per case (its one line is the user's mistake), the run."""
    cases = "".join(f"\n\ndef case_{i}():\n    {code}\n" for i, (_, code, _) in enumerate(CASES))
    table = ", ".join(f"({name!r}, case_{i})" for i, (name, _, _) in enumerate(CASES))
    return SETUP + cases + f"\n\nCASES = [{table}]\n" + RUN


def _env(**env: str) -> dict[str, str]:
    drop = ("XLA_FLAGS", "SHAPEML_TRACEBACK_FILTERING", "PYTEST_ADDOPTS")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **env}


def _run(tmp_path: Path, **env: str) -> tuple[Path, dict[str, str], int]:
    script = tmp_path / "train.py"
    script.write_text(_script())
    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=_env(**env),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    blocks = dict(re.findall(r"^=== (.*)\n((?:(?!=== ).*\n?)*)", run.stderr, re.M))
    return script, blocks, run.returncode


def _files(text: str) -> list[str]:
    return re.findall(r'^\s*File "([^"]+)"', text, re.M)


@pytest.fixture(scope="module")
def short(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("short"))


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("full"), SHAPEML_TRACEBACK_FILTERING="off")


@pytest.mark.parametrize("name, code, expected", CASES, ids=[c[0] for c in CASES])
def test_a_script_shows_the_users_frames_and_the_message_only(short, name, code, expected):
    script, blocks, _ = short
    block = blocks[name]
    assert f"[{expected}]" in block, block
    files = _files(block)
    assert files and set(files) == {str(script)}, f"frames other than the script's:\n{block}"
    assert code.split("(")[0].strip() in block  # the user's line that made the mistake
    assert ("in loss" in block) == (name in IN_LOSS), block  # the user's callback, when in it
    assert "direct cause" not in block and "During handling" not in block, block
    assert "beartype" not in block and "Array([" not in block and "array([" not in block, block
    assert "JAX_TRACEBACK_FILTERING" not in block or name == "a shape check under jit", block
    assert len(block.strip().splitlines()) <= 14, block


def test_an_uncaught_error_ends_the_script_with_the_short_traceback(short):
    script, blocks, code = short
    assert code == 1
    block = blocks["uncaught"]
    assert _files(block) == [str(script)] and block.rstrip().endswith("long explanation)")
    assert "x: float32[8 31] where float[b D] with D=32 was expected (dimension D is 31)" in block


def test_importing_shapeml_leaves_the_excepthook_alone(short):
    _, blocks, _ = short
    assert blocks["hook"].strip() == "True"  # no hook: the exception itself is short


@pytest.mark.parametrize("name, code, expected", CASES, ids=[c[0] for c in CASES])
def test_with_the_switch_off_every_frame_is_shown(full, name, code, expected):
    script, blocks, _ = full
    block = blocks[name]
    assert f"[{expected}]" in block, block
    files = _files(block)
    assert str(script) in files and any(f.startswith(PACKAGE) for f in files), block


def test_with_the_switch_off_the_checkers_chained_error_is_shown(full):
    _, blocks, code = full
    assert code == 1
    assert "BeartypeCallHintParamViolation" in blocks["uncaught"]
    assert "The above exception was the direct cause" in blocks["uncaught"]


NOTEBOOK = [
    """
import jax.numpy as jnp
from jaxtyping import Array, Float
import shapeml as sm


class Head(sm.Model):
    dims = sm.Dims(D=4)
    w: Float[Array, " D"] = sm.param(sm.ones)


@sm.shaped
def forward(m: Head, x: Float[Array, "b D"]) -> Float[Array, " b"]:
    return x @ m.w


def loss(m, x):
    return jnp.mean(forward(m, x))


m = Head.init()
""".strip(),
    "# expect: E1001\nforward(m, jnp.ones((2, 5)))",
    "sm.value_and_grad(loss, m, jnp.ones((2, 5)))",
    "m.replace(w=jnp.ones(3))",
]


def test_a_notebook_cell_shows_the_cells_frames_and_the_message(tmp_path, monkeypatch):
    """Jupyter (a kernel run by nbclient, as tests/test_tutorials.py runs the tutorials): each
    error cell's traceback names the cells its frames are in, and no file."""
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.delenv("SHAPEML_TRACEBACK_FILTERING", raising=False)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in NOTEBOOK])
    NotebookClient(
        nb, kernel_name="python3", timeout=300, allow_errors=True,
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()  # fmt: skip
    shown = []
    for cell in nb.cells[1:]:
        (error,) = [out for out in cell.outputs if out.output_type == "error"]
        shown.append(re.sub(r"\x1b\[[\d;]*m", "", "\n".join(error.traceback)))
    check, in_loss, replace = shown
    for text, code, cells in [
        (check, "E1001", ["Cell In[2], line 2"]),
        (in_loss, "E1001", ["Cell In[3], line 1", "Cell In[1], line 17, in loss(m, x)"]),
        (replace, "E0902", ["Cell In[4], line 1"]),
    ]:
        assert f"[{code}]" in text and re.findall(r"^Cell In\[.*", text, re.M) == cells, text
        assert "File " not in text and not any(lib in text for lib in LIBRARIES), text
        assert "direct cause" not in text and "beartype" not in text, text
    assert len(check.splitlines()) <= 9, check  # IPython's heading, the cell, the message


def test_a_pytest_failure_shows_the_tests_frames_and_the_message(tmp_path):
    """pytest, run as a user runs it on their own test file (no shapeml options)."""
    test = tmp_path / "test_user.py"
    calls = "\n\n\ndef test_forward():\n    forward(m, jnp.ones((2, 5)))\n"
    calls += "\n\ndef test_loss():\n    sm.value_and_grad(loss, m, jnp.ones((2, 5)))\n"
    test.write_text(NOTEBOOK[0] + calls)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(test)],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = run.stdout
    assert run.returncode == 1 and "2 failed" in out, out[-3000:]
    report = out.split("= FAILURES =", 1)[1].split("short test summary", 1)[0]
    assert report.count("[E1001]") >= 2, report
    for where in (
        "test_user.py:24: ShapeCheckError",
        "test_user.py:28: ",
        "test_user.py:17: Shape",
    ):
        assert where in report, report  # each test's call; the loss, a callback, in the second
    assert not any(lib in report for lib in LIBRARIES) and "beartype" not in report, report


class Scale(sm.Model):
    dims = sm.Dims(D=4)
    w: Float[Array, " D"] = sm.param(sm.ones)


@sm.shaped
def scale(m: Scale, x: Float[Array, " D"]) -> Float[Array, " D"]:
    return x * m.w


def _frames(e: BaseException) -> list[str]:
    """The files of `e`'s frames, but for the wrappers the suite's jaxtyping hook puts around
    shapeml's functions (`--jaxtyping-packages`), outside their boundaries."""
    files = [f.filename for f in inspect.getinnerframes(e.__traceback__, 0)]
    return [f for f in files if not f.endswith(os.path.join("jaxtyping", "_decorator.py"))]


def test_the_boundary_adds_no_frame_and_keeps_the_users_callback():
    def user_loss(m, x):
        return jnp.sum(scale(m, x))

    with pytest.raises(sm.ShapemlError, match=r"\[E1001\]") as caught:
        sm.value_and_grad(user_loss, Scale.init(), jnp.ones(5))
    e = caught.value
    assert _frames(e) == [__file__, __file__]  # this test's call, then the loss
    codes = [f.f_code for f, _ in traceback.walk_tb(e.__traceback__)]
    assert codes[-1] is user_loss.__code__  # the loss, where the mistake is, last
    assert e.__cause__ is None and e.__suppress_context__  # beartype's violation cut off
    assert not getattr(e, "__notes__", None)  # nor JAX's note about the frames it removed


def test_with_the_switch_off_the_exception_is_left_as_raised(monkeypatch):
    monkeypatch.setenv("SHAPEML_TRACEBACK_FILTERING", "off")  # read as the error passes
    with pytest.raises(sm.ShapemlError) as caught:
        scale(Scale.init(), jnp.ones(5))
    assert any(f.startswith(PACKAGE) for f in _frames(caught.value))
    assert type(caught.value.__cause__).__name__ == "BeartypeCallHintParamViolation"


def test_other_exceptions_pass_the_boundary_unchanged():
    def broken_loss(m, x):
        raise KeyError("the user's own")

    with pytest.raises(KeyError) as caught:
        sm.value_and_grad(broken_loss, Scale.init(), jnp.ones(4))
    assert any(f.startswith(PACKAGE) for f in _frames(caught.value))  # as raised: every frame


# Packages whose `__all__` is the public API (the CLI's apps are not a library).
PUBLIC = [
    "shapeml", "shapeml.models", "shapeml.nn", "shapeml.optim", "shapeml.training",
    "shapeml.state", "shapeml.sharding", "shapeml.distributed", "shapeml.hoisting",
    "shapeml.int8", "shapeml.data", "shapeml.data.shapes", "shapeml.testing", "shapeml.zoo.gpt2",
    "shapeml.zoo.spotter", "shapeml.zoo.mixer", "shapeml.zoo.transformer",
]  # fmt: skip


def _entry_points():
    """(public name, callable) for every public function, every public method (and `__init__`,
    `__call__`, ...) of a public class or of its shapeml bases, and the call of a public
    instance (`sm.zeros`)."""
    from shapeml._traceback import _DUNDERS

    def functions(member):
        if not isinstance(member, types.FunctionType) and hasattr(member, "__func__"):
            return [member.__func__]  # a class or static method, a method binding of shapeml's
        if isinstance(member, property):
            return [f for f in (member.fget, member.fset) if f is not None]
        if not isinstance(member, types.FunctionType):
            return []
        source = getattr(inspect.unwrap(member), "__code__", member.__code__).co_filename
        return [member] if source.startswith(PACKAGE) else []  # not a dataclass's `__init__`

    for package in PUBLIC:
        module = importlib.import_module(package)
        for name in module.__all__:
            obj, where = getattr(module, name), f"{package}.{name}"
            if isinstance(obj, type) and not issubclass(obj, BaseException):
                for cls in obj.__mro__:
                    if not cls.__module__.startswith("shapeml"):
                        continue
                    for attr, member in vars(cls).items():
                        if not attr.startswith("_") or attr in _DUNDERS:
                            yield from (
                                (f"{where}: {cls.__name__}.{attr}", f) for f in functions(member)
                            )
            elif isinstance(obj, types.FunctionType):
                yield where, obj
            elif callable(obj) and type(obj).__module__.startswith("shapeml"):
                yield f"{where}: {type(obj).__name__}.__call__", type(obj).__call__


def test_every_public_entry_point_is_an_api_boundary():
    """A public function or class defined without `@api_boundary` would show shapeml's frames."""
    points = dict(_entry_points())
    assert len(points) > 200 and "shapeml.state.Graph: Graph.__call__" in points
    missing = sorted(where for where, fn in points.items() if not is_boundary(fn))
    assert not missing, "decorate these with `@api_boundary` (shapeml._traceback):\n" + "\n".join(
        missing
    )
