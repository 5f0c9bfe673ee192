"""`nn.Conv2d`, pooling, `nn.Dropout` and `nn.BatchNorm` against numpy references, and BatchNorm's
running statistics carried by a training step (never by the optimizer)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float

import shapeml as sm
from shapeml import nn, optim

RNG = np.random.default_rng(2)


def _x(*shape):
    return jnp.asarray(RNG.standard_normal(shape).astype(np.float32))


def conv_ref(x, w, b, stride, pad):
    x = np.pad(np.asarray(x, np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    w = np.asarray(w, np.float64)
    k = w.shape[-1]
    oh, ow = (x.shape[2] - k) // stride + 1, (x.shape[3] - k) // stride + 1
    out = np.zeros((x.shape[0], w.shape[0], oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = x[:, :, i * stride : i * stride + k, j * stride : j * stride + k]
            out[:, :, i, j] = np.einsum("bchw,ochw->bo", patch, w)
    return out + np.asarray(b)[None, :, None, None]


def pool_ref(x, window, stride, pad, op):
    fill = -np.inf if op is np.max else 0.0
    x = np.pad(
        np.asarray(x, np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=fill
    )
    oh, ow = (x.shape[2] - window) // stride + 1, (x.shape[3] - window) // stride + 1
    out = np.zeros(x.shape[:2] + (oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = x[:, :, i * stride : i * stride + window, j * stride : j * stride + window]
            out[:, :, i, j] = op(patch, axis=(2, 3))
    return out


@pytest.mark.parametrize("stride,padding", [(1, 0), (2, 1)])
def test_conv2d_matches_numpy(stride, padding):
    m = nn.Conv2d.of(Ci="C", Co="2 * C", stride=stride, padding=padding).init(seed=0, C=3)
    assert m.w.shape == (6, 3, 3, 3) and (m.stride, m.padding) == (stride, padding)
    m = m.replace(b=_x(6))
    bare = nn.Conv2d.init(seed=0, Ci=3, Co=6, stride=stride, padding=padding, bias=False)
    assert bare.b is None and set(sm.params(bare)) == {"w"}
    np.testing.assert_allclose(bare(_x(1, 3, 5, 5) * 0), 0.0)
    x = _x(2, 3, 7, 6)
    y = m(x)
    ref = conv_ref(x, m.w, m.b, stride, padding)
    assert y.shape == ref.shape and y.dtype == jnp.float32
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(sm.ShapemlError, match="E1001"):
        m(_x(2, 4, 7, 6))  # Ci is 3
    with pytest.raises(sm.ShapemlError, match="E1803"):
        m(_x(1, 3, 2, 6) if padding == 0 else _x(1, 3, 0, 6))  # smaller than the kernel
    for bad in ({"stride": 0}, {"padding": -1}, {"stride": 1.5}, {"bias": None}):
        with pytest.raises(sm.ShapemlError, match="E1802"):
            nn.Conv2d.of(**bad)


@pytest.mark.parametrize("cls,op", [(nn.MaxPool2d, np.max), (nn.AvgPool2d, np.mean)])
def test_pooling_matches_numpy(cls, op):
    x = _x(2, 3, 6, 5)
    for window, stride, padding in ((2, None, 0), (3, 1, 1)):
        m = cls(window=window, stride=stride, padding=padding)
        ref = pool_ref(x, window, stride or window, padding, op)
        y = m(x)
        assert y.shape == ref.shape
        if op is np.mean:  # zero padding counts in the mean, as PyTorch's default
            ref = pool_ref(x, window, stride or window, padding, np.sum) / window**2
            if padding:
                xp = np.pad(np.asarray(x), ((0, 0), (0, 0), (1, 1), (1, 1)))
                ref = pool_ref(xp, window, stride, 0, np.mean)
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(sm.ShapemlError, match="E1802"):
        cls.of(window=0)
    with pytest.raises(sm.ShapemlError, match="E1802"):
        cls(window=0)
    with pytest.raises(sm.ShapemlError, match="E1803"):
        cls.init(window=7)(x)


def test_dropout_with_a_key_and_without():
    m = nn.Dropout(rate=0.25)
    x = jnp.ones((400, 50))
    assert m(x) is x  # evaluation: no key, no change
    y = np.asarray(m(x, key=jax.random.key(3)))
    kept = y != 0
    assert abs(kept.mean() - 0.75) < 0.01
    np.testing.assert_allclose(y[kept], 1 / 0.75, rtol=1e-6)
    np.testing.assert_array_equal(y, np.asarray(m(x, key=jax.random.key(3))))
    assert nn.Dropout.init(rate=0.0)(x, key=jax.random.key(0)) is x
    for bad in (1.0, -0.1, True, "0.5"):
        with pytest.raises(sm.ShapemlError, match="E1802"):
            nn.Dropout.of(rate=bad)


def test_batchnorm_matches_numpy_in_train_and_eval():
    m = nn.BatchNorm.of(C="F", momentum=0.2).init(seed=0, F=3).replace(scale=_x(3), bias=_x(3))
    x = _x(4, 3, 2, 5) * 2 + 1
    y, new = m(x, train=True)
    xf = np.asarray(x, np.float64)
    mu, var = xf.mean(axis=(0, 2, 3)), xf.var(axis=(0, 2, 3))
    shape = (1, 3, 1, 1)
    ref = (xf - mu.reshape(shape)) / np.sqrt(var.reshape(shape) + 1e-5)
    ref = ref * np.asarray(m.scale).reshape(shape) + np.asarray(m.bias).reshape(shape)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(new.mean, 0.2 * mu, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new.var, 0.8 + 0.2 * var * 40 / 39, rtol=1e-5)
    y_eval, same = new(x[:, :, :1, :1], train=False)  # running statistics, no update
    assert same is new and y_eval.shape == (4, 3, 1, 1)
    ref_eval = (xf[:, :, :1, :1] - 0.2 * mu.reshape(shape)) / np.sqrt(
        np.asarray(new.var).reshape(shape) + 1e-5
    )
    ref_eval = ref_eval * np.asarray(m.scale).reshape(shape) + np.asarray(m.bias).reshape(shape)
    np.testing.assert_allclose(y_eval, ref_eval, rtol=1e-4, atol=1e-4)
    assert set(sm.buffers(m)) == {"mean", "var"} and set(sm.params(m)) == {"scale", "bias"}
    with pytest.raises(sm.ShapemlError, match="E1001"):
        m(_x(4, 2, 5), train=True)
    with pytest.raises(sm.ShapemlError, match="E1802"):
        nn.BatchNorm.of(momentum=0.0)


class Net(sm.Model):
    dims = sm.Dims(I=3, F=4)  # not C: the BatchNorm's own name for its channels
    fc: nn.Linear = sm.submodel(nn.Linear, In="I", Out="F")
    bn: nn.BatchNorm = sm.submodel(nn.BatchNorm, C="F")


def loss(m: Net, x: Float[Array, "b I"]):
    h, bn = m.bn(m.fc(x), train=True)
    return jnp.mean(h**2 + h), m.replace(bn=bn)


def test_a_step_carries_the_running_statistics_and_the_optimizer_never_touches_them():
    m = Net.init(seed=0)
    opt = optim.adamw(m, lr=0.1, weight_decay=0.5)

    @jax.jit
    def step(m, opt, x):
        (value, new), g = sm.value_and_grad(loss, m, x, has_aux=True)
        assert "bn.mean" not in g.named()  # buffers have no gradient
        updated, opt = optim.update(m, opt, g)
        return updated, nn.take_buffers(updated, new), opt

    x = _x(16, 3)
    updated, m1, opt = step(m, opt, x)
    h = np.asarray(x) @ np.asarray(m.fc.w) + np.asarray(m.fc.b)
    np.testing.assert_allclose(m1.bn.mean, 0.1 * h.mean(0), rtol=1e-5, atol=1e-6)
    assert not np.allclose(m1.fc.w, m.fc.w)
    np.testing.assert_array_equal(m1.fc.w, updated.fc.w)
    # the optimizer alone keeps the buffers (weight decay included)
    np.testing.assert_array_equal(updated.bn.mean, m.bn.mean)
    np.testing.assert_array_equal(updated.bn.var, m.bn.var)
    with pytest.raises(sm.ShapemlError, match="E0003"):
        nn.take_buffers(m, m.bn)


@pytest.mark.parametrize("pool", [nn.MaxPool2d, nn.AvgPool2d])
def test_pool_padding_past_half_the_window_is_refused(pool):
    with pytest.raises(sm.ShapemlError, match="E1802"):
        pool.of(window=2, padding=2)
