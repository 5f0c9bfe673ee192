"""`import shapeml` changes no process state: a fresh interpreter records its environment, hooks,
import machinery, JAX options and devices, imports shapeml, every public module and every name
they export, and finds each unchanged."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import importlib, json, os, pkgutil, sys
    # The libraries shapeml builds on, first: what their own imports do is theirs (optax's
    # absl, for one, adds a finder to sys.meta_path); what is checked is what shapeml adds.
    import beartype, equinox, jax, jaxtyping, numpy, optax, tqdm

    before = dict(
        environ=dict(os.environ),
        excepthook=sys.excepthook,
        displayhook=sys.displayhook,
        meta_path=list(sys.meta_path),
        path_hooks=list(sys.path_hooks),
        config={k: repr(v) for k, v in jax.config.values.items()},
    )

    import shapeml

    modules = [shapeml]
    for info in pkgutil.walk_packages(shapeml.__path__, "shapeml."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            modules.append(importlib.import_module(info.name))
    names = 0
    for module in modules:
        for name in getattr(module, "__all__", ()):
            getattr(module, name)
            names += 1

    after = dict(
        environ=dict(os.environ),
        excepthook=sys.excepthook,
        displayhook=sys.displayhook,
        meta_path=list(sys.meta_path),
        path_hooks=list(sys.path_hooks),
        config={k: repr(v) for k, v in jax.config.values.items()},
    )
    changed = {k: repr(before[k]) != repr(after[k]) for k in before}
    changed["environ_keys"] = sorted(
        k for k in set(before["environ"]) | set(after["environ"])
        if before["environ"].get(k) != after["environ"].get(k)
    )
    changed["config_keys"] = sorted(
        k for k in after["config"] if before["config"].get(k) != after["config"][k]
    )
    print("RESULT" + json.dumps(dict(
        changed=changed,
        modules=sorted(m.__name__ for m in modules),
        names=names,
        devices=[str(d) for d in jax.devices()],  # JAX starts here, after every import
    )))
    """
)

DEVICES = "import json, jax; print('RESULT' + json.dumps([str(d) for d in jax.devices()]))"


def _result(script: str) -> object:
    # The suite's own environment, without any device count: what a user's plain shell has.
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    return json.loads(line[len("RESULT") :])


@pytest.fixture(scope="module")
def imported():
    return _result(SCRIPT)


def test_every_public_module_and_name_was_imported(imported):
    for name in ("shapeml", "shapeml.nn", "shapeml.optim", "shapeml.training", "shapeml.state"):
        assert name in imported["modules"]
    for name in ("shapeml.sharding", "shapeml.distributed", "shapeml.hoisting", "shapeml.int8"):
        assert name in imported["modules"]
    for name in ("shapeml.zoo.spotter", "shapeml.zoo.mixer", "shapeml.zoo.transformer"):
        assert name in imported["modules"]
    for name in ("shapeml.zoo.gpt2", "shapeml.data", "shapeml.testing", "shapeml.cli"):
        assert name in imported["modules"]
    assert imported["names"] > 100


def test_the_environment_is_unchanged(imported):
    assert imported["changed"]["environ_keys"] == []


def test_no_hook_is_installed(imported):
    assert not imported["changed"]["excepthook"]
    assert not imported["changed"]["displayhook"]


def test_the_import_machinery_is_unchanged(imported):
    assert not imported["changed"]["meta_path"]
    assert not imported["changed"]["path_hooks"]


def test_no_jax_option_is_changed(imported):
    assert imported["changed"]["config_keys"] == []


def test_jax_sees_the_same_devices_as_without_shapeml(imported):
    assert imported["devices"] == _result(DEVICES)
