"""Solutions to the exercises of tutorials/05_int8_transformer.ipynb.

Run: python tutorials/solutions/05_int8_transformer.py
"""

import numpy as np

import shapeml as sm
from shapeml import int8
from shapeml.apps.int8_sort import tiny_model

# Tensor-parallel decode needs devices: 2 CPU devices, asked for before JAX starts.
sm.use_cpu_devices(2)

# 1. The requant rule rounds half up (an arithmetic shift of x * M + 2**(S-1)): 0.5 -> 1,
#    1.5 -> 2, -0.5 -> 0, -1.5 -> -1. numpy's round goes half to even: 0, 2, -0, -2.
x = np.array([1, 3, -1, -3], np.int64)
assert int8.requant(x, 1, 1).tolist() == [1, 2, 0, -1]
assert np.round(x / 2).tolist() == [0, 2, 0, -2]

# 2. A random model: the reference and the compiled step agree on every logit; tp=2 == unsplit.
m = int8.Int8Model.random(seed=0, d=32, heads=4, d_ff=64, vocab=16, ctx=12)
rng = np.random.default_rng(0)
cache = m.init_cache()
k_rows, v_rows = m.cache_rows(cache)
for pos in range(m.ctx):
    tok = int(rng.integers(m.vocab))
    ref = m.reference_step(tok, pos, k_rows, v_rows)
    k_rows, v_rows = ref["k_cache"], ref["v_cache"]
    logits, nxt, cache = m.decode_step(tok, pos, cache)
    assert np.array_equal(np.asarray(logits), ref["logits"]) and int(nxt) == int(ref["next"])
prompt = rng.integers(m.vocab, size=3).tolist()
assert m.generate(prompt, 8, tp=2) == m.generate(prompt, 8)

# 3. The largest accumulator bound of the shipped model, and the headroom below 2**31 - 1.
shipped = tiny_model()
name, (bound, formula) = max(shipped.bounds().items(), key=lambda kv: kv[1][0])
print(f"largest bound: {name} = {bound} ({formula}), {(2**31 - 1) // bound}x below the int32 limit")
assert bound < 2**31 - 1
print("05_int8_transformer: all solutions check out")
