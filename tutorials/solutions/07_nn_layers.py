"""Solutions to the exercises of tutorials/07_nn_layers.ipynb.

Run: python tutorials/solutions/07_nn_layers.py
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Float, Int

import shapeml as sm
from shapeml import nn, optim


# The notebook's model, forward and decode step.
class Block(sm.Model):
    dims = sm.Dims(D=32, H=4, T=32)
    norm1: nn.RMSNorm = sm.submodel(nn.RMSNorm)
    attn: nn.MultiHeadAttention = sm.submodel(
        nn.MultiHeadAttention, causal=True, positions="rotary"
    )
    norm2: nn.RMSNorm = sm.submodel(nn.RMSNorm)
    mlp: nn.MLP = sm.submodel(nn.MLP, F="4 * D", activation="silu")


class TinyGPT(sm.Model):
    dims = sm.Dims(V=16, D=32, H=4, T=32, L=2)
    emb: nn.Embedding = sm.submodel(nn.Embedding)
    blocks: tuple[Block, ...] = sm.submodels(Block, "L")
    norm: nn.LayerNorm = sm.submodel(nn.LayerNorm)


def trunk(m, tokens):
    """The blocks and the final norm: `[b t] -> [b t D]` (shared by the models below)."""
    x = m.emb(tokens)
    for blk in m.blocks:
        x = x + blk.attn(blk.norm1(x))
        x = x + blk.mlp(blk.norm2(x))
    return m.norm(x)


@sm.shaped
def forward(m: TinyGPT, tokens: Int[Array, "b t"]) -> Float[Array, "b t V"]:
    return m.emb.logits(trunk(m, tokens))


@jax.jit
def decode(m: TinyGPT, cache, tokens, pos):
    x = m.emb(tokens)
    for layer, blk in enumerate(m.blocks):
        a, cache = blk.attn.step(blk.norm1(x), cache, layer, pos)
        x = x + a
        x = x + blk.mlp(blk.norm2(x))
    return m.emb.logits(m.norm(x)), cache


def greedy(m, prompt, n):
    cache = m.blocks[0].attn.new_cache(layers=m.dims.L, batch=1)
    logits, cache = decode(m, cache, prompt[None], jnp.int32(0))
    out = list(map(int, prompt))
    for _ in range(n):
        out.append(int(jnp.argmax(logits[0, -1])))
        logits, cache = decode(m, cache, jnp.array([[out[-1]]]), jnp.int32(len(out) - 1))
    return out


m = TinyGPT.init(seed=0)
d = m.dims


# 1. Learned positions: each attention gets a table `pos [T D]`, so L * T * D more params; a
#    sequence longer than the table is refused (E1803). Without them, `pos` is None.
class LearnedBlock(Block):
    attn: nn.MultiHeadAttention = sm.submodel(
        nn.MultiHeadAttention, causal=True, positions="learned"
    )


class LearnedGPT(TinyGPT):
    blocks: tuple[LearnedBlock, ...] = sm.submodels(LearnedBlock, "L")


learned = LearnedGPT.init(seed=0)
assert all(blk.attn.pos.shape == (d.T, d.D) for blk in learned.blocks)
assert all(blk.attn.pos is None for blk in m.blocks)  # an optional field, absent without it
assert sm.count_params(learned) - sm.count_params(m) == d.L * d.T * d.D
assert jax.eval_shape(trunk, learned, jnp.zeros((1, d.T), jnp.int32)).shape == (1, d.T, d.D)
try:
    jax.eval_shape(trunk, learned, jnp.zeros((1, d.T + 1), jnp.int32))
except nn.LayerInputError as e:
    assert e.code == "E1803"
else:
    raise AssertionError("a sequence longer than T should be refused")


# 2. An untied head: a Linear from the parent's D to its V. Its weight `w [In Out]` is [D V]
#    (here [48 16]: the head follows the model's D), and it decays: weight decay skips only the
#    fields declared `sm.param(..., decay=False)` (norm scales and shifts, biases), and a
#    Linear's `w` is not one of them.
class HeadGPT(TinyGPT):
    head: nn.Linear = sm.submodel(nn.Linear, In="D", Out="V", bias=False)


@sm.shaped
def head_forward(m: HeadGPT, tokens: Int[Array, "b t"]) -> Float[Array, "b t V"]:
    return m.head(trunk(m, tokens))


headed = HeadGPT.init(seed=0, D=48, H=6)
assert headed.head.w.shape == (48, d.V) and headed.blocks[0].attn.dims.Dh == 8
assert jax.eval_shape(head_forward, headed, jnp.zeros((2, 5), jnp.int32)).shape == (2, 5, d.V)
zero = sm.Grad[HeadGPT](jax.tree.map(jnp.zeros_like, headed))
decayed, _ = jax.jit(optim.update)(headed, optim.adamw(headed, lr=0.1, weight_decay=0.5), zero)
np.testing.assert_allclose(decayed.head.w, headed.head.w * 0.95, rtol=1e-6)

# 3. Decoding from position 0 one token at a time equals the full forward; then the greedy loop
#    as one compiled call (lax.fori_loop), equal to the Python loop.
seq = jnp.array([[2, 5, 8, 11, 14, 1, 4, 7]])
cache = m.blocks[0].attn.new_cache(layers=d.L, batch=1)
steps = []
for pos in range(seq.shape[1]):
    logits, cache = decode(m, cache, seq[:, pos : pos + 1], jnp.int32(pos))
    steps.append(logits)
np.testing.assert_allclose(jnp.concatenate(steps, axis=1), jax.jit(forward)(m, seq), atol=1e-5)


@functools.partial(jax.jit, static_argnames="n")
def generate(m: TinyGPT, prompt: Int[Array, " p"], n: int) -> Int[Array, " p+n"]:
    p = prompt.shape[0]
    cache = m.blocks[0].attn.new_cache(layers=m.dims.L, batch=1)
    logits, cache = decode(m, cache, prompt[None], 0)
    out = jnp.concatenate([prompt, jnp.zeros(n, prompt.dtype)])

    def body(i, carry):
        cache, last, out = carry
        tok = jnp.argmax(last).astype(prompt.dtype)
        logits, cache = decode(m, cache, tok[None, None], p + i)
        return cache, logits[0, -1], out.at[p + i].set(tok)

    return lax.fori_loop(0, n, body, (cache, logits[0, -1], out))[2]


prompt = jnp.array([6, 9], jnp.int32)
assert list(map(int, generate(m, prompt, 10))) == greedy(m, prompt, 10)


# 4. A model with buffers. The batch norm's own channel dim `C` is mapped to the parent's `F`, so
#    it is 16: a mapped dim takes the mapping's value, whatever the parent's dim of the same name
#    (the classes, C = 3). Left unmapped, the layer takes C = 3 by name; the model builds, but the
#    batch norm is then called on [b F] features and its shape check fails with E1001.
class Tagger(sm.Model):
    dims = sm.Dims(D=8, F=16, C=3)
    up: nn.Linear = sm.submodel(nn.Linear, In="D", Out="F")
    bn: nn.BatchNorm = sm.submodel(nn.BatchNorm, C="F")
    out: nn.Linear = sm.submodel(nn.Linear, In="F", Out="C")


class ByName(sm.Model):
    dims = sm.Dims(D=8, F=16, C=3)
    up: nn.Linear = sm.submodel(nn.Linear, In="D", Out="F")
    bn: nn.BatchNorm = sm.submodel(nn.BatchNorm)  # C = 3, the classes
    out: nn.Linear = sm.submodel(nn.Linear, In="F", Out="C")


assert (Tagger.init(seed=0).bn.dims.C, Tagger.init(seed=0).dims.C) == (16, 3)
by_name = ByName.init(seed=0)
assert by_name.bn.dims.C == 3
try:
    by_name.bn(by_name.up(jnp.ones((2, 8))), train=True)
except sm.ShapemlError as e:
    assert e.code == "E1001", e
else:
    raise AssertionError("16 features into a batch norm of 3 channels should be refused")


@sm.shaped
def tag(m: Tagger, x: Float[Array, "b D"]) -> tuple[Float[Array, "b C"], Tagger]:
    h, bn = m.bn(m.up(x), train=True)
    return m.out(jax.nn.relu(h)), m.replace(bn=bn)


def tag_loss(m, x, y):
    logits, new = tag(m, x)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1)), new


@jax.jit
def tag_step(m, opt, x, y):
    (value, new), g = sm.value_and_grad(tag_loss, m, x, y, has_aux=True)
    m, opt = optim.update(m, opt, g)
    return nn.take_buffers(m, new), opt, value


tagger = Tagger.init(seed=0)
x = jax.random.normal(jax.random.key(0), (32, 8)) + 1.0
y = jnp.arange(32, dtype=jnp.int32) % 3
stepped, _, _ = tag_step(tagger, optim.adamw(tagger, lr=1e-2), x, y)
assert jnp.array_equal(tagger.bn.mean, jnp.zeros(16))
assert not jnp.array_equal(stepped.bn.mean, tagger.bn.mean)  # the buffers came from the forward
assert not jnp.array_equal(stepped.up.w, tagger.up.w)  # the params from the optimizer
print("07_nn_layers: all solutions check out")
