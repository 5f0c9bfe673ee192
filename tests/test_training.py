"""The training loop: learning, checkpoints, resume, divergence, no recompiles, data
parallelism (forced host devices in a subprocess) and the `shapeml train`/`eval` commands."""

import gc
import json
import logging
import subprocess
import sys
import textwrap
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float

import shapeml as sm
from shapeml import cli, optim
from shapeml.apps.spotter_job import spotter_loss
from shapeml.data import batches, shapes
from shapeml.training import TrainStep, train
from shapeml.zoo.spotter import Spotter


@pytest.fixture(scope="module")
def small_data():
    return shapes.draw(256, seed=0)


def make(steps=40):
    m = Spotter.init(seed=0)
    return m, optim.adamw(
        m,
        lr=optim.warmup(5, optim.cosine(3e-3, steps)),
        transforms=[optim.clip_norm(1.0)],
        skip_nonfinite=True,
    )


def test_loss_falls_and_history_is_logged(small_data, capsys):
    m, opt = make()
    result = train(
        spotter_loss,
        m,
        opt,
        batches(*small_data, batch_size=32),
        steps=40,
        has_aux=True,
        log_every=10,
        eval_fn=lambda m: {"eval": 1.0},
        eval_every=20,
    )
    losses = [h["loss"] for h in result.history if "loss" in h]
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert {"step": 20, "eval": 1.0} in result.history and result.skipped == 0
    assert int(result.opt.step) == 40
    assert "40/40" in capsys.readouterr().err  # the progress bar


def test_step_compiles_once_donates_its_own_buffers_and_keeps_the_callers(small_data):
    m, opt = make()
    step = TrainStep(spotter_loss, m, opt, has_aux=True)
    img, y = (jnp.asarray(a[:32]) for a in small_data)
    before = step.model.w_e  # the step's own buffer (its carry), not the caller's
    for _ in range(3):
        step(img, y)
    assert step.compiled_count() == 1
    assert before.is_deleted()  # the step's weights were donated and updated in place
    assert float(jnp.sum(m.w_e)) == float(jnp.sum(Spotter.init(seed=0).w_e))  # caller's intact
    assert int(opt.step) == 0 and int(step.opt.step) == 3


def test_a_batch_that_does_not_fit_the_loss_is_a_coded_input_error(small_data):
    m, opt = make()
    step = TrainStep(spotter_loss, m, opt, has_aux=True)
    img, y = (jnp.asarray(a[:32]) for a in small_data)
    with pytest.raises(TypeError, match=r"E1410.*1 input\(s\).*spotter_loss\(m: .*missing.*'y'"):
        step(img)
    with pytest.raises(sm.ShapemlError, match=r"E1410.*3 input\(s\).*too many"):
        step(img, y, y)
    assert int(step.opt.step) == 0 and step.compiled_count() == 0  # nothing ran or was kept
    step(img, y)
    assert int(step.opt.step) == 1


def test_a_new_step_of_the_same_loss_and_layout_reuses_the_compiled_program(small_data):
    img, y = (jnp.asarray(a[:32]) for a in small_data)

    def losses(step):
        return [float(step(img, y)[0]) for _ in range(3)]

    first = TrainStep(spotter_loss, *make(), has_aux=True)
    expected = losses(first)
    again = TrainStep(spotter_loss, *make(), has_aux=True)

    def program(step):
        return step.compiled(img, y).runtime_executable()

    assert program(again) is program(first)  # one program, from jax.jit's cache
    assert losses(again) == expected  # from its own fresh carry: the same trajectory
    assert again.compiled_count() == 1  # the one program, which `first` compiled
    shell = weakref.ref(first._shell)
    del first
    gc.collect()
    assert shell() is None  # the shared program does not keep a dropped step's model alive

    def doubled(m, img, y):
        value, aux = spotter_loss(m, img, y)
        return 2 * value, aux

    other = TrainStep(doubled, *make(), has_aux=True)
    assert program(other) is not program(again)
    assert float(other(img, y)[0]) == pytest.approx(2 * expected[0], rel=1e-6)
    sgd = TrainStep(spotter_loss, Spotter.init(seed=0), optim.sgd(Spotter.init(seed=0), lr=0.1),
                    has_aux=True)  # fmt: skip
    assert program(sgd) is not program(again)  # another optimizer: its own


