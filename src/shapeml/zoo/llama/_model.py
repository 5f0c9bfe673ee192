"""The Llama family in named dims, composed from `shapeml.nn` layers: a token table, pre-norm
blocks (`nn.RMSNorm`, grouped-query attention with rotary positions, a SwiGLU MLP) and a head
that is the token table (tied) or its own `[V D]` matrix. Qwen2's query/key/value biases and
Mistral's sliding window are options of the same classes, not copies."""

from __future__ import annotations

import math
import typing
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from ... import nn
from ..._errors import ArgumentError
from ..._shaped import shaped
from ..._traceback import api_boundary
from ...models import Dims, Model, param, static, submodel, submodels
from ...nn._dense import dense
from ...nn._init import fan_in
from ...nn._rotary import rotate
from ...state._index import StateIndexError
from ...state._kvcache import KVCache
from .._errors import TransformerDimsError

__all__ = ["MLP", "Attention", "Block", "Llama", "attend", "forward", "hidden", "loss", "options"]

FAMILIES = ("llama", "qwen2", "mistral")


@api_boundary
class Attention(Model):
    """Grouped-query causal self-attention with rotary positions, `[b t D] -> [b t D]`.

    Dims: `D` (width), `H` (query heads), `K` (key/value heads, dividing `H`: each serves
    `H // K` query heads; `K = H` is plain multi-head attention), `Dh` (head width, even).
    Sub-models: `q` (`nn.Linear` `D -> H * Dh`), `k`, `v` (`D -> K * Dh`), `o` (`H * Dh -> D`);
    each `Linear`'s `bias` option is its own (Qwen2: `q`, `k`, `v` biased; Llama: none).
    Options: `theta` (the rotary base, `rope_theta`), `window` (Mistral's sliding window: a query
    sees the `window` positions up to itself; 0, the default, sees every earlier position).
    Rotary positions follow `transformers`' rotate-half layout.
    """

    dims = Dims(D=256, H=8, K=8, Dh=32)
    q: nn.Linear = submodel(nn.Linear, In="D", Out="H * Dh")
    k: nn.Linear = submodel(nn.Linear, In="D", Out="K * Dh")
    v: nn.Linear = submodel(nn.Linear, In="D", Out="K * Dh")
    o: nn.Linear = submodel(nn.Linear, In="H * Dh", Out="D")
    theta: float = static(default=10000.0)
    window: int = static(default=0)

    def __check_init__(self):
        d = self.dims
        if d.K < 1 or d.H % d.K or d.Dh % 2:
            raise TransformerDimsError(
                f"Llama `Attention` has H={d.H} query heads, K={d.K} key/value heads and head "
                f"width Dh={d.Dh}: K must be at least 1 and divide H, and Dh must be even (rotary "
                "positions rotate pairs of features)",
                fix=f"pick K among the divisors of H={d.H} (K=H is multi-head attention) and an "
                "even Dh",
            )
        bad_theta = not isinstance(self.theta, (int, float)) or isinstance(self.theta, bool)
        if bad_theta or not self.theta > 0:
            raise ArgumentError(
                f"Llama `Attention` theta is {self.theta!r}; the rotary base must be a number > 0",
                fix="pass the checkpoint's rope_theta, e.g. theta=10000.0",
            )
        if type(self.window) is not int or self.window < 0:
            raise ArgumentError(
                f"Llama `Attention` window is {self.window!r}; it must be a whole number >= 0",
                fix="pass window=0 for full causal attention, or Mistral's sliding_window",
            )

    def _heads(self, x, offset):
        """Queries `[b t H Dh]`, keys and values `[b t K Dh]` of `x` at positions `offset + i`."""
        b, t, _ = x.shape
        d = self.dims
        q = self.q(x).reshape(b, t, d.H, d.Dh)
        k = self.k(x).reshape(b, t, d.K, d.Dh)
        v = self.v(x).reshape(b, t, d.K, d.Dh)
        positions = offset + jnp.arange(t)
        return rotate(q, positions, self.theta), rotate(k, positions, self.theta), v

    def _mask(self, queries, keys):
        """Which key positions each query position sees: causal, and within the window."""
        seen = keys[None, :] <= queries[:, None]
        if self.window:
            seen = seen & (queries[:, None] - keys[None, :] < self.window)
        return seen

    @shaped
    def __call__(self, x: Float[Array, "b t D"]) -> Float[Array, "b t D"]:
        """Causal attention over the whole sequence `x [b t D]` (positions `0 .. t-1`)."""
        b, t, _ = x.shape
        q, k, v = self._heads(x, 0)
        mask = self._mask(jnp.arange(t), jnp.arange(t))
        return self.o(attend(q, k, v, mask).reshape(b, t, -1))

    @shaped
    def step(
        self,
        x: Float[Array, "b n D"],
        cache: KVCache,
        layer: int | Int[Array, ""],
        pos: int | Int[Array, ""],
    ) -> tuple[Float[Array, "b n D"], KVCache]:
        """Runs `n` new positions `pos .. pos + n - 1` against `cache` (layer `layer`): their keys
        and values are written, and each attends to the cached positions its mask lets it see.

        Raises:
            StateIndexError: (E1401) if `pos + n` exceeds the cache or `pos < 0`.
        """
        b, n, _ = x.shape
        q, k, v = self._heads(x, pos)
        cache = cache.write(layer, pos, k.astype(cache.k.dtype), v.astype(cache.v.dtype))
        keys, values, _ = cache.read(layer, pos, n)
        mask = self._mask(pos + jnp.arange(n), jnp.arange(cache.ctx))
        y = attend(q, keys.astype(q.dtype), values.astype(q.dtype), mask)
        return self.o(y.reshape(b, n, -1)), cache


