"""The README stays true: its tour runs, and its test command is the one CI runs."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_tour_code_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    tour = next(b for b in blocks if "class Head(sm.Model)" in b)
    namespace: dict = {}
    exec(compile(tour, "README.md", "exec"), namespace)
    assert namespace["m"].w.shape == (32, 4) and namespace["wide"].dims.D == 64
    assert (tmp_path / "head.safetensors").exists()


def test_ci_runs_the_readme_test_command():
    command = re.search(r"pip install -e '\.\[test\]' && (.+)", README).group(1).strip()
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ci_lines[-1].strip() == command
