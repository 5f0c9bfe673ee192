"""The tutorials: every notebook runs top to bottom in a fresh kernel, errors only where expected.

A cell that demonstrates an error carries the `raises-exception` cell tag and a first line
`# expect: E0901`; the run fails if that cell raises nothing or an error with another code. A cell
whose first line is `# expect: W1101` (a warning) must run without error and print that code on
stderr. Notebooks are stored with their outputs cleared, so diffs stay readable. The error cells'
outputs of each run are checked as the documentation site shows them (at most `ERROR_CELL_LINES` lines, no path of
the build machine once scripts/docs_hooks.py scrubbed them). Each notebook runs once per test run
(`executed_once`): the site build of tests/test_site.py shows those same outputs.

A notebook's size knobs (training steps, timed calls) sit in one cell tagged `parameters`, the
papermill convention. The suite runs the notebooks quick: it inserts a cell right after that one
that sets the knobs of `QUICK` to smaller values, which still run every code path (every plot,
every schedule, every checkpoint); users and the documentation site run the full values.
"""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from _forced_devices import forced_env
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parent.parent
TUTORIALS = ROOT / "tutorials"
NOTEBOOKS = sorted(TUTORIALS.glob("*.ipynb"))
SOLUTIONS = sorted((TUTORIALS / "solutions").glob("*.py"))
EXPECT = re.compile(r"^\s*#\s*expect:\s*([EW]\d{4})\b")
RAISES = "raises-exception"
PARAMETERS = "parameters"
# The suite's values of the knobs; each still runs every cell's code path: 02's live curve redraws
# every 40 steps and its schedules warm up over 20, 07's warms up over 10, 05's trainer needs 1.
QUICK = {
    "02_gradients_and_optimizers": {"STEPS": 40},
    "04_hoisting": {"CALLS": 3},
    "05_int8_transformer": {"TRAIN_STEPS": 10},
    "07_nn_layers": {"STEPS": 20},
}


def _expected(cell) -> str | None:
    first = cell.source.lstrip("\n").split("\n", 1)[0]
    m = EXPECT.match(first)
    return m.group(1) if m else None


