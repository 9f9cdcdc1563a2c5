"""The Llama family of decoders (``llama``, ``mistral``, ``qwen2``, ``qwen3``) in Flax NNX.

Layout (pre-norm, as ``transformers``' ``LlamaForCausalLM``)::

    ids (B, T) ─ embed ─▶ L × LlamaBlock ─▶ RMSNorm ─▶ head ─▶ logits (B, T, vocab)

    LlamaBlock:  x + attn(attn_norm(x)),  then  x + mlp(mlp_norm(x))
    attn:        causal grouped-query attention (``num_key_value_heads`` ≤ ``num_attention_heads``
                 key/value heads, each shared by consecutive query heads), rotary positions on q and k
                 (rotate-halves form, ``rope_theta``; ``linear`` scaling divides the positions, ``llama3``
                 scales the low frequencies), per-head
                 RMSNorm of q and k before the rotation for Qwen3, biases as the model type has them
    mlp:         jaxbsd's :class:`~jaxbsd.models.lm.GatedMLP`, ``down_proj(act(gate_proj x) ⊙ up_proj x)``

What each model type differs in (read from ``config.json`` by :meth:`LlamaConfig.from_hf`):

========  ======================================  ===================  ==========
type      attention biases                        q/k norm             MLP biases
========  ======================================  ===================  ==========
llama     q, k, v, o where ``attention_bias``     no                   ``mlp_bias``
mistral   none                                    no                   none
qwen2     q, k, v always, o never                 no                   none
qwen3     q, k, v, o where ``attention_bias``     yes (RMSNorm, head)  none
========  ======================================  ===================  ==========

The head is the transposed token embedding where ``tie_word_embeddings`` (else a bias-free
``lm_head``). Mistral's ``sliding_window`` has no effect on inputs no longer than it; longer inputs
are refused when called. Everything is computed in the parameters' dtype (float32 as loaded), and
every broadcast is between arrays of equal rank.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxbsd.models.causal_lm import (MASK_VALUE, activation_of, allowed_pairs, check_config_json, check_ids,
                                     config_with_token_ids)
from jaxbsd.models.layers import EMBED_INIT, PARAM_DTYPE, check_config_ints, check_config_positive
from jaxbsd.models.lm.modeling import GatedMLP

__all__ = ["MODEL_TYPES", "ARCHITECTURES", "ROPE_TYPES", "LlamaConfig", "Llama", "LlamaBlock", "LlamaAttention",
           "rope_frequencies", "rope_tables", "apply_rope"]

#: The ``model_type`` values this family reads.
MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
#: The ``transformers`` class each model type is written as.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}
#: The RoPE variants supported (``rope_parameters``' / ``rope_scaling``'s ``rope_type``).
ROPE_TYPES = ("default", "linear", "llama3")
#: The fields of a ``llama3`` RoPE besides its ``factor``, in the order of :attr:`LlamaConfig.rope_llama3`.
LLAMA3_FIELDS = ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")

_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Hyper-parameters of :class:`Llama`, as a Hugging Face ``config.json`` states them.

    Attributes:
        model_type: one of :data:`MODEL_TYPES` (decides the names written back).
        vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads: sizes.
        num_key_value_heads: key/value heads (grouped-query attention); must divide the query heads.
        head_dim: width of one head (``hidden_size // num_attention_heads`` where the config has none).
        hidden_act: the Hugging Face name of the gate's activation (:data:`~jaxbsd.models.causal_lm.HF_ACTIVATIONS`).
        max_position_embeddings: longest input.
        rms_norm_eps: RMSNorm epsilon (also of Qwen3's q/k norms).
        rope_theta: base of the rotary frequencies.
        rope_factor: the RoPE scaling factor; None: unscaled. Alone, ``linear`` scaling (positions divided
            by it); with :attr:`rope_llama3`, Llama 3.1's frequency-dependent scaling.
        rope_llama3: ``(low_freq_factor, high_freq_factor, original_max_position_embeddings)`` of a ``llama3``
            RoPE (:func:`rope_tables`); None: another type.
        tie_word_embeddings: logits through the transposed token embedding.
        qkv_bias: biases on q, k, v; out_bias: a bias on the output projection; mlp_bias: on the MLP.
        qk_norm: per-head RMSNorm of queries and keys (Qwen3).
        sliding_window: Mistral's attention window (None: none); inputs longer than it are refused.
        bos_token_id, eos_token_id, pad_token_id: written back as read.
    """

    model_type: str = "llama"
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int = 32
    head_dim: int = 128
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_factor: float | None = None
    rope_llama3: tuple | None = None
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    bos_token_id: int | tuple | None = None
    eos_token_id: int | tuple | None = None
    pad_token_id: int | None = None

    def __post_init__(self):
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"model_type must be one of {list(MODEL_TYPES)}, got {self.model_type!r}")
        check_config_ints(self, "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_key_value_heads ({self.num_key_value_heads}) must divide num_attention_heads "
                             f"({self.num_attention_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even (rotary positions rotate pairs), got {self.head_dim}")
        activation_of(self.hidden_act, "hidden_act")
        check_config_positive(self, "rms_norm_eps", "rope_theta",
                              *(("rope_factor",) if self.rope_factor is not None else ()))
        if self.rope_llama3 is not None:
            if self.rope_factor is None or len(self.rope_llama3) != 3:
                raise ValueError(f"rope_llama3 needs rope_factor and the three values {LLAMA3_FIELDS}, got "
                                 f"{self.rope_factor!r}, {self.rope_llama3!r}")
            low, high, original = self.rope_llama3
            if not 0 < low < high or original <= 0:
                raise ValueError(f"rope_llama3 must have 0 < low_freq_factor < high_freq_factor and a positive "
                                 f"original_max_position_embeddings, got {self.rope_llama3!r}")
        if self.sliding_window is not None and (isinstance(self.sliding_window, bool) or
                                                not isinstance(self.sliding_window, int) or self.sliding_window < 1):
            raise ValueError(f"sliding_window must be None or a positive int, got {self.sliding_window!r}")

    @property
    def activation(self) -> str:
        """jaxbsd's name of the gate's activation."""
        return activation_of(self.hidden_act, "hidden_act")

    @classmethod
    def from_hf(cls, data: dict, where: str = "config.json") -> "LlamaConfig":
        """The config of a Hugging Face ``config.json`` dict; ``ValueError`` naming ``where`` and the field
        for a model type of another family, a missing field, or an option jaxbsd does not compute (a
        ``rope_scaling`` type other than :data:`ROPE_TYPES`, Qwen's ``use_sliding_window``, layer types other
        than full attention, an unknown activation)."""
        check_config_json(data, where, MODEL_TYPES, f"jaxbsd.models.llama reads {list(MODEL_TYPES)}", _REQUIRED)
        kind = data["model_type"]
        theta, factor, llama3 = _rope(data, where)
        if data.get("use_sliding_window"):
            raise ValueError(f"{where}: use_sliding_window is true; jaxbsd computes full attention only")
        layer_types = data.get("layer_types") or []
        if any(t != "full_attention" for t in layer_types):
            raise ValueError(f"{where}: layer_types {sorted(set(layer_types))} are not supported (only "
                             "'full_attention')")
        heads = data["num_attention_heads"]
        attention_bias = bool(data.get("attention_bias", False))
        values = dict(
            model_type=kind, vocab_size=data["vocab_size"], hidden_size=data["hidden_size"],
            intermediate_size=data["intermediate_size"], num_hidden_layers=data["num_hidden_layers"],
            num_attention_heads=heads, num_key_value_heads=data.get("num_key_value_heads") or heads,
            head_dim=data.get("head_dim") or (data["hidden_size"] // heads if isinstance(heads, int) and heads else 0),
            hidden_act=data.get("hidden_act", "silu"),
            max_position_embeddings=data.get("max_position_embeddings", 2048),
            rms_norm_eps=data.get("rms_norm_eps", 1e-6), rope_theta=theta, rope_factor=factor, rope_llama3=llama3,
            tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
            qkv_bias=kind == "qwen2" or (kind in ("llama", "qwen3") and attention_bias),
            out_bias=kind in ("llama", "qwen3") and attention_bias,
            mlp_bias=kind == "llama" and bool(data.get("mlp_bias", False)), qk_norm=kind == "qwen3",
            sliding_window=data.get("sliding_window") if kind == "mistral" else None)
        return config_with_token_ids(cls, values, data, where)

    def to_hf(self) -> dict:
        """A ``config.json`` dict that ``transformers``' class for :attr:`model_type` reads
        (:data:`ARCHITECTURES`)."""
        kind = "default" if self.rope_factor is None else "linear" if self.rope_llama3 is None else "llama3"
        rope = {"rope_type": kind, "rope_theta": self.rope_theta}
        if self.rope_factor is not None:
            rope["factor"] = self.rope_factor
        if self.rope_llama3 is not None:
            rope.update(zip(LLAMA3_FIELDS, self.rope_llama3))
        out = {"architectures": [ARCHITECTURES[self.model_type]], "model_type": self.model_type,
               **{f: getattr(self, f) for f in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                                "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
                                                "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings")},
               "rope_parameters": rope, "dtype": "float32",
               **{f: list(v) if isinstance(v, tuple) else v
                  for f in ("bos_token_id", "eos_token_id", "pad_token_id") for v in [getattr(self, f)]}}
        if self.model_type == "llama":
            out.update(attention_bias=self.qkv_bias, mlp_bias=self.mlp_bias)
        elif self.model_type == "qwen3":
            out.update(attention_bias=self.qkv_bias, use_sliding_window=False, sliding_window=None)
        elif self.model_type == "qwen2":
            out.update(use_sliding_window=False, sliding_window=None)
        else:
            out.update(sliding_window=self.sliding_window)
        return out


