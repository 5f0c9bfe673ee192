"""Solutions to the exercises of tutorials/03_weights_and_state.ipynb.

Run: python tutorials/solutions/03_weights_and_state.py
"""

import jax.numpy as jnp
import numpy as np

from shapeml.state import Graph, state
from shapeml.zoo import transformer as tr

rng = np.random.default_rng(0)


# 1. Subtract instead of add: the reference path runs the same body, so it still agrees.
class Drain(Graph):
    def __init__(self, rows, width):
        self.total = state((rows, width), jnp.float32, name="total")

    def body(self, x, *, pos):
        new = self.total[pos] - x
        self.total[pos] = new
        return new


drain = Drain(4, 3)
for pos in (1, 1, 3):
    x = rng.standard_normal(3).astype(np.float32)
    drain(x, pos=pos)
    drain.reference(x, pos=pos)
np.testing.assert_allclose(drain.read("total"), drain.total.host, rtol=1e-6)


# 2. An integer state, counted per slot, one compile for every position.
class Counter(Graph):
    def __init__(self, slots):
        self.hits = state((slots,), jnp.int32, name="hits")

    def body(self, *, pos):
        self.hits[pos] = self.hits[pos] + 1
        return self.hits[pos]


counter = Counter(5)
positions = rng.integers(0, 5, 20)
for p in positions:
    counter(pos=int(p))
np.testing.assert_array_equal(counter.read("hits"), np.bincount(positions, minlength=5))
assert counter.compile_count == 1

# 3. Greedy decoding by hand with the device-resident cache equals generate().
model = tr.Transformer.init(seed=0, V=16, T=24, D=32, H=4, F=64, L=2)
prompt = jnp.asarray(rng.integers(0, 16, (1, 4)), jnp.int32)
dec = tr.CachedDecoder(model, batch=1)
logits = dec(prompt, pos=0)
tokens = [int(jnp.argmax(logits[0, -1]))]
for i in range(5):
    logits = dec(jnp.asarray([[tokens[-1]]], jnp.int32), pos=4 + i)
    tokens.append(int(jnp.argmax(logits[0, -1])))
np.testing.assert_array_equal(np.asarray(tr.generate(model, prompt, 6))[0, 4:], tokens)
print("03_weights_and_state: all solutions check out")
