"""The Spotter: size, forward against a numpy reference, loss, predict, metrics."""

import jax.numpy as jnp
import numpy as np

import shapeml as sm
from shapeml.data import shapes
from shapeml.zoo import spotter


def _gelu(x):
    # the tanh approximation jax.nn.gelu uses by default
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def _norm(x):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)


def reference_forward(m, img):
    p = {k: np.asarray(v, np.float64) for k, v in sm.params(m).items()}
    x = img.astype(np.float64) / 255 * 2 - 1
    b = len(x)
    patches = x.reshape(b, 4, 4, 4, 4).transpose(0, 1, 3, 2, 4).reshape(b, 16, 16)
    t = patches @ p["w_e"]
    for layer in range(2):
        h = _norm(t).transpose(0, 2, 1)  # [b D N]
        t = t + (_gelu(h @ p["tw1"][layer]) @ p["tw2"][layer]).transpose(0, 2, 1)
        t = t + _gelu(_norm(t) @ p["cw1"][layer]) @ p["cw2"][layer]
    return _norm(t).mean(1) @ p["w_h"]


def test_spotter_has_12928_params_in_six_fields():
    m = spotter.Spotter.init(seed=0)
    assert sm.count_params(m) == 12_928
    assert list(sm.params(m)) == ["w_e", "tw1", "tw2", "cw1", "cw2", "w_h"]
    assert m.dims.N == 16
    stds = {k: float(np.std(v)) for k, v in sm.params(m).items()}
    assert abs(stds["w_e"] - 0.25) < 0.03 and abs(stds["tw2"] - 0.125) < 0.02


def test_forward_matches_numpy_reference():
    m = spotter.Spotter.init(seed=3)
    img, _ = shapes.draw(6, seed=2)
    np.testing.assert_allclose(
        spotter.forward(m, jnp.asarray(img)), reference_forward(m, img), rtol=2e-4, atol=2e-5
    )


def test_loss_predict_and_metrics():
    m = spotter.Spotter.init(seed=0)
    img, y = shapes.draw(16, seed=1)
    logits = reference_forward(m, img)
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    np.testing.assert_allclose(
        spotter.loss(m, jnp.asarray(img), jnp.asarray(y)), -logp[np.arange(16), y].mean(), rtol=1e-4
    )
    np.testing.assert_array_equal(spotter.predict(m, jnp.asarray(img)), logits.argmax(1))
    pred = jnp.array([0, 1, 1, 2, 3, 3])
    true = jnp.array([0, 1, 2, 2, 3, 0])
    np.testing.assert_allclose(spotter.per_class_accuracy(pred, true, 4), [0.5, 1.0, 0.5, 1.0])
    np.testing.assert_array_equal(
        spotter.confusion(pred, true, 4),
        [[1, 0, 0, 1], [0, 1, 0, 0], [0, 1, 1, 0], [0, 0, 0, 1]],
    )