def _rope(data: dict, where: str) -> tuple[float, float | None, tuple | None]:
    """``(rope_theta, factor or None, llama3 values or None)`` from ``rope_parameters`` (transformers 5) or
    the older ``rope_theta`` / ``rope_scaling``; ``ValueError`` naming the field for another RoPE type
    or a missing value."""
    params = data.get("rope_parameters")
    field = "rope_parameters"
    if not isinstance(params, dict):
        params = data.get("rope_scaling") or {}
        field = "rope_scaling"
        if not isinstance(params, dict):
            raise ValueError(f"{where}: rope_scaling must be null or an object, got {params!r}")
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if kind not in ROPE_TYPES:
        raise ValueError(f"{where}: {field} type {kind!r} is not supported (supported: {list(ROPE_TYPES)})")
    theta = params.get("rope_theta", data.get("rope_theta", 10000.0))
    factor = params.get("factor") if kind != "default" else None
    if kind != "default" and factor is None:
        raise ValueError(f"{where}: {field} type {kind!r} needs a factor")
    llama3 = None
    if kind == "llama3":
        missing = [name for name in LLAMA3_FIELDS if params.get(name) is None]
        if missing:
            raise ValueError(f"{where}: {field} type 'llama3' needs {missing}")
        llama3 = tuple(params[name] for name in LLAMA3_FIELDS)
    return theta, (None if factor is None else float(factor)), llama3


