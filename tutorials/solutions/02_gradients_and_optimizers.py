"""Solutions to the exercises of tutorials/02_gradients_and_optimizers.ipynb.

Run: python tutorials/solutions/02_gradients_and_optimizers.py
"""

import jax
import jax.numpy as jnp

import shapeml as sm
from shapeml import optim
from shapeml.data import shapes
from shapeml.zoo.spotter import Spotter, loss

img, y = (jnp.asarray(a) for a in shapes.draw(32, seed=0))
m = Spotter.init(seed=0)


# 1. Train only the head, by hand: a new model with w_h moved, every other param as it was.
def sgd_head(m: Spotter, img, y, lr: float) -> Spotter:
    g = sm.grad(loss, m, img, y)
    return m.replace(w_h=m.w_h - lr * g.w_h)


m2 = jax.jit(sgd_head)(m, img, y, 0.5)  # compiled once: faster than op by op
assert bool(jnp.array_equal(m2.w_e, m.w_e)) and not bool(jnp.array_equal(m2.w_h, m.w_h))
batch_loss = jax.jit(loss)
assert float(batch_loss(m2, img, y)) < float(batch_loss(m, img, y))


# 2. The bug: `optim.update` returns the new model and optimizer; it changes nothing in place
#    (models are immutable values). The result was thrown away. The fix:
def step(m, opt, img, y):
    value, g = sm.value_and_grad(loss, m, img, y)
    m, opt = optim.update(m, opt, g)
    return m, opt, value


m3, opt3, _ = jax.jit(step)(m, optim.sgd(m, lr=0.1), img, y)
assert int(opt3.step) == 1 and not bool(jnp.array_equal(m3.w_h, m.w_h))


# 3. A gradient transform is a function from Grad[M] to Grad[M].
def halve(g):
    return g * 0.5


g = jax.jit(sm.grad, static_argnums=0)(loss, m, img, y)
adam = optim.adamw(m, lr=1e-3, transforms=[optim.clip_norm(1.0), halve])
m4, _ = jax.jit(optim.update)(m, adam, g)
a, _ = optim.update(m, optim.sgd(m, lr=0.1, transforms=[halve]), g)
b, _ = optim.update(m, optim.sgd(m, lr=0.05), g)
for x1, x2 in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert bool(jnp.allclose(x1, x2, rtol=1e-6, atol=1e-7))
print("02_gradients_and_optimizers: all solutions check out")