def test_train_called_again_compiles_nothing(small_data, caplog):
    def run():
        m = Spotter.init(seed=0)
        data = batches(*small_data, batch_size=32)
        return train(spotter_loss, m, optim.adamw(m, lr=1e-3), data, steps=4, has_aux=True)

    first = run()
    gc.collect()  # the first run's step and its shell are gone
    with jax.log_compiles(True), caplog.at_level(logging.WARNING, logger="jax"):
        again = run()
    assert [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()] == []
    for a, b in zip(jax.tree.leaves(first.model), jax.tree.leaves(again.model), strict=True):
        np.testing.assert_array_equal(a, b)


def test_nonfinite_weights_are_never_checkpointed(tmp_path):
    class One(sm.Model):
        dims = sm.Dims(D=2)
        w: Float[Array, " D"] = sm.param(sm.zeros)

    def loss(m, x):  # finite at w = 0, but its gradient there is infinite
        return jnp.sum(jnp.sqrt(jnp.abs(m.w) * x))

    m = One.init()
    ckpt = tmp_path / "c.safetensors"
    ones = ((np.ones(2, np.float32),) for _ in range(9))
    # By default the infinite gradient is skipped and counted: the weights stay finite.
    kept = train(loss, m, optim.sgd(m, lr=0.1), ones, steps=4, checkpoint=ckpt, progress=False)
    assert kept.skipped == 4 and int(kept.opt.step) == 0 and ckpt.exists()
    ckpt.unlink()
    with pytest.raises(FloatingPointError, match="E1701") as e:
        train(
            loss,
            m,
            optim.sgd(m, lr=0.1, skip_nonfinite=False),
            ((np.ones(2, np.float32),) for _ in range(9)),
            steps=4,
            checkpoint=ckpt,
            checkpoint_every=1,
            log_every=1,
            progress=False,
        )
    assert "after step 1 the params `w` hold NaN or inf" in str(e.value)
    assert not ckpt.exists()


def test_resume_equals_uninterrupted_run(small_data, tmp_path):
    straight = train(
        spotter_loss,
        *make(),
        batches(*small_data, batch_size=32),
        steps=40,
        has_aux=True,
        progress=False,
    )
    ckpt = tmp_path / "run.safetensors"
    train(
        spotter_loss,
        *make(),
        batches(*small_data, batch_size=32),
        steps=20,
        has_aux=True,
        checkpoint=ckpt,
        progress=False,
    )
    resumed = train(
        spotter_loss,
        *make(),
        batches(*small_data, batch_size=32),
        steps=40,
        has_aux=True,
        checkpoint=ckpt,
        resume=True,
        progress=False,
    )
    for a, b in zip(jax.tree.leaves(resumed.model), jax.tree.leaves(straight.model)):
        np.testing.assert_array_equal(a, b)
    assert int(resumed.opt.step) == 40


def test_nonfinite_loss_stops_and_keeps_the_last_good_checkpoint(small_data, tmp_path):
    img, y = small_data
    bad = img.astype(np.float32)

    def loss(m, img, y):  # turns NaN once step 25's batch (marked by a label of 9) arrives
        value, aux = spotter_loss(m, img, jnp.minimum(y, 3))
        return jnp.where(jnp.any(y == 9), jnp.nan, value), aux

    def data():
        for i, (x, t) in enumerate(batches(img, y, batch_size=32)):
            yield x, (np.full_like(t, 9) if i >= 24 else t)

    ckpt = tmp_path / "good.safetensors"
    with pytest.raises(FloatingPointError, match="E1701") as e:
        train(
            loss,
            *make(),
            data(),
            steps=40,
            has_aux=True,
            checkpoint=ckpt,
            checkpoint_every=10,
            log_every=5,
            progress=False,
        )
    assert "the loss is nan at step 25" in str(e.value)
    assert f"last good checkpoint is `{ckpt}` (step 20)" in str(e.value)
    m, opt = sm.load_checkpoint(ckpt, Spotter)
    assert int(opt.step) == 20 and all(bool(jnp.isfinite(x).all()) for x in jax.tree.leaves(m))
    assert bad.dtype == np.float32


