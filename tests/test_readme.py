"""The README stays true: its tour runs, and its test command is the one CI runs."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_every_python_block_runs_in_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert len(blocks) >= 4
    namespace: dict = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"README.md block {i}", "exec"), namespace)
        if i == 0:
            assert namespace["m"].w.shape == (32, 4) and namespace["wide"].dims.D == 64
    assert (tmp_path / "head.safetensors").exists() and (tmp_path / "run.safetensors").exists()
    assert int(namespace["opt"].step) == 3
    assert float(namespace["acc"].read("total")[2].sum()) == 8.0
    namespace["test_forward_contract"](namespace["check_contract"])


def test_ci_runs_the_readme_test_command():
    command = re.search(r"pip install -e '\.\[test\]' && (.+)", README).group(1).strip()
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ci_lines[-1].strip() == command