@shaped
def attend(
    q: Float[Array, "b n H Dh"],
    k: Float[Array, "b s K Dh"],
    v: Float[Array, "b s K Dh"],
    mask: Bool[Array, "n s"],
) -> Float[Array, "b n H Dh"]:
    """Softmax attention of each query over the keys `mask` lets it see, scaled by `1/sqrt(Dh)`;
    query head `h` reads key/value head `h // (H // K)` (as `transformers`' `repeat_kv`)."""
    b, n, h, dh = q.shape
    kv = k.shape[2]
    q = q.reshape(b, n, kv, h // kv, dh) * jnp.asarray(1 / math.sqrt(dh), q.dtype)
    scores = jnp.einsum("bnkgd,bskd->bkgns", q, k, preferred_element_type=jnp.float32)
    scores = jnp.where(mask[None, None, None], scores, jnp.finfo(scores.dtype).min)
    p = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bkgns,bskd->bnkgd", p, v).reshape(b, n, h, dh)


@api_boundary
class MLP(Model):
    """The SwiGLU MLP: `down(silu(gate(x)) * up(x))`, `[*b D] -> [*b F] -> [*b D]`.

    Dims: `D`, `F`. Sub-models: `gate`, `up` (`nn.Linear` `D -> F`) and `down` (`F -> D`),
    without biases.
    """

    dims = Dims(D=256, F=688)
    gate: nn.Linear = submodel(nn.Linear, In="D", Out="F", bias=False)
    up: nn.Linear = submodel(nn.Linear, In="D", Out="F", bias=False)
    down: nn.Linear = submodel(nn.Linear, In="F", Out="D", bias=False)

    @shaped
    def __call__(self, x: Float[Array, "*b D"]) -> Float[Array, "*b D"]:
        """`[*b D] -> [*b D]` through the gated hidden width `F`."""
        return self.down(jax.nn.silu(self.gate(x)) * self.up(x))


@api_boundary
class Block(Model):
    """A pre-norm Llama block: `x + attn(attn_norm(x))`, then `x + mlp(mlp_norm(x))`.

    Dims: `D`, `H`, `K`, `Dh`, `F`. Sub-models: `attn_norm`, `mlp_norm` (`nn.RMSNorm`, each
    with the checkpoint's `eps`), `attn` (`Attention`), `mlp` (`MLP`).
    """

    dims = Dims(D=256, H=8, K=8, Dh=32, F=688)
    attn_norm: nn.RMSNorm = submodel(nn.RMSNorm)
    attn: Attention = submodel(Attention)
    mlp_norm: nn.RMSNorm = submodel(nn.RMSNorm)
    mlp: MLP = submodel(MLP)

    @shaped
    def __call__(self, x: Float[Array, "b t D"]) -> Float[Array, "b t D"]:
        """The block over the whole sequence `x [b t D]`."""
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


@api_boundary
class Llama(Model):
    """A Llama-family decoder: `V` tokens, context `T`, `L` blocks of width `D`, `H` query heads
    and `K` key/value heads of width `Dh`, SwiGLU width `F`.

    Sub-models: `embed` (`nn.Embedding` `[V D]`), `layers` (`L` `Block`s), `norm` (`nn.RMSNorm`);
    field `head [V D]` (the untied head, `logits = norm(x) @ head.T`; None when `tied`, where the
    head is `embed`). Options: `tied`, `family` (`"llama"`, `"qwen2"` or `"mistral"`: the
    `transformers` class `to_hf` writes for), `bos_token_id`, `eos_token_id` (kept for
    `config.json`). The per-layer options (rotary base, window, norm eps, biases) are the
    layers' own; `Llama.init` sets them all alike, `options(m)` reads them.

    Example:
        >>> m = Llama.init(seed=0, V=512, T=128, D=64, H=4, K=2, F=172, L=2)
        >>> logits = forward(m, tokens)                                   # [b t V]
    """

    dims = Dims(V=32000, T=2048, D=256, H=8, K=8, Dh=32, F=688, L=2)
    embed: nn.Embedding = submodel(nn.Embedding)
    layers: tuple[Block, ...] = submodels(Block, "L")
    norm: nn.RMSNorm = submodel(nn.RMSNorm)
    head: Float[Array, "V D"] | None = param(fan_in(axes=(1,)), when={"tied": False})
    tied: bool = static(default=False)
    family: str = static(default="llama")
    bos_token_id: Any = static(default=None)
    eos_token_id: Any = static(default=None)

    def __check_init__(self):
        if self.family not in FAMILIES:
            raise ArgumentError(
                f"`Llama` family is {self.family!r}; it must be one of {', '.join(FAMILIES)}",
                fix='pass family="llama" (or "qwen2", "mistral": the transformers class to_hf '
                "writes for)",
            )

    @classmethod
    @typing.no_type_check  # validates its arguments itself, with coded errors
    def init(
        cls,
        seed: Any = 0,
        *,
        V: int = 32000,
        T: int = 2048,
        D: int = 256,
        H: int = 8,
        K: int | None = None,
        Dh: int | None = None,
        F: int | None = None,
        L: int = 2,
        eps: float = 1e-6,
        theta: float = 10000.0,
        window: int = 0,
        qkv_bias: bool = False,
        o_bias: bool = False,
        tied: bool = False,
        family: str = "llama",
        bos_token_id: Any = None,
        eos_token_id: Any = None,
        max_bytes: int | None = None,
    ) -> Llama:
        """A new Llama-family model drawn from `seed` (the `nn` layers' initializers; biases
        zero).

        Args:
            seed: a whole number, a `jax.random.key` or an int array (as `sm.Model.init`).
            V, T, D, H, L: vocabulary, context, width, query heads, blocks.
            K: key/value heads (default `H`; dividing `H`).
            Dh: head width (default `D // H`; even).
            F: the SwiGLU width (default `8 * D // 3` rounded up to a multiple of 8).
            eps: every RMSNorm's epsilon (`rms_norm_eps`).
            theta: the rotary base (`rope_theta`).
            window: a sliding window (Mistral), 0 for none.
            qkv_bias: biases on the query, key and value projections (Qwen2).
            o_bias: a bias on the output projection (Llama's `attention_bias` sets both).
            tied: the head is the token table.
            family: the `transformers` architecture `to_hf` writes.
            bos_token_id, eos_token_id: kept for `to_hf`'s `config.json`.
            max_bytes: the most the model may hold (default 16 GiB).
        """
        whole = isinstance(D, int) and not isinstance(D, bool) and isinstance(H, int) and H > 0
        K = H if K is None else K
        if Dh is None:
            Dh = D // H if whole else D
        if F is None and whole:
            F = -(-(8 * D // 3) // 8) * 8
        m = super().init(
            seed,
            max_bytes=max_bytes,
            V=V,
            T=T,
            D=D,
            H=H,
            K=K,
            Dh=Dh,
            F=F,
            L=L,
            tied=tied,
            family=family,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
        )
        return with_options(
            m, eps=eps, theta=theta, window=window, qkv_bias=qkv_bias, o_bias=o_bias
        )


def _biased(lin: nn.Linear, bias: bool) -> nn.Linear:
    if lin.bias == bias:
        return lin
    return lin.replace(bias=bias, b=jnp.zeros((lin.dims.Out,), lin.w.dtype) if bias else None)


def with_options(
    m: Llama, *, eps: float, theta: float, window: int, qkv_bias: bool, o_bias: bool
) -> Llama:
    """`m` with every layer's options set: norm eps, rotary base, window, biases (a bias that
    appears is zeros)."""
    for name, flag in (("qkv_bias", qkv_bias), ("o_bias", o_bias)):
        if not isinstance(flag, bool):
            raise ArgumentError(
                f"`Llama.init` {name} is {flag!r}; it must be True or False",
                fix=f"pass {name}=True or {name}=False",
            )

    def block(b: Block) -> Block:
        a = b.attn
        a = a.replace(
            theta=theta,
            window=window,
            q=_biased(a.q, qkv_bias),
            k=_biased(a.k, qkv_bias),
            v=_biased(a.v, qkv_bias),
            o=_biased(a.o, o_bias),
        )
        return b.replace(
            attn=a, attn_norm=b.attn_norm.replace(eps=eps), mlp_norm=b.mlp_norm.replace(eps=eps)
        )

    return m.replace(layers=tuple(block(b) for b in m.layers), norm=m.norm.replace(eps=eps))


@api_boundary
def options(m: Llama) -> dict[str, Any]:
    """The options every layer of `m` holds alike: `eps`, `theta`, `window`, `qkv_bias`,
    `o_bias` (what `Llama.init` takes and `to_hf` writes).

    Raises:
        ArgumentError: (E0002) when the layers differ in one of them.
    """
    found: dict[str, set] = {k: set() for k in ("eps", "theta", "window", "qkv_bias", "o_bias")}
    found["eps"].add(m.norm.eps)
    for b in m.layers:
        a = b.attn
        found["eps"] |= {b.attn_norm.eps, b.mlp_norm.eps}
        found["theta"].add(a.theta)
        found["window"].add(a.window)
        found["qkv_bias"] |= {a.q.bias, a.k.bias, a.v.bias}
        found["o_bias"].add(a.o.bias)
    mixed = {k: sorted(v, key=repr) for k, v in found.items() if len(v) > 1}
    if mixed:
        raise ArgumentError(
            f"the layers of this Llama differ in {', '.join(f'{k} {v}' for k, v in mixed.items())}; "
            "one config.json holds one value of each",
            fix="build every layer with the same options (Llama.init sets them alike)",
        )
    defaults = {"theta": 10000.0, "window": 0, "qkv_bias": False, "o_bias": False}
    return {k: (next(iter(v)) if v else defaults[k]) for k, v in found.items()}


def _check_length(m: Llama, t: int) -> None:
    if t > m.dims.T:
        raise StateIndexError(
            f"a sequence of {t} tokens is longer than the context T={m.dims.T}",
            fix=f"pass at most {m.dims.T} tokens (max_position_embeddings of the config)",
        )


@shaped
def hidden(m: Llama, tokens: Int[Array, "b t"]) -> Float[Array, "b t D"]:
    """The final hidden states (after `norm`) of every position.

    Raises:
        StateIndexError: (E1401) if `t > T`.
        LayerInputError: (E1803) for a concrete token id outside `0 .. V-1`.
    """
    _check_length(m, tokens.shape[1])
    x = m.embed(tokens)
    # Through nn.scan (a loop over the tuple), naming no policy: `TrainStep(remat=...)` applies.
    x = nn.scan(_run_block, m.layers, x)
    return m.norm(x)


def _run_block(block: Block, x):
    return block(x)


def logits_of(m: Llama, x):
    """The head: `x @ embed.w.T` when tied, else `x @ head.T`."""
    return m.embed.logits(x) if m.head is None else dense(x, m.head.T)


@shaped
def forward(m: Llama, tokens: Int[Array, "b t"]) -> Float[Array, "b t V"]:
    """The next-token logits at every position (position `i` sees tokens `0 .. i`).

    Args:
        m: the weights.
        tokens: token ids `[b t]`, `t <= T`.

    Returns:
        logits `[b t V]`, equal to `transformers`' `LlamaForCausalLM` (or Qwen2's, Mistral's)
        for the same weights.
    """
    return logits_of(m, hidden(m, tokens))


@shaped
def loss(m: Llama, tokens: Int[Array, "b t"]) -> Float[Array, ""]:
    """The mean cross-entropy of predicting `tokens[:, 1:]` from the tokens before them (as
    `transformers` computes the loss of `model(ids, labels=ids)`)."""
    return nn.cross_entropy(forward(m, tokens[:, :-1]), tokens[:, 1:])
