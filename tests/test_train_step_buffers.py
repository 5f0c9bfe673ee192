"""A loss that returns an updated model: TrainStep and train carry its buffers (BatchNorm's running
statistics) while the optimizer updates only the params, checked against PyTorch step by step."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jaxtyping import Array, Float, Int

import shapeml as sm
from shapeml import nn, optim
from shapeml.training import TrainStep, train

torch = pytest.importorskip("torch", reason="PyTorch is the reference for BatchNorm training")


class Net(sm.Model):
    """BatchNorm over C features, then a linear head to K classes."""

    dims = sm.Dims(C=6, K=3)
    bn: nn.BatchNorm = sm.submodel(nn.BatchNorm)
    head: nn.Linear = sm.submodel(nn.Linear.of(In="C", Out="K"))


@sm.shaped
def loss(m: Net, x: Float[Array, "b C"], y: Int[Array, " b"]) -> tuple[Float[Array, ""], Net]:
    h, bn = m.bn(x, train=True)
    logits = m.head(h)
    value = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return value, m.replace(bn=bn)


@sm.shaped
def loss_and_metrics(m: Net, x: Float[Array, "b C"], y: Int[Array, " b"]):
    value, m = loss(m, x, y)
    return value, (m, {"half": value / 2})


def _batches(n, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        x = rng.normal(2.0, 3.0, (16, 6)).astype(np.float32)
        yield x, rng.integers(0, 3, 16).astype(np.int32)


def _torch_run(m: Net, batches, lr):
    bn = torch.nn.BatchNorm1d(6, eps=1e-5, momentum=0.1)
    head = torch.nn.Linear(6, 3)
    with torch.no_grad():
        head.weight.copy_(torch.tensor(np.asarray(m.head.w).T))
        head.bias.copy_(torch.tensor(np.asarray(m.head.b)))
    params = [*bn.parameters(), *head.parameters()]
    opt = torch.optim.SGD(params, lr=lr)
    losses = []
    for x, y in batches:
        opt.zero_grad()
        value = torch.nn.functional.cross_entropy(head(bn(torch.tensor(x))), torch.tensor(y).long())
        value.backward()
        opt.step()
        losses.append(float(value.detach()))
    return bn, head, losses


def _assert_matches(m: Net, bn, head):
    got = {
        "running mean": (m.bn.mean, bn.running_mean),
        "running var": (m.bn.var, bn.running_var),
        "scale": (m.bn.scale, bn.weight),
        "bias": (m.bn.bias, bn.bias),
        "head.w": (m.head.w, head.weight.T),
        "head.b": (m.head.b, head.bias),
    }
    for name, (ours, theirs) in got.items():
        np.testing.assert_allclose(
            np.asarray(ours), theirs.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=name
        )


def test_batchnorm_running_statistics_train_through_trainstep_like_pytorch():
    m = Net.init(seed=0)
    step = TrainStep(loss, m, optim.sgd(m, lr=0.1), has_aux=True)
    values = [float(step(x, y)) for x, y in _batches(8)]  # the loss alone comes back
    bn, head, expected = _torch_run(m, _batches(8), lr=0.1)
    np.testing.assert_allclose(values, expected, rtol=1e-5)
    _assert_matches(step.model, bn, head)
    assert float(jnp.abs(step.model.bn.mean).sum()) > 0.5  # the statistics really moved
    assert int(step.opt.step) == 8 and step.compiled_count() == 1


def test_an_aux_holding_the_model_and_metrics_returns_the_metrics():
    m = Net.init(seed=1)
    step = TrainStep(loss_and_metrics, m, optim.sgd(m, lr=0.1), has_aux=True)
    value, metrics = step(*next(_batches(1)))
    assert float(metrics["half"]) == pytest.approx(float(value) / 2)
    assert float(jnp.abs(step.model.bn.mean).sum()) > 0  # carried all the same


def test_train_carries_the_buffers_and_logs_the_metrics():
    m = Net.init(seed=2)
    result = train(
        loss_and_metrics, m, optim.sgd(m, lr=0.1), _batches(6), steps=6, has_aux=True,
        log_every=3, progress=False,
    )  # fmt: skip
    bn, head, _ = _torch_run(m, _batches(6), lr=0.1)
    _assert_matches(result.model, bn, head)
    assert [r["step"] for r in result.history] == [3, 6] and "half" in result.history[-1]


def test_a_loss_returning_a_model_of_other_dims_is_a_coded_error():
    m = Net.init(seed=0)

    def bad(m, x, y):
        value, _ = loss(m, x, y)
        return value, Net.init(seed=0, C=6, K=4)  # another head width: another carry

    step = TrainStep(bad, m, optim.sgd(m, lr=0.1), has_aux=True)
    with pytest.raises(sm.ShapemlError, match=r"E1414.*K: 3 -> 4"):
        step(*next(_batches(1)))
    np.testing.assert_array_equal(np.asarray(step.model.head.w), np.asarray(m.head.w))
