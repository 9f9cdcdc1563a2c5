"""A small decoder-only character language model in Flax NNX, with a gated (SwiGLU) MLP.

Layout (Llama-style, pre-norm)::

    tokens (B, T) int ─ embed ─▶ depth × DecoderBlock ─▶ RMSNorm ─▶ head ─▶ logits (B, T, vocab)

    DecoderBlock:  x + attn(norm1(x)),  then  x + mlp(norm2(x))
    attn:          causal multi-head self-attention, rotary positions on q and k, no biases
    mlp:           GatedMLP, down_proj(act(gate_proj(x)) ⊙ up_proj(x)), SiLU, no biases

**Positions are rotary** (RoPE, Su et al. 2021, the "rotate halves" form of GPT-NeoX/Llama):
each head's query and key are rotated by angles ``t·θ_i`` with ``θ_i = base^(-2i/head_dim)``, so
attention logits depend on relative offsets only and there is no position table to learn.
``config.context`` is the training window; longer inputs are refused (they were never seen).

**Output head.** Tied by default (``tie_embeddings=True``): the logits are the final normalised
features times the token-embedding matrix transposed (``embed.attend``), which saves
``vocab·dim`` parameters and trains better on small data; untied adds a bias-free
``nnx.Linear`` ``head``.

**Compression hooks**, as for the vision models: ``model.blocks`` is an ``nnx.List``, each block
holds its MLP as ``block.mlp`` (a :class:`GatedMLP` with three ``nnx.Linear`` children
``gate_proj``, ``up_proj``, ``down_proj``; contract ``(..., dim) -> (..., dim)``), so
compression is assignment ``model.blocks[i].mlp = other``; ``model.block_input(tokens, i)``
and ``block.mlp_input(x)`` give the tokens each MLP sees (used by Jacobian capture).

Parameters are float32 and every broadcast is between arrays of equal rank
(``jax_numpy_rank_promotion="raise"``).  No dropout: train and eval modes agree.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxbsd.models.layers import ACTIVATIONS, EMBED_INIT, PARAM_DTYPE, check_config_ints, check_config_positive

__all__ = ["LMConfig", "LM", "GatedMLP", "CausalSelfAttention", "DecoderBlock", "rotary_embedding"]

# Logit offset of masked (future) pairs: exp(-1e9) is exactly 0 in float32 and float64.
_MASK_VALUE = -1e9


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """Hyper-parameters of :class:`LM`.

    Attributes:
        vocab_size: number of token ids (98 for :class:`jaxbsd.data.CharVocab`).
        context: longest input sequence T (the training window).
        dim: model width d (every MLP is ``dim → mlp_dim → dim``, gated).
        depth: number of decoder blocks.
        num_heads: attention heads; must divide ``dim`` into an even head width.
        mlp_dim: hidden width of the gated MLP (≈ 3·dim, as Llama's 8/3·d rounded).
        activation: the gate's activation, a key of ``ACTIVATIONS`` (``"silu"``: SwiGLU).
        mlp_bias: biases on ``gate_proj``/``up_proj``/``down_proj`` (Llama: none).
        tie_embeddings: logits through the transposed token embedding (else a separate head).
        rope_base: base of the rotary frequencies.
        norm_eps: RMSNorm epsilon.
    """

    vocab_size: int = 98
    context: int = 128
    dim: int = 128
    depth: int = 4
    num_heads: int = 4
    mlp_dim: int = 384
    activation: str = "silu"
    mlp_bias: bool = False
    tie_embeddings: bool = True
    rope_base: float = 10000.0
    norm_eps: float = 1e-6

    def __post_init__(self):
        check_config_ints(self, "vocab_size", "context", "dim", "depth", "num_heads", "mlp_dim")
        if self.dim % self.num_heads or (self.dim // self.num_heads) % 2:
            raise ValueError(
                f"num_heads ({self.num_heads}) must divide dim ({self.dim}) into an even head width "
                "(rotary positions rotate pairs of features)"
            )
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}")
        for name in ("mlp_bias", "tie_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        check_config_positive(self, "rope_base", "norm_eps")
        if self.rope_base <= 1:
            raise ValueError(f"rope_base must be > 1, got {self.rope_base!r}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @classmethod
    def pystdlib(cls, **overrides):
        """The model trained on the ``pystdlib`` corpus (recorded in ``training_lm_pystdlib.json``):
        98 characters, context 128, d = 128, 4 blocks of 4 heads, gated MLP 384, tied head."""
        return cls(**overrides)

    @classmethod
    def tiny(cls, **overrides):
        """A few-thousand-parameter model for tests: vocab 11, context 16, d = 16, 2 blocks."""
        base = dict(vocab_size=11, context=16, dim=16, depth=2, num_heads=2, mlp_dim=24)
        return cls(**{**base, **overrides})


def rotary_embedding(x: jax.Array, base: float) -> jax.Array:
    """Rotate each head's features by position: ``(B, T, H, hd) -> (B, T, H, hd)``.

    Feature ``i`` and ``i + hd/2`` form a pair rotated by ``t·base^(-2i/hd)`` at position t, so
    ``<rot(q, s), rot(k, t)>`` depends on ``t − s`` only (computed in x's dtype).
    """
    t, hd = x.shape[1], x.shape[-1]
    half = hd // 2
    freq = base ** (-jnp.arange(half, dtype=x.dtype) * 2 / hd)  # (hd/2,)
    angle = jnp.arange(t, dtype=x.dtype)[:, None] * freq[None, :]  # (T, hd/2)
    cos = jnp.cos(angle).reshape(1, t, 1, half)
    sin = jnp.sin(angle).reshape(1, t, 1, half)
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


class GatedMLP(nnx.Module):
    """Gated feed-forward network ``down_proj(act(gate_proj(x)) ⊙ up_proj(x))`` (SwiGLU for SiLU).

    Args:
        dim: input and output width m.
        hidden: hidden width H.
        activation: the gate's activation, a key of ``ACTIVATIONS``.
        use_bias: biases on the three projections.

    Shapes:
        ``(..., dim) -> (..., dim)``; ``gate_proj.kernel`` and ``up_proj.kernel`` ``(dim, hidden)``,
        ``down_proj.kernel`` ``(hidden, dim)`` (Flax's row-vector convention: y = x @ kernel).
    """

    def __init__(self, dim: int, hidden: int, *, activation: str = "silu", use_bias: bool = False,
                 rngs: nnx.Rngs):
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.dim = dim
        self.hidden = hidden
        self.activation = activation
        self.gate_proj = nnx.Linear(dim, hidden, use_bias=use_bias, param_dtype=PARAM_DTYPE, rngs=rngs)
        self.up_proj = nnx.Linear(dim, hidden, use_bias=use_bias, param_dtype=PARAM_DTYPE, rngs=rngs)
        self.down_proj = nnx.Linear(hidden, dim, use_bias=use_bias, param_dtype=PARAM_DTYPE, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(ACTIVATIONS[self.activation](self.gate_proj(x)) * self.up_proj(x))


class CausalSelfAttention(nnx.Module):
    """Multi-head causal self-attention with rotary positions, no biases.

    ``(B, T, dim) -> (B, T, dim)``: position t attends to positions ≤ t only.
    """

    def __init__(self, dim: int, num_heads: int, *, rope_base: float = 10000.0, rngs: nnx.Rngs):
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.rope_base = float(rope_base)
        self.qkv = nnx.Linear(dim, 3 * dim, use_bias=False, param_dtype=PARAM_DTYPE, rngs=rngs)
        self.proj = nnx.Linear(dim, dim, use_bias=False, param_dtype=PARAM_DTYPE, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        b, t, _ = x.shape
        qkv = self.qkv(x).reshape(b, t, 3, self.num_heads, self.head_dim)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # (B, T, H, hd)
        q = rotary_embedding(q, self.rope_base)
        k = rotary_embedding(k, self.rope_base)
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(self.head_dim)
        causal = jnp.tril(jnp.ones((t, t), bool)).reshape(1, 1, t, t)
        logits = jnp.where(causal, logits, jnp.asarray(_MASK_VALUE, logits.dtype))
        weights = jax.nn.softmax(logits, axis=-1)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
        return self.proj(out.reshape(b, t, self.dim))


class DecoderBlock(nnx.Module):
    """Pre-norm decoder block: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))`` (RMSNorm).

    ``block.mlp`` is the only attribute compression touches; :meth:`mlp_input` gives the MLP's
    input tokens for a block input, as :class:`jaxbsd.models.layers.Block` does.
    """

    def __init__(self, config: LMConfig, *, rngs: nnx.Rngs):
        c = config
        self.norm1 = nnx.RMSNorm(c.dim, epsilon=c.norm_eps, param_dtype=PARAM_DTYPE, rngs=rngs)
        self.attn = CausalSelfAttention(c.dim, c.num_heads, rope_base=c.rope_base, rngs=rngs)
        self.norm2 = nnx.RMSNorm(c.dim, epsilon=c.norm_eps, param_dtype=PARAM_DTYPE, rngs=rngs)
        self.mlp = GatedMLP(c.dim, c.mlp_dim, activation=c.activation, use_bias=c.mlp_bias, rngs=rngs)

    def attention_residual(self, x: jax.Array) -> jax.Array:
        """The state after the attention branch, ``x + attn(norm1(x))``."""
        return x + self.attn(self.norm1(x))

    def mlp_input(self, x: jax.Array) -> jax.Array:
        """The tokens that ``self.mlp`` sees for block input ``x``, ``(B, T, dim)``."""
        return self.norm2(self.attention_residual(x))

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.attention_residual(x)
        return x + self.mlp(self.norm2(x))


class LM(nnx.Module):
    """Decoder-only character language model.

    ``model(tokens)``: ``(B, T)`` integer ids in ``[0, vocab_size)``, ``T ≤ context`` →
    next-token logits ``(B, T, vocab_size)``; ``logits[:, t]`` depends on ``tokens[:, :t+1]`` only.
    """

    kind = "lm"

    def __init__(self, config: LMConfig, *, rngs: nnx.Rngs):
        if not isinstance(config, LMConfig):
            raise ValueError(f"config must be an LMConfig, got {type(config).__name__}")
        self.config = config
        c = config
        # Small normal init (std 0.02, GPT-2's): with a tied head the initial logits stay near 0.
        self.embed = nnx.Embed(c.vocab_size, c.dim, embedding_init=EMBED_INIT, param_dtype=PARAM_DTYPE,
                               rngs=rngs)
        self.blocks = nnx.List([DecoderBlock(c, rngs=rngs) for _ in range(c.depth)])
        self.norm = nnx.RMSNorm(c.dim, epsilon=c.norm_eps, param_dtype=PARAM_DTYPE, rngs=rngs)
        if c.tie_embeddings:
            self.head = nnx.data(None)
        else:
            self.head = nnx.Linear(c.dim, c.vocab_size, use_bias=False, param_dtype=PARAM_DTYPE, rngs=rngs)

    def _check_tokens(self, tokens) -> None:
        if getattr(tokens, "ndim", None) != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise ValueError(
                f"tokens must be a (B, T) integer array, got {getattr(tokens, 'shape', None)} "
                f"{getattr(tokens, 'dtype', None)}"
            )
        if not 1 <= tokens.shape[1] <= self.config.context:
            raise ValueError(f"tokens must have 1..{self.config.context} (context) positions, got {tokens.shape[1]}")

    def embed_tokens(self, tokens: jax.Array) -> jax.Array:
        """Input of block 0: ``(B, T)`` ids → ``(B, T, dim)``."""
        self._check_tokens(tokens)
        return self.embed(tokens)

    def block_input(self, tokens: jax.Array, index: int) -> jax.Array:
        """Tokens fed to ``self.blocks[index]``, shape ``(B, T, dim)``."""
        x = self.embed_tokens(tokens)
        for block in self.blocks[:index]:
            x = block(x)
        return x

    def features(self, tokens: jax.Array) -> jax.Array:
        """Final normalised features ``(B, T, dim)``."""
        return self.norm(self.block_input(tokens, len(self.blocks)))

    def logits(self, features: jax.Array) -> jax.Array:
        """The output head on ``(..., dim)`` features → ``(..., vocab_size)``."""
        return self.embed.attend(features) if self.head is None else self.head(features)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        return self.logits(self.features(tokens))