@pytest.fixture(scope="module")
def two_devices():
    """One subprocess for what needs a fresh process: whether `import shapeml` left JAX's backend
    unstarted (so XLA_FLAGS or `sm.use_cpu_devices` set after it still take effect), then 8 steps
    of `train` on one device and on both of a process made 2 CPU devices."""
    code = textwrap.dedent(
        """
        import json
        import shapeml as sm, shapeml._jax_internals as j
        started = j.backend_started()
        import jax, numpy as np
        from shapeml import optim
        from shapeml.data import batches, shapes
        from shapeml.zoo.spotter import Spotter
        from shapeml.training import train
        from shapeml.apps.spotter_job import spotter_loss
        sm.use_cpu_devices(2)
        img, y = shapes.draw(128, seed=0)
        out = {"started_by_import": started}
        for devices in (1, None):  # one device; every device of the process (2)
            m = Spotter.init(seed=0)
            opt = optim.adamw(m, lr=1e-2, transforms=[optim.clip_norm(1.0)])
            r = train(spotter_loss, m, opt, batches(img, y, batch_size=32), steps=8,
                      has_aux=True, devices=devices, progress=False)
            out[str(devices)] = [np.asarray(x).tolist() for x in jax.tree.leaves(r.model)]
            out[f"on_{devices}"] = len(r.model.w_e.sharding.device_set)
        print(json.dumps({"devices": jax.device_count(), **out}))
        """
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def test_data_parallel_equals_single_device(two_devices):
    res = two_devices
    assert res["devices"] == 2 and res["on_1"] == 1 and res["on_None"] == 2
    for a, b in zip(res["None"], res["1"]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_cli_train_and_eval_end_to_end(tmp_path, capsys):
    out = tmp_path / "spotter.safetensors"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "shapeml.cli",
            "train",
            "--steps",
            "30",
            "--train-size",
            "256",
            "--test-size",
            "64",
            "--out",
            str(out),
            "--checkpoint",
            str(tmp_path / "ck.safetensors"),
            "--checkpoint-every",
            "10",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "held-out accuracy:" in run.stdout and "confusion (rows: true" in run.stdout
    assert "30/30" in run.stderr  # tqdm progress bar
    assert out.exists() and (tmp_path / "ck.safetensors").exists()
    # The other commands in this process: one interpreter start (seconds) is enough to show the
    # module runs as `python -m shapeml.cli`; what is checked of them is the same.
    assert _status(["eval", str(out), "--test-size", "64"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("held-out accuracy:")
    assert _status(["eval", str(tmp_path / "none")]) == 2
    assert "E1304" in capsys.readouterr().err
    assert _status(["train", "--help"]) == 0
    helped = capsys.readouterr().out
    for flag in ("--steps", "--batch-size", "--lr", "--devices", "--checkpoint", "--resume"):
        assert flag in helped


def _status(argv: list[str]) -> int:
    """`cli.main`'s exit status, argparse's exit (for `--help`) included."""
    try:
        return cli.main(argv)
    except SystemExit as e:
        return int(e.code or 0)


def test_importing_shapeml_leaves_jax_backend_unstarted(two_devices):
    # so XLA_FLAGS (e.g. forced host devices) set after `import shapeml` still take effect
    assert two_devices["started_by_import"] is False


class Tiny(sm.Model):
    dims = sm.Dims(I=4, O=2)
    w: Float[Array, "I O"] = sm.param(sm.normal(std=0.5))
    b: Float[Array, " O"] = sm.param(sm.zeros, decay=False)


def tiny_loss(m, x, y):
    return jnp.mean((x @ m.w + m.b[None] - y) ** 2)


def tiny_batches(n=40):
    rng = np.random.default_rng(0)
    return [
        (rng.normal(size=(8, 4)).astype(np.float32), rng.normal(size=(8, 2)).astype(np.float32))
        for _ in range(n)
    ]


def test_accumulate_and_ema_options_equal_the_optimizer_built_with_them(tmp_path):
    data = tiny_batches()
    m = Tiny.init(seed=0)
    result = train(
        tiny_loss,
        m,
        optim.adamw(m, lr=0.05),
        data,
        steps=4,
        accumulate=3,
        ema=0.9,
        log_every=2,
        progress=False,
    )
    assert [h["step"] for h in result.history] == [2, 4]  # steps count updates
    assert result.opt.accumulate == 3 and int(result.opt.step) == 12  # 12 batches taken
    ref_m, ref_opt = m, optim.adamw(m, lr=0.05, accumulate=3, ema=0.9)
    ref_step = jax.jit(lambda m, o, x, y: optim.update(m, o, sm.grad(tiny_loss, m, x, y)))
    for x, y in data[:12]:
        ref_m, ref_opt = ref_step(ref_m, ref_opt, x, y)
    for a, b in zip(
        jax.tree.leaves((result.model, result.ema)),
        jax.tree.leaves((ref_m, optim.averaged(ref_m, ref_opt))),
    ):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    assert type(result.ema) is Tiny and not np.allclose(result.ema.w, result.model.w)

    ckpt = tmp_path / "acc.safetensors"
    kw = dict(accumulate=3, ema=0.9, checkpoint=ckpt, progress=False)
    train(tiny_loss, m, optim.adamw(m, lr=0.05), data, steps=2, **kw)
    resumed = train(tiny_loss, m, optim.adamw(m, lr=0.05), data, steps=4, resume=True, **kw)
    for a, b in zip(
        jax.tree.leaves((resumed.model, resumed.opt)), jax.tree.leaves((result.model, result.opt))
    ):
        np.testing.assert_array_equal(a, b)


def test_train_checks_its_arguments_before_it_runs():
    m = Tiny.init()
    with pytest.raises(sm.ShapemlError, match="E0002"):
        train(tiny_loss, m, optim.sgd(m, lr=0.1), tiny_batches(), steps=-5, progress=False)
    with pytest.raises(sm.ShapemlError, match="E0003"):
        train(tiny_loss, m, optim.sgd(m, lr=0.1), tiny_batches(), steps=2.5, progress=False)
    with pytest.raises(ValueError, match="E1207"):
        train(
            tiny_loss,
            m,
            optim.sgd(m, lr=0.1, accumulate=2),
            tiny_batches(),
            steps=2,
            accumulate=3,
            progress=False,
        )
    with pytest.raises(sm.ShapemlError, match="E0002"):
        train(tiny_loss, m, optim.sgd(m, lr=0.1), tiny_batches(), steps=2, ema=-0.5, progress=False)
    step = TrainStep(tiny_loss, m, optim.sgd(m, lr=0.1, ema=0.5))
    step(*tiny_batches(1)[0])
    assert type(step.averaged) is Tiny


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"devices": 0}, "`devices` is 0"),
        ({"devices": 1, "mesh": "any"}, "got both"),
        ({"rules": {"D": "data"}}, "no mesh to place the fields on"),
    ],
)
def test_placement_arguments_are_checked_before_the_checkpoint_is_read(kwargs, needle, tmp_path):
    bad = tmp_path / "ck.safetensors"
    bad.write_bytes(b"not a checkpoint")  # reading it would be E1302: it must not be reached
    m = Spotter.init(seed=0)
    img, y = shapes.draw(32, seed=0)
    with pytest.raises(sm.ArgumentError, match=needle):
        train(
            spotter_loss,
            m,
            optim.adamw(m, lr=1e-3),
            batches(img, y, batch_size=16),
            steps=1,
            has_aux=True,
            checkpoint=bad,
            resume=True,
            progress=False,
            **kwargs,
        )
