"""The soak job: what hung in the field (a 2 processes x 2 devices job training with an `eval_fn`
and a `CheckpointManager` on a loaded 2-core machine) run under a CPU hog. It must either finish,
equal to one device, or stop with a coded error within the job's bound; never hang. It also
checks, on the job's result, the FSDP preset's memory and `sm.save` from every process.

`benchmarks/soak.py` runs the longer version (many jobs, 2 x 2 and 2 x 1, every zoo model).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import numpy as np
from _forced_devices import forced_env

import shapeml as sm
from shapeml import distributed, optim
from shapeml.data import batches
from shapeml.training import train

sys.path.insert(0, str(Path(__file__).parent))
WORKER = Path(__file__).with_name("soak_worker.py")
COLLECTIVE_TIMEOUT = 60  # seconds: the worker's watchdog deadline for one wait
BOUND = 240  # seconds: the launcher's limit, far past where the watchdog must have acted
HOG = "while True: pass"


def run_job(out: Path, model: str, steps: int, devices: int) -> tuple[float, str, Exception | None]:
    """One job of 2 processes x `devices` under the launcher: (seconds, log, its error or None)."""
    log = io.StringIO()
    command = [sys.executable, str(WORKER), str(out), model, str(steps), str(COLLECTIVE_TIMEOUT)]
    start = time.monotonic()
    try:
        distributed.launch(command, processes=2, devices_per_process=devices, grace=10,
                           timeout=BOUND, out=log, env=forced_env())  # fmt: skip
    except distributed.LaunchError as e:
        return time.monotonic() - start, log.getvalue(), e
    return time.monotonic() - start, log.getvalue(), None


def reference(model: str, steps: int) -> dict[str, np.ndarray]:
    """The same training on one device, in this process."""
    from soak_worker import setup

    m, loss, arrays = setup(model)
    data = batches(*arrays, batch_size=8, seed=1, epochs=None)
    r = train(loss, m, optim.sgd(m, lr=0.05, momentum=0.9), data, steps=steps, progress=False)
    leaves = jax.tree_util.tree_leaves_with_path(r.model)
    return {jax.tree_util.keystr(p, simple=True, separator="."): np.asarray(v) for p, v in leaves}


def test_a_two_by_two_job_under_load_finishes_equal_to_one_device_or_stops_coded(tmp_path):
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(2)]
    refs: dict = {}  # the one-device reference, computed here while the job runs
    worker = threading.Thread(target=lambda: refs.setdefault("gpt2", reference("gpt2", 8)))
    worker.start()
    try:
        seconds, log, error = run_job(tmp_path, "gpt2", 8, 2)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        worker.join()
    if error is not None:  # a clean failure: coded, within the bound, never the launcher's timeout
        assert error.exit_code != 124, (str(error), log[-3000:])
        assert "E2207" in log or "E2203" in log, (str(error), log[-3000:])
        assert seconds < BOUND, seconds
        return
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["info"] == [0, 2, 2, 4], result
    # FSDP over the job's 4 devices: each holds a quarter of the params and optimizer state
    assert result["ratio"] <= 0.3, result
    final = dict(np.load(tmp_path / "final.npz"))
    want = refs["gpt2"]
    assert sorted(final) == sorted(want)
    for k, v in want.items():
        assert np.max(np.abs(final[k] - v)) <= 1e-4 * max(1.0, float(np.max(np.abs(v)))), k
    # `sm.save` called by both processes wrote one file, the gathered model, bit for bit
    assert result["path"] == str(tmp_path / "model.safetensors")
    loaded = sm.load(tmp_path / "model.safetensors", type(_model("gpt2")))
    got = {
        jax.tree_util.keystr(p, simple=True, separator="."): np.asarray(v)
        for p, v in jax.tree_util.tree_leaves_with_path(loaded)
    }
    assert sorted(got) == sorted(final)
    assert all(np.array_equal(got[k], final[k]) for k in final)
    # and a replicated model saved by process 0 alone is the same file's tensors
    rep = sm.load(tmp_path / "replicated.safetensors", type(_model("gpt2")))
    assert all(
        np.array_equal(np.asarray(v), final[jax.tree_util.keystr(p, simple=True, separator=".")])
        for p, v in jax.tree_util.tree_leaves_with_path(rep)
    )
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], list(tmp_path.iterdir())


def _model(name: str):
    from soak_worker import setup

    return setup(name)[0]


STUCK = """
import sys, time
from shapeml import distributed
info = distributed.initialize(collective_timeout=4)
import numpy as np
import shapeml as sm
from shapeml import nn, optim, sharding
from shapeml.training import TrainStep
mesh = sharding.make_mesh("data=2")
m = sm.shard(nn.Linear.init(seed=0, In=4, Out=8), mesh, sharding.fsdp("data"))
if info.index == 1:  # never takes part in anything again
    time.sleep(300)
try:
    sm.save(sys.argv[1], m)  # process 1 never calls it
except sm.ShapemlError as e:
    print("SAVE", e.code, flush=True)
step = TrainStep(lambda m, x: (m(x) ** 2).mean(), m, optim.sgd(m, lr=0.1), mesh=mesh,
                 rules=sharding.fsdp("data"))
step(np.ones((2, 4), np.float32))  # its collective never completes: the watchdog ends it
step(np.ones((2, 4), np.float32))
print("NOT REACHED", flush=True)
"""


def test_a_wait_that_never_ends_is_a_coded_error_and_an_exit(tmp_path):
    # Process 1 stops taking part: process 0's `sm.save` is E2208 (not every process called it)
    # and its TrainStep's first collective passes the job's collective timeout of 4 s: E2207 and
    # status 1 (then JAX's coordination service ends process 1), within seconds, not at the
    # launcher's timeout.
    log = io.StringIO()
    start = time.monotonic()
    try:
        distributed.launch([sys.executable, "-c", STUCK, str(tmp_path / "m.safetensors")],
                           processes=2, grace=1, timeout=BOUND, out=log, env=forced_env())  # fmt: skip
    except distributed.LaunchError as e:
        error = e
    else:
        raise AssertionError(log.getvalue()[-3000:])
    text = log.getvalue()
    assert error.exit_code != 124, (str(error), text[-3000:])  # not the launcher's timeout
    assert "[0] SAVE E2208" in text, text[-3000:]
    assert "shapeml.distributed.CollectiveTimeoutError: [E2207]" in text, text[-3000:]
    assert "NOT REACHED" not in text and not (tmp_path / "m.safetensors").exists()
    assert time.monotonic() - start < BOUND
