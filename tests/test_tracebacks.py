"""What a user sees when a shapeml error reaches the top: the user's frames and the coded message.

The most common mistakes are made in a fresh Python process, as a user's script makes them: by
default the traceback shows the script's frames only (no shapeml, beartype or JAX frame) and no
chained exception; with `SHAPEML_TRACEBACK_FILTERING=off` it shows every frame and chain.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import jax.numpy as jnp
import pytest
from jaxtyping import Array, Float

import shapeml as sm

# Each case: (name, the code, the code it raises). The code runs in a function of the script.
CASES = [
    ("shape check", "forward(m, jnp.ones((8, 31)))", "E1001"),
    ("numpy of a wrong shape", "forward(m, np.ones((8, 31), np.float32))", "E1001"),
    ("layer call", "nn.Linear.init(seed=0, In=3, Out=2)(jnp.ones((2, 4)))", "E1001"),
    ("call signature", "forward(m)", "E1003"),
    ("unknown field", "m.W", "E0901"),
    ("assigning a field", "m.w = m.w * 0", "E1102"),
    ("replace with a wrong shape", "m.replace(w=m.w.T)", "E0902"),
    ("a derived dim overridden", "Head.init(seed=0, H=3)", "E0904"),
    ("a missing file", "sm.load('missing.safetensors', Head)", "E1304"),
    ("a file of other dims", "sm.load(sm.save('h64.safetensors', m64), like=m)", "E1303"),
    ("a checkpoint of other dims", "sm.load_checkpoint(ckpt64, Head, like=optim.adamw(m, lr=0.1))",
     "E1303"),
    ("an optimizer of another model", "optim.update(m, optim.adamw(Other.init(), lr=0.1), g)",
     "E1201"),
    ("a loss that reads no param", "sm.value_and_grad(lambda m, x: jnp.mean(x), m, x)", "E1101"),
    ("a shape check under jit", "jax.jit(forward)(m, jnp.ones((8, 31)))", "E1001"),
]  # fmt: skip

SCRIPT = """
import sys
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float
import shapeml as sm
from shapeml import nn, optim


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
print("=== uncaught", file=sys.stderr)
forward(m, jnp.ones((8, 31)))
"""


def _script() -> str:
    """The script: the set-up, a function per case (its one line is the user's mistake), the run."""
    cases = "".join(f"\n\ndef case_{i}():\n    {code}\n" for i, (_, code, _) in enumerate(CASES))
    table = ", ".join(f"({name!r}, case_{i})" for i, (name, _, _) in enumerate(CASES))
    return SCRIPT + cases + f"\n\nCASES = [{table}]\n" + RUN


def _run(tmp_path: Path, **env: str) -> tuple[Path, dict[str, str], int]:
    script = tmp_path / "train.py"
    script.write_text(_script())
    clean = {
        k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "SHAPEML_TRACEBACK_FILTERING")
    }
    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env={**clean, **env},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    blocks = dict(re.findall(r"^=== (.*)\n((?:(?!=== ).*\n?)*)", run.stderr, re.M))
    return script, blocks, run.returncode


def _files(block: str) -> list[str]:
    return re.findall(r'^\s*File "([^"]+)"', block, re.M)


@pytest.fixture(scope="module")
def short(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("short"))


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("full"), SHAPEML_TRACEBACK_FILTERING="off")


@pytest.mark.parametrize("name, code, expected", CASES, ids=[c[0] for c in CASES])
def test_by_default_a_traceback_shows_the_users_frames_and_the_message_only(
    short, name, code, expected
):
    script, blocks, _ = short
    block = blocks[name]
    assert f"[{expected}]" in block, block
    files = _files(block)
    assert files and set(files) == {str(script)}, f"frames other than the script's:\n{block}"
    assert code.split("(")[0].strip() in block  # the user's line that made the mistake
    assert "direct cause" not in block and "During handling" not in block, block
    assert "beartype" not in block and "Array([" not in block and "array([" not in block, block
    assert len(block.strip().splitlines()) <= 12, block


def test_an_uncaught_error_ends_the_script_with_the_short_traceback(short):
    script, blocks, code = short
    assert code == 1
    block = blocks["uncaught"]
    assert _files(block) == [str(script)] and block.rstrip().endswith("long explanation)")
    assert "x: float32[8 31] where float[b D] with D=32 was expected (dimension D is 31)" in block


@pytest.mark.parametrize("name, code, expected", CASES, ids=[c[0] for c in CASES])
def test_with_the_switch_off_every_frame_is_shown(full, name, code, expected):
    script, blocks, _ = full
    block = blocks[name]
    assert f"[{expected}]" in block, block
    package = str(Path(sm.__file__).parent)
    assert str(script) in _files(block) and any(f.startswith(package) for f in _files(block)), block


def test_with_the_switch_off_the_checkers_chained_error_is_shown(full):
    _, blocks, code = full
    assert code == 1
    assert "BeartypeCallHintParamViolation" in blocks["uncaught"]
    assert "The above exception was the direct cause" in blocks["uncaught"]


class Head(sm.Model):
    dims = sm.Dims(D=4)
    w: Float[Array, " D"] = sm.param(sm.ones)


def test_a_notebook_shows_the_users_frame_and_the_message(monkeypatch):
    """IPython shows what `_render_traceback_` returns; with the switch off it has none."""

    def user_code():
        Head.init(seed=0).replace(w=jnp.ones(5))

    with pytest.raises(sm.ShapemlError) as e:
        user_code()
    lines = [re.sub(r"\x1b\[[\d;]*m", "", line) for line in e.value._render_traceback_()]
    assert [line.split(",")[0] for line in lines[::2][:2]] == [f'  File "{__file__}"'] * 2, lines
    assert lines[2].endswith("in user_code")  # this test's frame, then `user_code`'s
    assert lines[4].startswith("ShapeMismatchError: [E0902]"), lines  # after 2 frames, 2 lines each
    assert lines[-1].endswith("long explanation)") and len(lines) <= 9, lines
    monkeypatch.setenv("SHAPEML_TRACEBACK_FILTERING", "off")
    assert not hasattr(e.value, "_render_traceback_")  # IPython's own full traceback


def test_the_excepthook_passes_every_other_exception_on_unchanged(tmp_path):
    script = tmp_path / "other.py"
    script.write_text(textwrap.dedent("""
        import shapeml
        def inner():
            raise KeyError("not shapeml's")
        try:
            inner()
        except KeyError as e:
            raise ValueError("outer") from e
    """))  # fmt: skip
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert "direct cause" in run.stderr and "KeyError" in run.stderr and "in inner" in run.stderr
