"""Every core, explicitly (`sm.use_cpu_devices`), in subprocesses: JAX reads the device count once,
when its backend starts, so each case is a fresh interpreter."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

import shapeml as sm

TRAJECTORIES = textwrap.dedent(
    """
    import json
    import jax, numpy as np
    import shapeml as sm
    from shapeml import nn, optim
    from shapeml.training import TrainStep

    made = sm.use_cpu_devices(3)

    def loss(m, x, y):
        return ((m(x) - y) ** 2).mean()

    def trajectory(rows, **kw):
        m = nn.MLP.init(seed=0, D=4, F=8)
        step = TrainStep(loss, m, optim.adam(m, lr=1e-2), **kw)
        rng = np.random.default_rng(0)
        out = []
        for _ in range(5):
            x = rng.normal(size=(rows, 4)).astype(np.float32)
            out.append(float(step(x, np.sin(x))))
        return out, len(step.model.up.w.sharding.device_set)

    out = dict(made=made, devices=jax.device_count())
    out["split"], out["split_on"] = trajectory(18)
    out["one"], out["one_on"] = trajectory(18, devices=1)
    out["odd"], _ = trajectory(19)
    out["odd_one"], _ = trajectory(19, devices=1)
    print("RESULT" + json.dumps(out))
    """
)


def _run(script: str, **env) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ("JAX_NUM_CPU_DEVICES", "XLA_FLAGS")}
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env={**base, "JAX_PLATFORMS": "cpu", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    return json.loads(line[len("RESULT") :])


@pytest.fixture(scope="module")
def three():
    return _run(TRAJECTORIES)


def test_asking_for_devices_makes_them_and_train_step_splits_the_batch(three):
    assert three["made"] == 3 and three["devices"] == 3
    assert three["split_on"] == 3 and three["one_on"] == 1


def test_the_split_step_follows_the_one_device_trajectory(three):
    for split, one in zip(three["split"], three["one"]):
        assert split == pytest.approx(one, rel=1e-5, abs=1e-6)


def test_a_batch_the_devices_do_not_divide_trains_the_same(three):
    for odd, one in zip(three["odd"], three["odd_one"]):
        assert odd == pytest.approx(one, rel=1e-5, abs=1e-6)


COUNT = (
    "import json, jax, shapeml as sm\n"
    "made = sm.use_cpu_devices()\n"
    "print('RESULT' + json.dumps(dict(made=made, devices=jax.local_device_count())))\n"
)


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({}, min(len(os.sched_getaffinity(0)), 8)),  # one device per usable core, at most 8
        ({"JAX_NUM_CPU_DEVICES": "2"}, 2),  # as `shapeml launch` sets it for each process
        ({"XLA_FLAGS": "--xla_force_host_platform_device_count=3"}, 3),
    ],
)
def test_the_default_count_is_one_per_core_unless_the_process_was_given_one(env, want):
    assert _run(COUNT, **env) == {"made": want, "devices": want}


STARTED = textwrap.dedent(
    """
    import json, jax, shapeml as sm
    jax.numpy.zeros(2).block_until_ready()  # JAX starts, with one CPU device
    out = dict(same=sm.use_cpu_devices(1))
    try:
        sm.use_cpu_devices(2)
    except sm.ShapemlError as e:
        out["code"], out["message"] = e.code, str(e)
    out["devices"] = jax.local_device_count()
    print("RESULT" + json.dumps(out))
    """
)


def test_asking_after_jax_started_is_a_coded_error_naming_both_counts_and_the_fix():
    out = _run(STARTED)
    assert out["same"] == 1 and out["devices"] == 1  # asking for what it has: quiet
    assert out["code"] == "E1908"
    assert "asked for 2 CPU device(s), but JAX has already started with 1" in out["message"]
    assert "call sm.use_cpu_devices() first" in out["message"]


@pytest.mark.parametrize(("n", "code"), [(0, "E0002"), (2.5, "E0003"), ("4", "E0003")])
def test_a_count_that_is_not_a_positive_whole_number_is_refused(n, code):
    with pytest.raises(sm.ShapemlError) as info:
        sm.use_cpu_devices(n)
    assert info.value.code == code
