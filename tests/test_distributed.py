"""Past one process, in this process: the launcher, joining a job, batches split by process, mesh
kinds, and sharded checkpoints on one device (their multi-process runs: test_multiprocess.py)."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

import shapeml as sm
from shapeml import cli, distributed, optim, sharding
from shapeml.data import batches
from shapeml.training import TrainStep, train
from shapeml.zoo import spotter

PY = sys.executable


# -- the launcher ---------------------------------------------------------------------------------
def test_launch_gives_each_process_the_job_settings_and_tags_its_lines():
    out = io.StringIO()
    code = "import os; print(*(os.environ.get(k) for k in ('SHAPEML_PROCESS_ID', " + (
        "'SHAPEML_PROCESSES', 'SHAPEML_COORDINATOR', 'JAX_NUM_CPU_DEVICES', 'XLA_FLAGS')))"
    )
    parent = {"XLA_FLAGS": "--xla_cpu_use_xnnpack=false --xla_force_host_platform_device_count=4"}
    env = {**os.environ, **parent, "JAX_NUM_CPU_DEVICES": "4"}
    run = distributed.launch([PY, "-c", code], processes=3, devices_per_process=2, out=out, env=env)
    assert run == 0
    lines = sorted(out.getvalue().splitlines())
    assert [ln.split()[:3] for ln in lines] == [[f"[{i}]", str(i), "3"] for i in range(3)]
    address = {ln.split()[3] for ln in lines}
    assert len(address) == 1 and address.pop().startswith("127.0.0.1:")
    # the launcher's count, whatever the parent's environment said; its other XLA flags kept
    assert all(ln.endswith(" 2 --xla_cpu_use_xnnpack=false") for ln in lines)


# The parent's environment forces 4 devices; each process gets the launcher's count.
FOUR = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}


@pytest.mark.parametrize(
    ("flags", "parent", "want"),
    [
        ([], FOUR, 1),
        (["--devices-per-process", "2"], {**FOUR, "JAX_NUM_CPU_DEVICES": "4"}, 2),
    ],
)
def test_shapeml_launch_decides_each_processs_devices(flags, parent, want):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    code = "import shapeml, jax; print(jax.local_device_count())"
    run = subprocess.run(
        [PY, "-m", "shapeml.cli", "launch", "--processes", "2", *flags, "--", PY, "-c", code],
        env={**env, **parent},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert sorted(run.stdout.splitlines()) == [f"[0] {want}", f"[1] {want}"]


def test_launch_reports_the_failed_process_and_stops_the_others_after_the_grace_period():
    # process 1 fails at once; process 0 would sleep for a minute
    code = "import os, sys, time; i = int(os.environ['SHAPEML_PROCESS_ID'])\n" + (
        "time.sleep(60) if i == 0 else sys.exit(3)"
    )
    with pytest.raises(distributed.LaunchError) as e:
        distributed.launch([PY, "-c", code], processes=2, grace=0.5, out=io.StringIO())
    assert e.value.code == "E2201" and e.value.exit_code == 3
    assert "process 1 of 2 exited with status 3; process 0 was still running after a grace " in str(
        e.value
    )


def test_launch_stops_a_job_past_its_timeout():
    with pytest.raises(distributed.LaunchError, match=r"ran past its timeout of 0.5 s") as e:
        distributed.launch(
            [PY, "-c", "import time; time.sleep(60)"], processes=2, timeout=0.5, out=io.StringIO()
        )
    assert e.value.exit_code == 124


def test_shapeml_launch_runs_the_command_after_the_separator(capsys):
    assert cli.main(["launch", "--processes", "2", "--", PY, "-c", "print('hi')"]) == 0
    assert sorted(capsys.readouterr().out.splitlines()) == ["[0] hi", "[1] hi"]
    assert cli.main(["launch", "--processes", "2", "--", PY, "-c", "import sys; sys.exit(5)"]) == 5
    # both fail; whichever the launcher sees first is named
    err = capsys.readouterr().err
    assert re.match(r"error: \[E2201\] process [01] of 2 exited with status 5", err), err
    assert cli.main(["launch", "--processes", "2"]) == 2
    assert "[E2101] shapeml launch got no command to run" in capsys.readouterr().err


# -- joining a job --------------------------------------------------------------------------------
def test_initialize_alone_is_a_single_process(monkeypatch):
    for k in ("SHAPEML_PROCESSES", "SHAPEML_PROCESS_ID", "SHAPEML_COORDINATOR"):
        monkeypatch.delenv(k, raising=False)
    # a pod of Kubernetes without its client package: JAX's probe would warn; no cluster here
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setitem(sys.modules, "kubernetes", None)
    info = distributed.initialize()
    assert info == distributed.ProcessInfo(0, 1, jax.local_device_count(), jax.device_count(),
                                           "single process")  # fmt: skip
    assert info.is_main


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SHAPEML_PROCESSES": "2", "SHAPEML_PROCESS_ID": "2"}, "settings are malformed"),
        ({"SHAPEML_PROCESSES": "two", "SHAPEML_PROCESS_ID": "0"}, "settings are malformed"),
        ({"SHAPEML_PROCESSES": "2", "SHAPEML_PROCESS_ID": "0", "SHAPEML_COORDINATOR": "here"},
         "is not HOST:PORT"),
        ({"SHAPEML_PROCESSES": "2", "SHAPEML_PROCESS_ID": "0",
          "SHAPEML_COORDINATOR": "127.0.0.1:1"}, "after JAX started"),
    ],
)  # fmt: skip
def test_initialize_refuses_bad_settings_and_a_late_call(monkeypatch, env, message):
    jax.devices()  # JAX has started in this process
    monkeypatch.setenv("SHAPEML_COORDINATOR", "127.0.0.1:1")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(distributed.InitializeError, match=message) as e:
        distributed.initialize()
    assert e.value.code == "E2202"


# -- batches split by process ---------------------------------------------------------------------
def test_the_parts_of_every_batch_put_together_are_the_whole_batch():
    x = np.arange(40).reshape(20, 2)
    whole = list(batches(x, batch_size=8, seed=1, epochs=2))
    parts = [list(batches(x, batch_size=8, seed=1, epochs=2, part=(i, 4))) for i in range(4)]
    assert len(whole) == 4 and all(len(p) == 4 for p in parts)
    for j, (w,) in enumerate(whole):
        np.testing.assert_array_equal(np.concatenate([p[j][0] for p in parts]), w)


@pytest.mark.parametrize(
    ("part", "code"), [((0, 3), "E0002"), ((2, 2), "E0002"), ((0, 0), "E0002"), (3, "E0003")]
)
def test_a_part_must_split_the_batch_evenly(part, code):
    with pytest.raises(sm.ShapemlError) as e:
        batches(np.zeros((10, 2)), batch_size=4, part=part)
    assert e.value.code == code


def test_one_process_feeds_the_whole_batch():
    mesh = sharding.make_mesh("data=1")
    assert sharding.batch_part(mesh) == (0, 1) and sharding.batch_part(mesh, None) == (0, 1)
    x = np.arange(6.0).reshape(3, 2)
    placed = sharding.place_local_batch((x,), mesh)[0]
    np.testing.assert_array_equal(np.asarray(placed), x)
    with pytest.raises(sharding.UnknownMeshAxisError):
        sharding.batch_part(mesh, "batch")


# -- mesh kinds -----------------------------------------------------------------------------------
def test_make_mesh_makes_auto_or_explicit_axes():
    assert sharding.make_mesh("data=1").axis_types == (AxisType.Auto,)
    assert sharding.make_mesh("data=1", axis_types="explicit").axis_types == (AxisType.Explicit,)
    mixed = sharding.make_mesh({"data": 1, "model": 1}, axis_types=("explicit", AxisType.Auto))
    assert mixed.axis_types == (AxisType.Explicit, AxisType.Auto)
    for bad in ("manual", ("auto",), 3):
        with pytest.raises(sharding.MeshSpecError):
            sharding.make_mesh({"data": 1, "model": 1}, axis_types=bad)


def _linear_loss(m, x, y):
    return jnp.mean((m(x) - y) ** 2)


def _regression(n: int = 64):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 8)).astype(np.float32)
    return x, (x @ rng.standard_normal((8, 4))).astype(np.float32)


def test_a_train_step_on_an_explicit_mesh_keeps_the_model_typed_and_equals_no_mesh():
    m = sm.nn.Linear.init(seed=0, In=8, Out=4)
    x, y = _regression(8)
    mesh = sharding.make_mesh("data=1", axis_types="explicit")
    placed = TrainStep(_linear_loss, m, optim.sgd(m, lr=0.1), mesh=mesh, rules={"In": "data"})
    plain = TrainStep(_linear_loss, m, optim.sgd(m, lr=0.1))
    for _ in range(2):
        np.testing.assert_allclose(placed(x, y), plain(x, y), rtol=1e-6)
    assert placed.model.w.sharding.mesh.axis_types == (AxisType.Explicit,)
    assert placed.compiled_count() == 1


# -- sharded checkpoints on one device -------------------------------------------------------------
@pytest.fixture
def state():
    m = sm.nn.Linear.init(seed=0, In=8, Out=4)
    opt = optim.adamw(m, lr=1e-3)
    return optim.update(m, opt, sm.grad(_linear_loss, m, *map(jnp.asarray, _regression(8))))


def _same(a, b) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(np.array_equal(x, z) for x, z in zip(la, lb))


def test_a_checkpoint_manager_restores_bit_for_bit_and_keeps_the_last_n(tmp_path, state):
    m, opt = state
    with distributed.CheckpointManager(tmp_path / "ckpt", keep=2) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(step, m, opt)
        ckpt.wait()
        assert ckpt.steps() == [2, 3] and ckpt.latest_step() == 3
        m2, opt2 = ckpt.restore_training(sm.nn.Linear)  # rebuilt from its description
        assert _same((m2, opt2), (m, opt)) and type(opt2) is type(opt)
        assert _same(ckpt.restore(sm.nn.Linear, step=2), m)
        m3, _ = ckpt.restore_training(sm.nn.Linear, like=opt, mesh=sharding.make_mesh("data=1"),
                                      rules={"Out": "data"})  # fmt: skip
        assert m3.w.sharding.spec == jax.sharding.PartitionSpec(None, "data")
    assert distributed.CheckpointManager(tmp_path / "ckpt").steps() == [2, 3]


def test_a_checkpoint_manager_checks_what_it_restores_before_reading(tmp_path, state):
    m, opt = state
    ckpt = distributed.CheckpointManager(tmp_path / "ckpt", async_save=False)

    def code(f):
        with pytest.raises(sm.ShapemlError) as e:
            f()
        return e.value.code

    Linear = sm.nn.Linear
    assert code(lambda: ckpt.restore(Linear)) == "E2205"  # nothing saved yet
    ckpt.save(1, m)  # the model alone
    assert code(lambda: ckpt.restore(Linear, step=5)) == "E2205"
    assert code(lambda: ckpt.restore_training(Linear)) == "E1301"  # no optimizer
    assert code(lambda: ckpt.restore(like=Linear.init(seed=0, In=16, Out=4))) == "E1303"
    assert code(lambda: ckpt.restore(spotter.Spotter)) == "E1303"
    assert code(lambda: ckpt.save(1, m)) == "E0002"  # a step is saved once
    assert code(lambda: ckpt.save(2, m.replace(w=m.w * jnp.nan))) == "E1307"
    assert code(lambda: ckpt.restore(Linear, rules={"In": "data"})) == "E0002"
    assert ckpt.steps() == [1]
    ckpt.save(2, m.replace(w=m.w * jnp.nan), allow_nonfinite=["model.w"])
    assert ckpt.steps() == [1, 2]


def test_without_orbax_the_manager_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "orbax.checkpoint", None)
    with pytest.raises(distributed.OrbaxMissingError, match=r"shapeml\[distributed\]") as e:
        distributed.CheckpointManager(tmp_path)
    assert e.value.code == "E2204"


def test_train_resumes_from_a_checkpoint_manager_like_an_uninterrupted_run(tmp_path):
    m = sm.nn.Linear.init(seed=0, In=8, Out=4)
    x, y = _regression()

    def run(steps, ckpt):
        data = batches(x, y, batch_size=16, seed=0, epochs=None)
        return train(_linear_loss, m, optim.adamw(m, lr=0.05), data, steps=steps,
                     checkpoint=ckpt, checkpoint_every=2, resume=True, progress=False)  # fmt: skip

    whole = run(6, None)
    ckpt = distributed.CheckpointManager(tmp_path / "ckpt", keep=5)
    run(4, ckpt)
    assert ckpt.steps() == [2, 4]
    resumed = run(6, ckpt)
    assert ckpt.steps() == [2, 4, 6]
    assert _same((resumed.model, resumed.opt), (whole.model, whole.opt))
    assert int(resumed.opt.step) == 6


def test_a_save_killed_mid_write_is_never_taken_as_complete(tmp_path):
    # A 64 MB state: `save` returns before its background write ends, and the process dies then.
    script = textwrap.dedent(
        f"""
        import os, signal
        import jax.numpy as jnp
        from shapeml import distributed, nn
        m = nn.Linear(w=jnp.ones((2048, 8192)), b=jnp.ones((8192,)), dims=dict(In=2048, Out=8192))
        ckpt = distributed.CheckpointManager({str(tmp_path / "ckpt")!r})
        ckpt.save(1, m)
        ckpt.wait()
        ckpt.save(2, m.replace(w=m.w * 2))
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([PY, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-3000:]
    ckpt = distributed.CheckpointManager(tmp_path / "ckpt")
    assert ckpt.steps() == [1]
    back = ckpt.restore(sm.nn.Linear)
    assert float(back.w.min()) == float(back.w.max()) == 1.0