def rope_frequencies(head_dim: int, theta: float, factor: float | None, dtype,
                     llama3: tuple | None = None) -> jax.Array:
    """The ``head_dim / 2`` rotary frequencies ``f_i = θ^(-2i/head_dim)``, divided by ``factor`` where
    given (``linear``), or, where ``llama3`` is ``(low, high, L)`` too, Llama 3.1's: divided by
    ``factor`` for wavelengths ``2π/f_i`` above ``L/low``, kept below ``L/high``, and in between
    interpolated with weight ``s = (L/wavelength − low)/(high − low)``: ``(1 − s)·f_i/factor + s·f_i``."""
    inv_freq = 1.0 / (jnp.asarray(theta, dtype) ** (jnp.arange(0, head_dim, 2).astype(dtype) / head_dim))
    if factor is not None and llama3 is not None:
        low, high, original = llama3
        wavelen = 2 * math.pi / inv_freq
        scaled = jnp.where(wavelen > original / low, inv_freq / factor, inv_freq)
        smooth = (original / wavelen - low) / (high - low)
        medium = (wavelen >= original / high) & (wavelen <= original / low)
        return jnp.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    if factor is not None:
        return inv_freq / jnp.asarray(factor, dtype)
    return inv_freq


def rope_tables(seq: int, head_dim: int, theta: float, factor: float | None, dtype,
                llama3: tuple | None = None) -> tuple[jax.Array, jax.Array]:
    """``(cos, sin)``, each ``(1, seq, 1, head_dim)``: the rotation angles ``t · f_i`` of positions
    ``t = 0 … seq − 1`` and the frequencies of :func:`rope_frequencies`, both halves of a head alike
    (the rotate-halves form)."""
    inv_freq = rope_frequencies(head_dim, theta, factor, dtype, llama3)
    angle = jnp.arange(seq).astype(dtype)[:, None] * inv_freq[None, :]
    angle = jnp.concatenate([angle, angle], axis=-1).reshape(1, seq, 1, head_dim)
    return jnp.cos(angle), jnp.sin(angle)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate ``x`` ``(B, T, heads, head_dim)`` by the tables of :func:`rope_tables`: feature ``i`` and
    ``i + head_dim/2`` form a pair."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def _rms_norm(dim: int, eps: float, rngs: nnx.Rngs) -> nnx.RMSNorm:
    return nnx.RMSNorm(dim, epsilon=eps, param_dtype=PARAM_DTYPE, rngs=rngs)