def _tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def test_there_are_seven_chapters_each_with_solutions():
    assert [p.stem[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05", "06", "07"]
    assert [p.stem for p in SOLUTIONS] == [p.stem for p in NOTEBOOKS]
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
        assert "## Exercises" in text and f"solutions/{path.stem}.py" in text, path.name
        assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# "), (
            path.name
        )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_with_outputs_cleared(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        assert cell.outputs == [], f"{path.name} cell {i} is stored with outputs: clear them"
        assert cell.execution_count is None, f"{path.name} cell {i} has an execution count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_error_cells_are_tagged_and_name_their_code(path):
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        code, tagged = _expected(cell), RAISES in _tags(cell)
        if tagged:
            assert code and code.startswith("E"), (
                f"{path.name} cell {i} is tagged {RAISES} but its first line is not `# expect: E....`"
            )
        elif code and code.startswith("E"):
            pytest.fail(f"{path.name} cell {i} expects {code} but is not tagged {RAISES}")


def _knobs(nb) -> tuple[int, dict[str, int]]:
    """The index of `nb`'s cell tagged `parameters` and the whole numbers it assigns."""
    tagged = [i for i, c in enumerate(nb.cells) if PARAMETERS in _tags(c)]
    assert len(tagged) == 1, f"{len(tagged)} cells tagged {PARAMETERS!r}, want one"
    found = re.findall(r"^([A-Z_]+) = (\d+)\b", nb.cells[tagged[0]].source, re.M)
    return tagged[0], {name: int(value) for name, value in found}


def _quick(nb, name: str):
    """`nb` with a cell after its `parameters` cell that sets the knobs to `QUICK[name]`."""
    if name not in QUICK:
        return nb
    at, _ = _knobs(nb)
    source = "\n".join(f"{k} = {v}" for k, v in QUICK[name].items())
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    nb.cells.insert(at + 1, cell)
    return nb


@pytest.mark.parametrize("name", sorted(QUICK))
def test_quick_values_are_knobs_of_the_parameters_cell_and_smaller(name):
    nb = nbformat.read(TUTORIALS / f"{name}.ipynb", as_version=4)
    _, knobs = _knobs(nb)
    for knob, quick in QUICK[name].items():
        assert knob in knobs, f"{name}: {knob} is not set in its {PARAMETERS!r} cell"
        assert 0 < quick < knobs[knob], f"{name}: quick {knob} = {quick}, full {knobs[knob]}"


def _text(outputs, kind: str) -> str:
    parts = []
    for out in outputs:
        if kind == "error" and out.output_type == "error":
            parts.append(f"{out.ename}: {out.evalue}")
        if kind == "stderr" and out.output_type == "stream" and out.name == "stderr":
            parts.append(out.text)
    return "\n".join(parts)


def _execute(nb, cwd: Path) -> list[str]:
    """Runs `nb` in a fresh kernel in `cwd`; returns what went against the cells' expectations.

    An error in a cell without the `raises-exception` tag stops the run (CellExecutionError).
    """
    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=300,
        allow_errors=False,  # only cells tagged `raises-exception` may raise
        resources={"metadata": {"path": str(cwd)}},
    )
    client.execute()
    problems = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        code = _expected(cell)
        errors = _text(cell.outputs, "error")
        if RAISES in _tags(cell):
            if not errors:
                problems.append(f"cell {i} should raise {code} but ran without error")
            elif code not in errors:
                problems.append(f"cell {i} should raise {code} but raised: {errors[:300]}")
        elif code is not None and code not in _text(cell.outputs, "stderr"):
            problems.append(f"cell {i} should warn {code} but its stderr does not show it")
        elif code is not None and (where := _warned_at(cell)) != "the cell":
            problems.append(f"cell {i}'s warning {code} points at {where}, not at the cell")
    return problems


# Where a warning shown in a cell's stderr points (`file:line: Category: ...`): ipykernel names a
# cell's code `<tmp>/ipykernel_<pid>/<hash>.py`.
WARNED_AT = re.compile(r"^(\S+?):(\d+): \w+Warning: ", re.M)


def _warned_at(cell) -> str:
    """ "the cell" when each warning in `cell`'s stderr points at the cell's own code (its file is
    ipykernel's for the cell and the line shown under it is one of the cell's), else the file."""
    stderr = _text(cell.outputs, "stderr")
    for m in WARNED_AT.finditer(stderr):
        shown = stderr[m.end() :].split("\n")
        source_line = next(
            (
                x.strip()
                for x in shown[1:]
                if x.startswith("  ") and not x.lstrip().startswith(("help:", "(run"))
            ),
            "",
        )
        if "ipykernel_" not in m[1] or source_line not in cell.source:
            return f"{m[1]}:{m[2]}"
    return "the cell"


# The most lines of error output an error cell may show. IPython's own display of an error: its
# heading, each of the notebook's frames (shapeml's are gone at its API boundary) with a few lines
# around it, the coded message. The longest tutorial cell (07's E1803, three cells deep) shows 18.
ERROR_CELL_LINES = 20
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _error_cell_problems(nb) -> list[str]:
    """Executed notebook `nb`'s error cells, as the site shows them: at most `ERROR_CELL_LINES`
    lines of error output each, and no path of the build machine once the site scrubbed them
    (scripts/docs_hooks.py)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import docs_hooks

    problems = []
    for i, cell in enumerate(nb.cells):
        for out in cell.outputs if RAISES in _tags(cell) else []:
            text = "\n".join(out.get("traceback", [])) or out.get("text", "")
            if out.output_type == "stream" and out.name != "stderr":
                continue
            lines = ANSI.sub("", text).strip("\n").splitlines()
            if len(lines) > ERROR_CELL_LINES:
                first = next((x for x in lines if x.strip(" -")), "")[:60]
                problems.append(f"cell {i}: {len(lines)} lines of error output: {first!r}")
            for path in docs_hooks.machine_paths(docs_hooks.scrub(ANSI.sub("", text))):
                problems.append(f"cell {i}: a build-machine path: {path}")
    return problems


def test_the_error_cell_check_catches_a_long_traceback_and_a_path():
    def cell(outputs):
        return nbformat.v4.new_code_cell(
            "# expect: E0901", metadata={"tags": [RAISES]}, outputs=outputs
        )

    long = nbformat.v4.new_output(
        "error",
        ename="E",
        evalue="x",
        traceback=[f"frame {i}" for i in range(ERROR_CELL_LINES + 4)],
    )
    short = nbformat.v4.new_output(
        "stream", name="stderr", text="[E0901] bad\n  in /home/me/x.py:3"
    )
    found = _error_cell_problems(nbformat.v4.new_notebook(cells=[cell([long]), cell([short])]))
    assert found == [
        f"cell 0: {ERROR_CELL_LINES + 4} lines of error output: 'frame 0'",
        "cell 1: a build-machine path: /home/me",
    ], found


def executed_once(stem: str, tmp_path_factory) -> Path:
    """The folder of this test run holding notebook `stem` executed (quick values), with outputs
    and plots, as `<stem>.ipynb`, and what went against its cells' expectations, `<stem>.txt`.

    Each notebook runs once per test run: its test here and the site build (tests/test_site.py,
    which shows these outputs) share it; under xdist the first worker to ask runs it, under a
    lock, and the others read it.
    """
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    base = tmp_path_factory.getbasetemp()
    folder = base.parent / f"notebooks-{run_id}" if run_id else base / "notebooks"
    folder.mkdir(exist_ok=True)
    with open(folder / f"{stem}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / f"{stem}.txt").exists():
            nb = _quick(nbformat.read(TUTORIALS / f"{stem}.ipynb", as_version=4), stem)
            (folder / stem).mkdir(exist_ok=True)  # what the notebook saves lands there
            backend = os.environ.pop("MPLBACKEND", None)  # the kernel's own inline plots
            try:
                problems = _execute(nb, folder / stem)
            except CellExecutionError as e:
                problems = [f"a cell raised where none was expected:\n{str(e)[-3000:]}"]
            finally:
                if backend is not None:
                    os.environ["MPLBACKEND"] = backend
            problems += _error_cell_problems(nb)
            nbformat.write(nb, folder / f"{stem}.ipynb")
            (folder / f"{stem}.txt").write_text("\n".join(problems), encoding="utf-8")
    return folder


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, tmp_path_factory):
    folder = executed_once(path.stem, tmp_path_factory)
    problems = (folder / f"{path.stem}.txt").read_text(encoding="utf-8")
    assert not problems, f"{path.name}:\n{problems}"
    nb = nbformat.read(folder / f"{path.stem}.ipynb", as_version=4)
    assert all(c.execution_count for c in nb.cells if c.cell_type == "code"), "not every cell ran"


def test_the_executor_catches_missing_wrong_and_unexpected_errors(tmp_path):
    def cell(source, tagged=False):
        c = nbformat.v4.new_code_cell(source)
        if tagged:
            c.metadata["tags"] = [RAISES]
        return c

    nb = nbformat.v4.new_notebook(
        cells=[
            cell("# expect: E0901\n1 + 1", tagged=True),  # raises nothing
            cell("# expect: E0902\nraise ValueError('[E0901] x')", tagged=True),  # another code
            cell("# expect: E0901\nraise KeyError('[E0901] y')", tagged=True),  # as expected
            cell("# expect: W1101\nprint('no warning')"),  # warns nothing
        ]
    )
    problems = _execute(nb, tmp_path)
    assert [p.split(" should")[0] for p in problems] == ["cell 0", "cell 1", "cell 3"], problems
    assert "ran without error" in problems[0] and "E0901" in problems[1]
    broken = nbformat.v4.new_notebook(cells=[cell("raise RuntimeError('not expected')")])
    with pytest.raises(CellExecutionError, match="not expected"):
        _execute(broken, tmp_path)


def test_a_warning_in_a_notebook_names_the_cell_once_per_cause(tmp_path):
    """W1101 from `sm.value_and_grad` (called directly and under `jax.jit`, traced twice) points
    at the cell's own lines, as a script's would, not at JAX's or IPython's frames."""
    setup = """
import jax, jax.numpy as jnp
from jaxtyping import Array, Float
import shapeml as sm

class Net(sm.Model):
    dims = sm.Dims(D=3)
    a: Float[Array, "D"] = sm.param(sm.ones)
    b: Float[Array, "D"] = sm.param(sm.ones)

def loss(m):
    return jnp.sum(m.a)
"""
    warns = """# expect: W1101
_ = sm.value_and_grad(loss, Net.init(seed=0))
step = jax.jit(lambda m: sm.value_and_grad(loss, m)[0])
_ = step(Net.init(seed=0)), step(Net.init(seed=0, D=4))  # a second trace, the same cause
"""
    cells = [nbformat.v4.new_code_cell(setup), nbformat.v4.new_code_cell(warns)]
    nb = nbformat.v4.new_notebook(cells=cells)
    assert _execute(nb, tmp_path) == []
    stderr = _text(nb.cells[1].outputs, "stderr")
    lines = [m[1] for m in WARNED_AT.finditer(stderr)]
    assert len(lines) == 2 and all("ipykernel_" in x for x in lines), stderr
    assert "_ = sm.value_and_grad(loss, Net.init(seed=0))" in stderr, stderr
    assert "step = jax.jit(lambda m: sm.value_and_grad(loss, m)[0])" in stderr, stderr
    assert "interactiveshell" not in stderr and "jax/" not in stderr, stderr
    at_ipython = re.sub(r"^\S+?:\d+:", "/x/IPython/core/shell.py:9:", stderr, count=1, flags=re.M)
    out = nbformat.v4.new_output("stream", name="stderr", text=at_ipython)
    cell = nbformat.v4.new_code_cell(warns, outputs=[out])
    assert _warned_at(cell) == "/x/IPython/core/shell.py:9"  # what tutorial 02 showed before


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_exercise_solutions_run(path, tmp_path):
    run = subprocess.run(  # XLA's cheap compile, as the notebooks' kernels have it
        [sys.executable, str(path)], cwd=tmp_path, env=forced_env(), capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "all solutions check out" in run.stdout
