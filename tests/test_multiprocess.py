"""Real multi-process jobs on this machine: 2 processes x 2 forced CPU devices (gloo collectives,
`jax.distributed` on 127.0.0.1) against 1 process x 4 devices and one device.

Each test runs whole jobs of `tests/multiprocess_worker.py` as subprocesses, concurrently where
they are independent, each under a timeout (the launcher's, and the subprocess's above it) so
nothing can hang the suite. The reference of every numeric check is the one-device run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np

WORKER = Path(__file__).with_name("multiprocess_worker.py")
TIMEOUT = 420  # seconds a job may take on a loaded 2-core machine: the launcher's own limit


def _env(devices: int | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHAPEML_")}
    env["JAX_PLATFORMS"] = "cpu"
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return env


def _launch(mode: str, out: Path, *flags: str) -> subprocess.CompletedProcess:
    """`shapeml launch` of 2 processes x 2 devices, each running the worker in `mode`."""
    out.mkdir(exist_ok=True)
    command = [sys.executable, "-m", "shapeml.cli", "launch", "--processes", "2"]
    command += ["--devices-per-process", "2", "--timeout", str(TIMEOUT), *flags, "--"]
    command += [sys.executable, str(WORKER), mode, str(out)]
    return subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=TIMEOUT + 60)


def _single(mode: str, out: Path) -> subprocess.CompletedProcess:
    """One process of 4 forced devices running the worker in `mode`."""
    out.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, str(WORKER), mode, str(out)],
        env=_env(4),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def _ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])


def _both(a, b):
    """Runs two jobs at once (their processes share the cores, their waits overlap)."""
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("a", a()))
    t.start()
    out["b"] = b()
    t.join()
    return out["a"], out["b"]


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    """The largest difference relative to the reference's largest entry."""
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


def _read(out: Path, name: str) -> tuple[dict, dict]:
    return json.loads((out / f"{name}.json").read_text()), dict(np.load(out / f"{name}.npz"))


def test_two_processes_train_like_one_device_and_checkpoints_move_between_layouts(tmp_path):
    two, one = tmp_path / "2x2", tmp_path / "1x4"
    multi, single = _both(lambda: _launch("train", two), lambda: _single("train", one))
    _ok(multi)
    _ok(single)
    restore = _single("restore", two)  # the 2-process checkpoint, read by one process
    _ok(restore)

    res2, arr2 = _read(two, "train")
    res1, arr1 = _read(one, "train")
    assert res2["info"] == [0, 2, 2, 4] and res1["info"] == [0, 1, 4, 4]
    # Six steps of the Spotter and of the nn-built transformer, under FSDP and tensor-parallel
    # tables, on Auto and Explicit meshes, on 2 x 2 and 1 x 4 devices: all equal one device.
    runs = {**{k: (v, arr2) for k, v in res2.items() if k.count("/") == 2},
            **{k: (v, arr1) for k, v in res1.items() if k.count("/") == 2}}  # fmt: skip
    assert sorted(runs) == sorted(
        f"{m}/{t}/{k}" for m in ("spotter", "tiny") for t in ("fsdp", "tp")
        for k in ("auto", "explicit")
    )  # fmt: skip
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
        assert res["layout"] and res["split"] > 0, (name, res["rules"], res["split"])
        assert res["kinds"] == ["Auto" if kind == "auto" else "Explicit"], (name, res["kinds"])

    # errors that need several processes, each coded
    assert res2["errors"] == {
        "file_checkpoint": "E2206",
        "layout": "E1907",
        "restore_without_mesh": "E0002",
    }

    # the checkpoint 2 processes wrote (tensor parallel, Explicit axes), restored by one process
    # onto the FSDP table (Auto axes) and onto one device: bit for bit
    back = json.loads((two / "restore.json").read_text())
    assert back["steps"] == [6] and back["opt_step"] == 6
    assert back["bit_for_bit"] and back["one_device"] and back["layout"], back
    # sm.shard, sm.save and sharding.load on an Explicit mesh keep the kind, the layout, the values
    assert back["explicit"] == {"types": ["Explicit"], "layout": True, "values": True}


def test_a_killed_process_stops_the_job_and_the_job_resumes_to_the_same_result(tmp_path):
    # Process 1 kills itself once checkpoint 4 is complete: process 0 stops with E2203 at its
    # next step, the launcher reports E2201 and kills what still runs after its grace period.
    killed = _launch("kill", tmp_path, "--grace", "5")
    assert killed.returncode == 128 + 9, (killed.stdout[-3000:], killed.stderr[-3000:])
    last = killed.stderr.strip().splitlines()[-1]
    assert last.startswith("error: [E2201] process 1 of 2 was killed by SIGKILL"), last
    survivor = (tmp_path / "kill_error_0.txt").read_text()
    assert survivor.startswith("E2203") and "another process of the job has stopped" in survivor
    ref, ref_arrays = _read(tmp_path, "kill")
    assert not (tmp_path / "kill_error_1.txt").exists()

    # the same job again resumes from checkpoint 4 and ends where an uninterrupted run ends
    resumed = _launch("resume", tmp_path)
    _ok(resumed)
    res, arrays = _read(tmp_path, "resume")
    assert res["steps"] == [4, 6]  # keep=2: the two latest complete checkpoints
    assert np.allclose(res["losses"], ref["losses"][4:], rtol=1e-6, atol=0), (res, ref)
    final = {k[len("final/") :]: v for k, v in arrays.items()}
    assert sorted(final) == sorted(k[len("ref/") :] for k in ref_arrays)
    for k, v in final.items():
        np.testing.assert_allclose(v, ref_arrays[f"ref/{k}"], rtol=1e-6, atol=0, err_msg=k)
