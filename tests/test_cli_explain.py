"""`shapeml explain` on the command line, and its agreement with `sm.explain`."""

import subprocess
import sys

import shapeml as sm
from shapeml.cli import main


def test_explain_prints_long_form(capsys):
    assert main(["explain", "E1102"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("E1102: models are immutable") and "m.replace(w_h=" in out
    assert out.strip() == str(sm.explain("E1102")).strip()


def test_explain_unknown_code_fails_clearly(capsys):
    assert main(["explain", "E4242"]) == 2
    assert "no shapeml error or warning has the code `E4242`" in capsys.readouterr().err


def test_explain_list_and_console_script():
    out = subprocess.run(
        [sys.executable, "-m", "shapeml.cli", "explain", "--list"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for code in ("E0901", "E0902", "E1102", "E1301"):
        assert code in out