class LlamaAttention(nnx.Module):
    """Causal grouped-query self-attention with rotary positions: ``(B, T, d) -> (B, T, d)``.

    ``q_proj`` ``d -> heads·head_dim``, ``k_proj`` and ``v_proj`` ``d -> kv_heads·head_dim``, ``o_proj``
    back to ``d``; query head ``h`` uses key/value head ``h // (heads / kv_heads)``.
    """

    def __init__(self, config: LlamaConfig, *, rngs: nnx.Rngs):
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim

        def linear(i, o, bias):
            return nnx.Linear(i, o, use_bias=bias, param_dtype=PARAM_DTYPE, rngs=rngs)

        self.q_proj, self.k_proj = linear(c.hidden_size, q, c.qkv_bias), linear(c.hidden_size, kv, c.qkv_bias)
        self.v_proj, self.o_proj = linear(c.hidden_size, kv, c.qkv_bias), linear(q, c.hidden_size, c.out_bias)
        self.q_norm = _rms_norm(c.head_dim, c.rms_norm_eps, rngs) if c.qk_norm else nnx.data(None)
        self.k_norm = _rms_norm(c.head_dim, c.rms_norm_eps, rngs) if c.qk_norm else nnx.data(None)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, allowed: jax.Array) -> jax.Array:
        """``x`` ``(B, T, d)``; ``cos``, ``sin`` from :func:`rope_tables`; ``allowed`` ``(B or 1, 1, T, T)``
        bool (:func:`~jaxbsd.models.causal_lm.allowed_pairs`)."""
        b, t, _ = x.shape
        q = self.q_proj(x).reshape(b, t, self.num_heads, self.head_dim)
        k = self.k_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        group = self.num_heads // self.num_kv_heads
        k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(self.head_dim)
        logits = jnp.where(allowed, logits, jnp.asarray(MASK_VALUE, logits.dtype))
        out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, axis=-1), v)
        return self.o_proj(out.reshape(b, t, self.num_heads * self.head_dim))


class LlamaBlock(nnx.Module):
    """Pre-norm decoder block: ``x + attn(attn_norm(x))``, then ``x + mlp(mlp_norm(x))``; ``block.mlp``
    (a :class:`~jaxbsd.models.lm.GatedMLP`, ``(..., d) -> (..., d)``) is what compression replaces."""

    def __init__(self, config: LlamaConfig, *, rngs: nnx.Rngs):
        c = config
        self.attn_norm = _rms_norm(c.hidden_size, c.rms_norm_eps, rngs)
        self.attn = LlamaAttention(c, rngs=rngs)
        self.mlp_norm = _rms_norm(c.hidden_size, c.rms_norm_eps, rngs)
        self.mlp = GatedMLP(c.hidden_size, c.intermediate_size, activation=c.activation, use_bias=c.mlp_bias,
                            rngs=rngs)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, allowed: jax.Array) -> jax.Array:
        x = x + self.attn(self.attn_norm(x), cos, sin, allowed)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nnx.Module):
    """A Llama-family causal LM: ``model(ids, mask=None)`` -> next-token logits ``(B, T, vocab)``.

    ``ids`` ``(B, T)`` integer, ``T ≤ max_position_embeddings`` (and ``≤ sliding_window`` where the
    config has one); ``mask`` ``(B, T)``, 1 for real tokens and 0 for padding (None: all real). Padded
    keys are never attended; positions count from 0 at the first column, so padding goes on the right.
    ``logits[:, t]`` depends on ``ids[:, :t+1]`` only. ``source_dir`` is the directory the model was
    read from (its tokenizer files are copied along by :func:`~jaxbsd.models.llama.params.save_pretrained`).
    """

    def __init__(self, config: LlamaConfig, *, rngs: nnx.Rngs, source_dir: str | None = None):
        if not isinstance(config, LlamaConfig):
            raise ValueError(f"config must be a LlamaConfig, got {type(config).__name__}")
        c = self.config = config
        self.source_dir = None if source_dir is None else str(source_dir)
        self.embed = nnx.Embed(c.vocab_size, c.hidden_size, embedding_init=EMBED_INIT, param_dtype=PARAM_DTYPE,
                               rngs=rngs)
        self.blocks = nnx.List([LlamaBlock(c, rngs=rngs) for _ in range(c.num_hidden_layers)])
        self.norm = _rms_norm(c.hidden_size, c.rms_norm_eps, rngs)
        self.lm_head = (nnx.data(None) if c.tie_word_embeddings else
                        nnx.Linear(c.hidden_size, c.vocab_size, use_bias=False, param_dtype=PARAM_DTYPE, rngs=rngs))

    def __call__(self, ids: jax.Array, mask: jax.Array | None = None) -> jax.Array:
        c = self.config
        check_ids(ids, mask, c.max_position_embeddings)
        t = ids.shape[1]
        if c.sliding_window is not None and t > c.sliding_window:
            raise ValueError(f"ids has {t} positions, more than sliding_window ({c.sliding_window}); jaxbsd "
                             "computes full attention, which equals the sliding window's only up to its length")
        x = self.embed(ids)
        cos, sin = rope_tables(t, c.head_dim, c.rope_theta, c.rope_factor, x.dtype, c.rope_llama3)
        allowed = allowed_pairs(mask, t)
        for block in self.blocks:
            x = block(x, cos, sin, allowed)
        x = self.norm(x)
        return self.embed.attend(x) if self.lm_head is None else self.lm_head(x)
