"""GPT-2 in named dims, composed from `shapeml.nn` layers: learned token and position tables,
pre-norm blocks (causal attention with GPT-2's fused, biased `c_attn`, then a tanh-GELU MLP) and a
head tied to the token table. Field names follow the Hugging Face checkpoints (`wte`, `h.0.attn`),
so the two name each tensor alike."""

from __future__ import annotations

import math
import typing
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Bool, Float, Int

from ... import nn
from ..._shaped import shaped
from ..._traceback import api_boundary
from ...models import Dims, Model, submodel, submodels
from ...state._index import StateIndexError, check_index
from ...state._kvcache import KVCache
from .._errors import TransformerDimsError

__all__ = ["GPT2", "Attention", "Block", "attend", "forward", "hidden", "loss", "positions"]


@api_boundary
class Attention(Model):
    """GPT-2's causal self-attention, `[b t D] -> [b t D]`.

    Dims: `D` (width), `H` (heads), `Dh = D // H`. Sub-models: `c_attn` (`nn.Linear` `D -> 3 * D`
    with bias: the queries, keys and values side by side, each `H` heads of `Dh`) and `c_proj`
    (`D -> D`, with bias). Scores are scaled by `1 / sqrt(Dh)`; every position sees itself and
    the positions before it.
    """

    dims = Dims(D=768, H=12, Dh="D // H")
    c_attn: nn.Linear = submodel(nn.Linear, In="D", Out="3 * D")
    c_proj: nn.Linear = submodel(nn.Linear, In="D", Out="D")

    def __check_init__(self):
        d = self.dims
        if d.H < 1 or d.D % d.H:
            raise TransformerDimsError(
                f"GPT-2 `{type(self).__name__}` has width D={d.D} and H={d.H} heads: the width is "
                "split into H heads of D // H, so H must be at least 1 and divide D",
                fix=f"pick H among the divisors of D={d.D} (GPT-2 small: D=768, H=12)",
            )

    def _heads(self, x):
        """Queries, keys and values `[b t H Dh]` of `x [b t D]`."""
        b, t, _ = x.shape
        q, k, v = jnp.split(self.c_attn(x), 3, axis=-1)
        return tuple(a.reshape(b, t, self.dims.H, self.dims.Dh) for a in (q, k, v))

    @shaped
    def __call__(self, x: Float[Array, "b t D"]) -> Float[Array, "b t D"]:
        """Causal attention over the whole sequence `x [b t D]`."""
        b, t, _ = x.shape
        q, k, v = self._heads(x)
        mask = jnp.tril(jnp.ones((t, t), bool))
        return self.c_proj(attend(q, k, v, mask).reshape(b, t, self.dims.D))

    @shaped
    def step(
        self,
        x: Float[Array, "b n D"],
        cache: KVCache,
        layer: int | Int[Array, ""],
        pos: int | Int[Array, ""],
    ) -> tuple[Float[Array, "b n D"], KVCache]:
        """Runs `n` new positions `pos .. pos + n - 1` against `cache` (layer `layer`): their keys
        and values are written, and each attends to every cached position up to its own.

        Raises:
            StateIndexError: (E1401) if `pos + n` exceeds the cache or `pos < 0`.
        """
        b, n, _ = x.shape
        q, k, v = self._heads(x)
        cache = cache.write(layer, pos, k.astype(cache.k.dtype), v.astype(cache.v.dtype))
        keys, values, mask = cache.read(layer, pos, n)
        y = attend(q, keys.astype(q.dtype), values.astype(q.dtype), mask)
        return self.c_proj(y.reshape(b, n, self.dims.D)), cache


@shaped
def attend(
    q: Float[Array, "b n H Dh"],
    k: Float[Array, "b s H Dh"],
    v: Float[Array, "b s H Dh"],
    mask: Bool[Array, "n s"],
) -> Float[Array, "b n H Dh"]:
    """Softmax attention of each query over the keys `mask` lets it see, scaled by `1/sqrt(Dh)`."""
    scores = jnp.einsum("bnhk,bshk->bhns", q, k) * (1.0 / math.sqrt(q.shape[-1]))
    scores = jnp.where(mask[None, None], scores, jnp.finfo(scores.dtype).min)
    return jnp.einsum("bhns,bshk->bnhk", jax.nn.softmax(scores, axis=-1), v)


@api_boundary
class Block(Model):
    """A pre-norm GPT-2 block: `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`.

    Dims: `D`, `H`, `F` (the MLP's hidden width, GPT-2's `n_inner`). Sub-models: `ln_1`, `ln_2`
    (`nn.LayerNorm`, eps 1e-5), `attn` (`Attention`), `mlp` (`nn.MLP` with the tanh GELU: `up`
    is GPT-2's `c_fc`, `down` its `c_proj`).
    """

    dims = Dims(D=768, H=12, F=3072)
    ln_1: nn.LayerNorm = submodel(nn.LayerNorm)
    attn: Attention = submodel(Attention)
    ln_2: nn.LayerNorm = submodel(nn.LayerNorm)
    mlp: nn.MLP = submodel(nn.MLP, activation="gelu_tanh")

    @shaped
    def __call__(self, x: Float[Array, "b t D"]) -> Float[Array, "b t D"]:
        """The block over the whole sequence `x [b t D]`."""
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


