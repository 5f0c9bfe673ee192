"""Real multi-process jobs on this machine: 2 processes x 2 forced CPU devices (gloo collectives,
`jax.distributed` on 127.0.0.1) against 1 process x 4 devices and one device.

One pipeline (the module fixture `jobs`) runs every multi-process case of the suite once, as
whole jobs of `tests/multiprocess_worker.py` and of a cluster-joining script, concurrently where
they are independent, each under a timeout (the launcher's, and the subprocess's above it) so
nothing can hang the suite; the tests check its results. The reference of every numeric check is
the one-device run. A new multi-process case joins the pipeline rather than starting its own
processes.
"""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from _forced_devices import forced_env

from shapeml import distributed

WORKER = Path(__file__).with_name("multiprocess_worker.py")
TIMEOUT = 420  # seconds a job may take on a loaded 2-core machine: the launcher's own limit


def _env(cache: Path, devices: int | None = None) -> dict[str, str]:
    """XLA's cheaper CPU compile (`forced_env`; the same for the references), and one compilation
    cache for the jobs of a test (the killed and the resumed job run the first job's step again)."""
    env = forced_env(devices)
    env["JAX_COMPILATION_CACHE_DIR"] = str(cache)
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    return env


def _launch(mode: str, out: Path, grace: float = 30) -> distributed.LaunchError | None:
    """A job of 2 processes x 2 devices, each running the worker in `mode` (the launcher's own
    command line is tested in test_distributed.py); its error, or None."""
    out.mkdir(exist_ok=True)
    command = [sys.executable, str(WORKER), mode, str(out)]
    log = io.StringIO()
    try:
        distributed.launch(command, processes=2, devices_per_process=2, grace=grace,
                           timeout=TIMEOUT, out=log, env=_env(out.parent / "cache"))  # fmt: skip
    except distributed.LaunchError as e:
        e.log = log.getvalue()
        return e
    return None


def _single(mode: str, out: Path, job: Path) -> subprocess.CompletedProcess:
    """One process of 4 forced devices running the worker in `mode`."""
    out.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, str(WORKER), mode, str(out), str(job)],
        env=_env(out.parent / "cache", 4),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def _ok(job: subprocess.CompletedProcess | distributed.LaunchError | None) -> None:
    if isinstance(job, subprocess.CompletedProcess):
        assert job.returncode == 0, (job.stdout[-3000:], job.stderr[-3000:])
    else:
        assert job is None, (str(job), job.log[-3000:])


def _all(*jobs):
    """Runs jobs at once (their waits overlap); their results, in order."""
    out = [None] * len(jobs)

    def run(i):
        out[i] = jobs[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(1, len(jobs))]
    for t in threads:
        t.start()
    run(0)
    for t in threads:
        t.join()
    return out


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    """The largest difference relative to the reference's largest entry."""
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


