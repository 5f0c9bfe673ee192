"""`shapeml int8 {train,generate,check}` through an argparse parser built with `add_parser`, and
through the `shapeml` command itself."""

import json

import pytest

from shapeml.apps.int8_sort import TINY_MODEL_PATH
from shapeml.apps.int8_sort.cli import main


def run(argv):
    assert argv[0] == "int8"
    return main(argv[1:])  # the `shapeml int8` parser on its own (a CommandParser, like `shapeml`)


def test_check_prints_shapes_and_bounds(capsys):
    assert run(["int8", "check", str(TINY_MODEL_PATH)]) == 0
    out = capsys.readouterr().out
    assert "valid" in out and "wq" in out and "(32, 32)" in out and "d * 128 * 128" in out


def test_check_reports_a_bad_file(tmp_path, capsys):
    obj = json.loads(TINY_MODEL_PATH.read_text())
    obj["requant"]["w1"] = [5, 70]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(obj))
    assert run(["int8", "check", str(path)]) == 1
    err = capsys.readouterr().err
    assert "E1605" in err and "requant.w1" in err


def test_generate_prints_text_and_tokens_per_second(capsys):
    assert run(["int8", "generate", "--prompt", "fcak>", "-n", "5", "--repeat", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "fcak>acfk|"
    assert "tokens/s" in out[1]


def test_generate_rejects_bad_prompts(capsys):
    assert run(["int8", "generate", "--prompt", "xyz>", "-n", "2"]) == 1
    assert "E1608" in capsys.readouterr().err
    assert run(["int8", "generate", "--prompt", "abc>", "-n", "64"]) == 1
    assert "E1609" in capsys.readouterr().err
    assert run(["int8", "generate", "--prompt", "abc>", "-n", "2", "--tp", "3"]) == 1
    assert "E1611" in capsys.readouterr().err


@pytest.mark.parametrize(
    "sub,flags",
    [
        (
            "train",
            [
                "--out",
                "--float-out",
                "--steps",
                "--batch",
                "--lr",
                "--seed",
                "--d",
                "--heads",
                "--d-ff",
                "--ctx",
            ],
        ),
        ("generate", ["--model", "--prompt", "-n", "--tp", "--repeat"]),
        ("check", ["file"]),
    ],
)
def test_every_flag_has_help(sub, flags, capsys):
    with pytest.raises(SystemExit):
        run(["int8", sub, "--help"])
    out = capsys.readouterr().out
    for flag in flags:
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(flag))
        rest = line.strip()[len(flag) :].strip()
        assert rest, f"{flag} has no help text"


def test_the_shapeml_command_has_int8(capsys):
    from shapeml import cli

    assert cli.main(["int8", "check", str(TINY_MODEL_PATH)]) == 0
    assert "valid" in capsys.readouterr().out
