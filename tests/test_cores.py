"""Every core a device by default (`sm.cpu_devices`, `SHAPEML_CPU_DEVICES`), in subprocesses: the
flag must be set before JAX's backend starts, so each case is a fresh interpreter."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from shapeml import _cores

SCRIPT = textwrap.dedent(
    """
    import json
    import jax, numpy as np
    import shapeml as sm
    from shapeml import nn, optim
    from shapeml.training import TrainStep

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

    d = sm.cpu_devices()
    out = dict(count=d.count, reason=d.reason, devices=jax.device_count())
    if d.count == 3:  # the default case only reports what it decided
        out["split"], out["split_on"] = trajectory(6 * d.count)
        out["one"], out["one_on"] = trajectory(6 * d.count, devices=1)
        out["odd"], _ = trajectory(6 * d.count + 1)
        out["odd_one"], _ = trajectory(6 * d.count + 1, devices=1)
    print("RESULT" + json.dumps(out))
    """
)


def _run(**env) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ("SHAPEML_CPU_DEVICES", "XLA_FLAGS")}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
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
    return _run(SHAPEML_CPU_DEVICES="3")


def test_asking_for_devices_makes_them_and_train_step_splits_the_batch(three):
    assert three["count"] == 3 and three["devices"] == 3, three["reason"]
    assert three["split_on"] == 3 and three["one_on"] == 1


def test_the_split_step_follows_the_one_device_trajectory(three):
    for split, one in zip(three["split"], three["one"]):
        assert split == pytest.approx(one, rel=1e-5, abs=1e-6)


def test_a_batch_the_devices_do_not_divide_trains_the_same(three):
    for odd, one in zip(three["odd"], three["odd_one"]):
        assert odd == pytest.approx(one, rel=1e-5, abs=1e-6)


def test_the_default_is_one_device_per_usable_core():
    out = _run()
    cores = len(os.sched_getaffinity(0))
    want = min(cores, 8) if cores > 1 else None
    assert out["count"] == want and out["devices"] == (want or 1), out["reason"]


@pytest.mark.parametrize(
    ("env", "started", "words"),
    [
        ({"SHAPEML_CPU_DEVICES": "1"}, False, "opted out"),
        ({"SHAPEML_CPU_DEVICES": "off"}, False, "opted out"),
        ({"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}, False, "already sets"),
        ({"SHAPEML_PROCESSES": "2"}, False, "launcher decides"),
        ({}, True, "backend started"),
        ({"SHAPEML_CPU_DEVICES": "many"}, False, "not a count"),
    ],
)
def test_the_user_the_launcher_and_a_started_backend_always_win(env, started, words):
    decision, flags = _cores._decide(env, started, cores=4)
    assert decision.count is None and flags is None and words in decision.reason


def test_the_flag_is_added_to_the_users_other_flags():
    decision, flags = _cores._decide({"XLA_FLAGS": "--xla_cpu_use_xnnpack=false"}, False, cores=16)
    assert decision.count == 8
    assert flags == "--xla_cpu_use_xnnpack=false --xla_force_host_platform_device_count=8"