@api_boundary
class GPT2(Model):
    """GPT-2: `V` tokens, context `T`, `L` blocks of width `D` with `H` heads and MLP width `F`.

    Sub-models: `wte` (`nn.Embedding` `[V D]`, also the head: `logits = ln_f(x) @ wte.w.T`),
    `wpe` (`nn.Embedding` `[T D]`, the learned positions), `h` (`L` `Block`s) and `ln_f`
    (`nn.LayerNorm`). The defaults are GPT-2 small (124M params); `from_hf` takes the dims from a
    checkpoint's `config.json`.

    Example:
        >>> m = GPT2.init(seed=0, V=512, T=64, D=64, H=4, L=2)    # F defaults to 4 * D
        >>> logits = forward(m, tokens)                            # [b t V]
    """

    dims = Dims(V=50257, T=1024, D=768, H=12, L=12, F=3072)
    wte: nn.Embedding = submodel(nn.Embedding)
    wpe: nn.Embedding = submodel(nn.Embedding, V="T")
    h: tuple[Block, ...] = submodels(Block, "L")
    ln_f: nn.LayerNorm = submodel(nn.LayerNorm)

    @classmethod
    @typing.no_type_check  # validates its arguments itself, with coded errors
    def init(
        cls,
        seed: Any = 0,
        *,
        V: int = 50257,
        T: int = 1024,
        D: int = 768,
        H: int = 12,
        L: int = 12,
        F: int | None = None,
        max_bytes: int | None = None,
    ) -> GPT2:
        """A new GPT-2 drawn from `seed` (the `nn` layers' initializers).

        Args:
            seed: a whole number, a `jax.random.key` or an int array (as `sm.Model.init`).
            V: vocabulary size (GPT-2's is 50257).
            T: context: the length of the position table (GPT-2's is 1024).
            D: width; `H` must divide it.
            H: attention heads.
            L: blocks.
            F: the MLP's hidden width (default `4 * D`, as in every released GPT-2).
            max_bytes: the most the model may hold (default 16 GiB).
        """
        if F is None and isinstance(D, int) and not isinstance(D, bool):
            F = 4 * D
        return super().init(seed, max_bytes=max_bytes, V=V, T=T, D=D, H=H, L=L, F=F)


def _check_length(m: GPT2, t: int) -> None:
    if t > m.dims.T:
        raise StateIndexError(
            f"a sequence of {t} tokens is longer than the context T={m.dims.T}",
            fix=f"pass at most {m.dims.T} tokens (or load the weights into a longer context: "
            'sm.load(..., like=GPT2.init(T=...), missing="keep", mismatched="overlap"))',
        )


@shaped
def hidden(m: GPT2, tokens: Int[Array, "b t"]) -> Float[Array, "b t D"]:
    """The final hidden states (after `ln_f`) of every position: what the head reads, and what a
    new head (a classifier) can read instead.

    Raises:
        StateIndexError: (E1401) if `t > T`.
        LayerInputError: (E1803) for a concrete token id outside `0 .. V-1`.
    """
    t = tokens.shape[1]
    _check_length(m, t)
    x = m.wte(tokens) + m.wpe.w[None, :t]
    # Through nn.scan (a loop over the tuple), naming no policy: `TrainStep(remat=...)` applies.
    x = nn.scan(_run_block, m.h, x)
    return m.ln_f(x)


def _run_block(block: Block, x):
    return block(x)


@shaped
def forward(m: GPT2, tokens: Int[Array, "b t"]) -> Float[Array, "b t V"]:
    """The next-token logits at every position (position `i` sees tokens `0 .. i`).

    Args:
        m: the weights.
        tokens: token ids `[b t]`, `t <= T`.

    Returns:
        logits `[b t V]`, equal to `transformers.GPT2LMHeadModel`'s for the same weights.
    """
    return m.wte.logits(hidden(m, tokens))


@shaped
def loss(m: GPT2, tokens: Int[Array, "b t"]) -> Float[Array, ""]:
    """The mean cross-entropy of predicting `tokens[:, 1:]` from the tokens before them (in
    float32 whatever the compute dtype: `nn.cross_entropy`)."""
    return nn.cross_entropy(forward(m, tokens[:, :-1]), tokens[:, 1:])


def positions(m: GPT2, pos, n: int):
    """The position rows `pos .. pos + n - 1` `[1 n D]`, `pos` checked (E1401), never clamped."""
    at = check_index(pos, m.dims.T, what=f"positions of the context T={m.dims.T}", extent=n)
    return lax.dynamic_slice_in_dim(m.wpe.w, at, n)[None]
