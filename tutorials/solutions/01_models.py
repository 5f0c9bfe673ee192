"""Solutions to the exercises of tutorials/01_models.ipynb. Run: python tutorials/solutions/01_models.py"""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

import shapeml as sm


# 1. A model with only a buffer, and a shaped function that uses it.
class Centered(sm.Model):
    """Subtracts an average image: saved with the model, never trained."""

    dims = sm.Dims(S=16)
    center: Float[Array, "1 S S"] = sm.buffer(sm.zeros)


@sm.shaped
def centered(m: Centered, img: Float[Array, "b 1 S S"]) -> Float[Array, "b 1 S S"]:
    return img - m.center


c = Centered.init()
assert sm.count_params(c) == 0 and list(sm.buffers(c)) == ["center"]
assert centered(c, jnp.ones((2, 1, 16, 16))).shape == (2, 1, 16, 16)


# 2. Same seed, same model; a new field changes no other.
class Head(sm.Model):
    dims = sm.Dims(D=32, C=4)
    w: Float[Array, "D C"] = sm.param(sm.normal(std=0.18))
    b: Float[Array, " C"] = sm.param(sm.zeros)


a, b = Head.init(seed=3), Head.init(seed=3)
assert all(bool(jnp.array_equal(x, y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


class HeadWithExtra(sm.Model):
    dims = sm.Dims(D=32, C=4)
    extra: Float[Array, "C C"] = sm.param(sm.normal())
    w: Float[Array, "D C"] = sm.param(sm.normal(std=0.18))
    b: Float[Array, " C"] = sm.param(sm.zeros)


assert bool(jnp.array_equal(HeadWithExtra.init(seed=3).w, a.w))


# 3. A "change" to a model returns a new model: models are immutable values (E1102), which is
#    what lets jax.jit, jax.grad and the hoisting cache rely on them. The caller rebinds the name.
def reset_head(m: Head) -> Head:
    return m.replace(w=jnp.zeros_like(m.w))


r = reset_head(a)
assert float(jnp.abs(r.w).sum()) == 0.0 and bool(jnp.array_equal(r.b, a.b))
assert float(jnp.abs(a.w).sum()) > 0  # the original is unchanged
print("01_models: all solutions check out")
