"""GPT-2 in Flax NNX, as ``transformers``' ``GPT2LMHeadModel`` computes it.

Layout (pre-norm, learned absolute positions)::

    ids (B, T) ─ wte + wpe ─▶ n_layer × GPT2Block ─▶ LayerNorm ─▶ head ─▶ logits (B, T, vocab)

    GPT2Block:  x + attn(ln_1(x)),  then  x + mlp(ln_2(x))
    attn:       causal multi-head self-attention, one fused ``c_attn`` (d -> 3d: q, k, v) and ``c_proj``,
                biases, logits scaled by 1/sqrt(head width)
    mlp:        jaxbsd's :class:`~jaxbsd.models.layers.MLP` ``fc2(h(fc1 x))``, ``d -> n_inner -> d``

GPT-2's ``Conv1D`` stores its weights ``(in, out)``, as Flax kernels are: they load untransposed.
The head is the transposed token embedding where ``tie_word_embeddings`` (GPT-2's default), else a
bias-free ``lm_head``. Everything is computed in the parameters' dtype (float32 as loaded), and every
broadcast is between arrays of equal rank.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxbsd.models.causal_lm import (MASK_VALUE, activation_of, allowed_pairs, check_config_json, check_ids,
                                     config_with_token_ids)
from jaxbsd.models.layers import EMBED_INIT, MLP, PARAM_DTYPE, check_config_ints, check_config_positive

__all__ = ["GPT2Config", "GPT2", "GPT2Block", "GPT2Attention"]

_REQUIRED = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")
# Options of GPT2Config that change the computation, and the value jaxbsd computes.
_FIXED = {"add_cross_attention": False, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False}


@dataclasses.dataclass(frozen=True)
class GPT2Config:
    """Hyper-parameters of :class:`GPT2`, named as GPT-2's ``config.json`` names them.

    Attributes:
        vocab_size, n_positions, n_embd, n_layer, n_head: sizes (``n_positions``: longest input).
        n_inner: the MLP's hidden width (``4 · n_embd`` where the config has null).
        activation_function: the Hugging Face name of the MLP's activation
            (:data:`~jaxbsd.models.causal_lm.HF_ACTIVATIONS`; GPT-2's ``gelu_new`` is the tanh GELU).
        layer_norm_epsilon: LayerNorm epsilon.
        tie_word_embeddings: logits through the transposed token embedding.
        bos_token_id, eos_token_id, pad_token_id: written back as read.
    """

    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int = 3072
    activation_function: str = "gelu_new"
    layer_norm_epsilon: float = 1e-5
    tie_word_embeddings: bool = True
    bos_token_id: int | tuple | None = 50256
    eos_token_id: int | tuple | None = 50256
    pad_token_id: int | None = None

    def __post_init__(self):
        check_config_ints(self, "vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_head ({self.n_head}) must divide n_embd ({self.n_embd})")
        activation_of(self.activation_function, "activation_function")
        check_config_positive(self, "layer_norm_epsilon")

    @property
    def activation(self) -> str:
        """jaxbsd's name of the MLP's activation."""
        return activation_of(self.activation_function, "activation_function")

    @classmethod
    def from_hf(cls, data: dict, where: str = "config.json") -> "GPT2Config":
        """The config of a Hugging Face ``config.json`` dict; ``ValueError`` naming ``where`` and the field
        for another model type, a missing field, an unknown activation or an option jaxbsd does not compute
        (cross-attention, unscaled or layer-scaled attention logits)."""
        check_config_json(data, where, ("gpt2",), "jaxbsd.models.gpt2 reads GPT-2 checkpoints (model_type 'gpt2') "
                          "only", _REQUIRED)
        for name, value in _FIXED.items():
            if bool(data.get(name, value)) != value:
                raise ValueError(f"{where}: {name}={data[name]!r} is not supported (jaxbsd computes {name}={value})")
        values = {n: data[n] for n in _REQUIRED}
        inner = data.get("n_inner")
        values.update(
            n_inner=4 * data["n_embd"] if inner is None and isinstance(data["n_embd"], int) else inner,
            activation_function=data.get("activation_function", "gelu_new"),
            layer_norm_epsilon=data.get("layer_norm_epsilon", 1e-5),
            tie_word_embeddings=bool(data.get("tie_word_embeddings", True)))
        return config_with_token_ids(cls, values, data, where)

    def to_hf(self) -> dict:
        """A ``config.json`` dict that ``transformers.GPT2LMHeadModel`` reads."""
        out = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "dtype": "float32", **_FIXED}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


def _layer_norm(dim: int, eps: float, rngs: nnx.Rngs) -> nnx.LayerNorm:
    # The two-pass variance, as torch.nn.LayerNorm computes it.
    return nnx.LayerNorm(dim, epsilon=eps, use_fast_variance=False, param_dtype=PARAM_DTYPE, rngs=rngs)


class GPT2Attention(nnx.Module):
    """Causal multi-head self-attention ``(B, T, d) -> (B, T, d)``: ``c_attn`` ``d -> 3d`` (queries, keys,
    values in that order, heads consecutive within each), ``c_proj`` ``d -> d``, both with biases."""

    def __init__(self, config: GPT2Config, *, rngs: nnx.Rngs):
        d = config.n_embd
        self.num_heads, self.head_dim = config.n_head, d // config.n_head
        self.c_attn = nnx.Linear(d, 3 * d, param_dtype=PARAM_DTYPE, rngs=rngs)
        self.c_proj = nnx.Linear(d, d, param_dtype=PARAM_DTYPE, rngs=rngs)

    def __call__(self, x: jax.Array, allowed: jax.Array) -> jax.Array:
        """``x`` ``(B, T, d)``; ``allowed`` ``(B or 1, 1, T, T)`` bool
        (:func:`~jaxbsd.models.causal_lm.allowed_pairs`)."""
        b, t, d = x.shape
        qkv = self.c_attn(x).reshape(b, t, 3, self.num_heads, self.head_dim)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(self.head_dim)
        logits = jnp.where(allowed, logits, jnp.asarray(MASK_VALUE, logits.dtype))
        out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, axis=-1), v)
        return self.c_proj(out.reshape(b, t, d))


class GPT2Block(nnx.Module):
    """Pre-norm block ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``; ``block.mlp`` (a
    :class:`~jaxbsd.models.layers.MLP`, ``(..., d) -> (..., d)``) is what compression replaces."""

    def __init__(self, config: GPT2Config, *, rngs: nnx.Rngs):
        c = config
        self.ln_1 = _layer_norm(c.n_embd, c.layer_norm_epsilon, rngs)
        self.attn = GPT2Attention(c, rngs=rngs)
        self.ln_2 = _layer_norm(c.n_embd, c.layer_norm_epsilon, rngs)
        self.mlp = MLP(c.n_embd, c.n_inner, activation=c.activation, rngs=rngs)

    def __call__(self, x: jax.Array, allowed: jax.Array) -> jax.Array:
        x = x + self.attn(self.ln_1(x), allowed)
        return x + self.mlp(self.ln_2(x))


class GPT2(nnx.Module):
    """GPT-2 as a causal LM: ``model(ids, mask=None)`` -> next-token logits ``(B, T, vocab)``.

    ``ids`` ``(B, T)`` integer, ``T ≤ n_positions``; ``mask`` ``(B, T)``, 1 for real tokens and 0 for
    padding (None: all real). Padded keys are never attended; positions count from 0 at the first column,
    so padding goes on the right. ``logits[:, t]`` depends on ``ids[:, :t+1]`` only. ``source_dir`` is the
    directory the model was read from (its tokenizer files are copied along by
    :func:`~jaxbsd.models.gpt2.params.save_pretrained`).
    """

    def __init__(self, config: GPT2Config, *, rngs: nnx.Rngs, source_dir: str | None = None):
        if not isinstance(config, GPT2Config):
            raise ValueError(f"config must be a GPT2Config, got {type(config).__name__}")
        c = self.config = config
        self.source_dir = None if source_dir is None else str(source_dir)
        self.wte = nnx.Embed(c.vocab_size, c.n_embd, embedding_init=EMBED_INIT, param_dtype=PARAM_DTYPE, rngs=rngs)
        self.wpe = nnx.Embed(c.n_positions, c.n_embd, embedding_init=EMBED_INIT, param_dtype=PARAM_DTYPE, rngs=rngs)
        self.blocks = nnx.List([GPT2Block(c, rngs=rngs) for _ in range(c.n_layer)])
        self.ln_f = _layer_norm(c.n_embd, c.layer_norm_epsilon, rngs)
        self.lm_head = (nnx.data(None) if c.tie_word_embeddings else
                        nnx.Linear(c.n_embd, c.vocab_size, use_bias=False, param_dtype=PARAM_DTYPE, rngs=rngs))

    def __call__(self, ids: jax.Array, mask: jax.Array | None = None) -> jax.Array:
        check_ids(ids, mask, self.config.n_positions)
        t = ids.shape[1]
        x = self.wte(ids) + self.wpe(jnp.arange(t).reshape(1, t))
        allowed = allowed_pairs(mask, t)
        for block in self.blocks:
            x = block(x, allowed)
        x = self.ln_f(x)
        return self.wte.attend(x) if self.lm_head is None else self.lm_head(x)