def _read(out: Path, name: str) -> tuple[dict, dict]:
    return json.loads((out / f"{name}.json").read_text()), dict(np.load(out / f"{name}.npz"))


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Every multi-process job of the suite, concurrent where independent (a job is a few
    processes importing JAX and compiling a step or two: the suite's time goes there, so they are
    few and share work):
      2 x 2 `train` (its Spotter run is also the reference of the resumed job below)
      then, at once: 1 x 4 `train` (the one-device references, and the 2 x 2 checkpoint restored
      in one process), 2 x 2 `kill`, and 2 processes joining from a cluster's environment;
      then 2 x 2 `resume`."""
    tmp_path = tmp_path_factory.mktemp("multiprocess")
    two, one = tmp_path / "2x2", tmp_path / "1x4"
    trained = _launch("train", two)
    single, killed, cluster = _all(
        lambda: _single("train", one, two),
        lambda: _launch("kill", two, grace=20),
        lambda: _cluster(tmp_path),
    )
    resumed = _launch("resume", two)
    return dict(two=two, one=one, trained=trained, single=single, killed=killed,
                cluster=cluster, resumed=resumed)  # fmt: skip


def test_jobs_of_two_processes_train_like_one_device(jobs):
    two, one = jobs["two"], jobs["one"]
    _ok(jobs["trained"])
    _ok(jobs["single"])
    res2, arr2 = _read(two, "train")
    res1, arr1 = _read(one, "train")
    assert res2["info"] == [0, 2, 2, 4] and res1["info"] == [0, 1, 4, 4]
    # Six steps of the Spotter and of the nn-built transformer, under one table that is FSDP on
    # `data` and tensor parallel on `model`, on Auto and Explicit meshes, on 2 processes x 2
    # devices and 1 process x 4 devices: all equal one device.
    runs = {**{k: (v, arr2) for k, v in res2.items() if k.count("/") == 2},
            **{k: (v, arr1) for k, v in res1.items() if k.count("/") == 2}}  # fmt: skip
    assert sorted(runs) == sorted(
        f"{m}/2d/{k}" for m in ("spotter", "tiny") for k in ("auto", "explicit")
    )
    for name, (res, arrays) in runs.items():
        model, _, kind = name.split("/")
        ref = res1[f"ref/{model}"]
        losses = np.array(res["losses"])
        assert len(losses) == 6 and np.all(np.isfinite(losses)), name
        assert _rel(losses, np.array(ref["losses"])) < 1e-4, (name, losses, ref["losses"])
        params = [k[len(name) + 1 :] for k in arrays if k.startswith(name + "/")]
        assert params, name
        for k in params:
            got, want = arrays[f"{name}/{k}"], arr1[f"ref/{model}/{k}"]
            assert got.shape == want.shape and _rel(got, want) < 1e-4, (name, k, _rel(got, want))
        # the rules split both mesh axes, the model kept its layout and its mesh kind
        axes = {a for spec in res["specs"] for a in spec if a}
        assert res["layout"] and axes == {"data", "model"}, (name, res)
        assert res["kinds"] == ["Auto" if kind == "auto" else "Explicit"], (name, res["kinds"])

    # errors that need several processes, each coded
    assert res2["errors"] == {
        "file_checkpoint": "E2206",
        "layout": "E1907",
        "restore_without_mesh": "E0002",
    }

    # The checkpoint 2 processes wrote (the 2-d table, Auto axes), restored by one process onto
    # the FSDP table on Explicit axes and onto one device: bit for bit. Then sm.shard, sm.save and
    # sharding.load on an Explicit mesh keep the kind, the layout and the values.
    back = res1["restore"]
    assert back["steps"] == [6] and back["opt_step"] == 6, back
    assert back["bit_for_bit"] and back["one_device"] and back["layout"], back
    assert back["kinds"] == ["Explicit"], back
    assert back["load"] == {"kinds": ["Explicit"], "layout": True, "values": True}, back


def test_a_killed_process_stops_the_job_coded_and_the_job_resumes_like_one_run(jobs):
    two, killed, resumed = jobs["two"], jobs["killed"], jobs["resumed"]
    _ok(jobs["trained"])
    res2, arr2 = _read(two, "train")
    # Process 1 of the `kill` job killed itself once checkpoint 4 was complete: process 0 stopped
    # with E2203 at its next step and exited (within 3 s), and the launcher reported E2201.
    assert killed is not None and killed.code == "E2201", killed
    assert killed.exit_code == 128 + 9, (str(killed), killed.log[-3000:])
    assert killed.message.startswith("process 1 of 2 was killed by SIGKILL"), killed.message
    # the survivor raised E2203 and exited on its own, within seconds, not killed after the grace
    assert killed.message.endswith("the other processes stopped on their own"), killed.message
    survivor = (two / "kill_error_0.txt").read_text()
    assert survivor.startswith("E2203") and "another process of the job has stopped" in survivor
    assert not (two / "kill_error_1.txt").exists()

    # The same job again resumed from checkpoint 4 and ended where the uninterrupted run ended.
    _ok(resumed)
    res, arrays = _read(two, "resume")
    assert res["steps"] == [4, 6]  # keep=2: the two latest complete checkpoints
    whole = res2["spotter/2d/auto"]
    assert np.allclose(res["losses"], whole["losses"][4:], rtol=1e-6, atol=0), (res, whole)
    final = {k[len("final/") :]: v for k, v in arrays.items()}
    assert sorted(final) == sorted(k for k in params_of(arr2, "spotter/2d/auto"))
    for k, v in final.items():
        np.testing.assert_allclose(v, arr2[f"spotter/2d/auto/{k}"], rtol=1e-6, atol=0, err_msg=k)


def params_of(arrays: dict, name: str) -> list[str]:
    return [k[len(name) + 1 :] for k in arrays if k.startswith(name + "/")]


CLUSTER_SCRIPT = """
from shapeml import distributed
info = distributed.initialize(timeout=120)
import numpy as np
from jax.experimental import multihost_utils
seen = multihost_utils.process_allgather(np.array([10 + info.index]))  # a collective across both
print("RESULT", info.source, info.index, info.count, info.local_devices, info.devices,
      *seen.ravel().tolist())
"""


def _free_port(low: int, high: int) -> int:
    """A port in `low..high` on 127.0.0.1 that nothing listens on now."""
    for port in np.random.default_rng().permutation(np.arange(low, high + 1)).tolist():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port in {low}..{high}")


def _cluster(tmp_path: Path) -> list[tuple[int, str, str]]:
    """Two processes given only SLURM's variables (as `srun --ntasks=2` sets them, both on this
    host), no launcher: `initialize()` reads them through JAX's own cluster detection, and the
    processes meet at the coordinator SLURM's settings name (port from the job id). Each
    process's exit status, stdout and stderr."""
    port = _free_port(61440, 65535)  # JAX's SLURM port: 61440 + the job id % 4096
    env = _env(tmp_path / "cluster-cache", 1)
    env.update(SLURM_JOB_ID=str(port - 61440), SLURM_STEP_NODELIST="127.0.0.1", SLURM_NTASKS="2")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLUSTER_SCRIPT],
            env={**env, "SLURM_PROCID": str(i), "SLURM_LOCALID": str(i)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        outs = [p.communicate(timeout=TIMEOUT) for p in procs]
    finally:
        for p in procs:
            p.kill()
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs, strict=True)]


def test_the_same_script_joins_a_job_from_a_clusters_environment(jobs):
    for status, out, err in jobs["cluster"]:
        assert status == 0, (out[-2000:], err[-3000:])
    lines = sorted(
        ln for _, out, _ in jobs["cluster"] for ln in out.splitlines() if ln.startswith("RESULT")
    )
    assert lines == [f"RESULT cluster {i} 2 1 2 10 11" for i in range(2)], lines
