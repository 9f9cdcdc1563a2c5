"""BERT-family encoders: the config, the modules and the sentence-embedding pipeline.

Layout (post-LN BERT, Devlin et al. 2019; the ``BertModel`` of ``transformers``)::

    ids (B, T) ─ embeddings ─▶ depth × BertLayer ─▶ hidden (B, T, d) ─ pooling ─▶ (B, d) [─ normalize]

    embeddings:  LayerNorm(word[ids] + position[p] + token_type[type_ids])
    BertLayer:   x = LayerNorm(x + attention(x, mask));  x = LayerNorm(x + mlp(x))
    mlp:         jaxbsd's own MLP, fc2(h(fc1(x))), so the engine knows its spec without looking

The same modules run the BERT-shaped encoders of other ``model_type`` s (the field
:attr:`BertConfig.model_type`): RoBERTa and XLM-R count positions past the padding id
(``p = cumsum(ids != pad) · (ids != pad) + pad``, :attr:`BertConfig.position_padding_idx`);
DistilBERT and MPNet have no token types (``type_vocab_size`` 0); MPNet adds a learned bias per
relative-position bucket and head to every layer's attention logits
(:attr:`BertConfig.relative_attention_num_buckets`, :func:`relative_position_bucket`).

**Hugging Face layout.** :mod:`jaxbsd.models.bert.params` reads and writes the checkpoint directories
(:func:`~jaxbsd.models.bert.params.from_pretrained`, :func:`~jaxbsd.models.bert.params.save_pretrained`).

**Activations** by ``hidden_act``: ``"gelu"`` (exact, erf), ``"gelu_new"``, ``"gelu_pytorch_tanh"``
and ``"gelu_fast"`` (the tanh approximation), ``"relu"``.

**Compression hooks.** :class:`Encoder` is an NNX module: ``encoder(ids, mask)`` is the jittable
forward pass (pooled, normalised embeddings), so ``compress_model(encoder, lambda m: m(ids, mask),
mlps=None, ...)`` finds the MLPs ``bert.layers.{i}.mlp``. The tokenizer is a static attribute
(not state: it is no pytree); the pooler weights of the checkpoint are kept as non-trainable
:class:`Unused` variables, so they are written back but are not counted as parameters (the
sentence embedding never uses them).

Parameters are float32; every broadcast is between arrays of equal rank
(``jax_numpy_rank_promotion="raise"``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxbsd.models.layers import MLP, PARAM_DTYPE, check_config_ints, check_config_positive

__all__ = ["BertConfig", "Bert", "BertLayer", "BertAttention", "BertEmbeddings", "Encoder", "Unused",
           "POOLINGS", "HF_ACTIVATIONS", "ENCODER_MODEL_TYPES", "pool", "calibration_windows",
           "relative_position_bucket"]

#: ``hidden_act`` of a Hugging Face config -> the name in :data:`~jaxbsd.models.layers.ACTIVATIONS`.
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                  "gelu_fast": "gelu_tanh", "relu": "relu"}
#: The ``model_type`` s these modules run (:attr:`BertConfig.model_type`).
ENCODER_MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "distilbert", "mpnet")
#: Pooling modes (sentence-transformers' ``pooling_mode_*_tokens`` names without the affixes).
POOLINGS = ("mean", "cls", "max", "mean_sqrt_len")

# Logit offset of masked keys: exp(-1e9 - max) is exactly 0 in float32 and float64.
_MASK_VALUE = -1e9


class Unused(nnx.Variable):
    """A checkpoint tensor the encoder keeps only to write it back (BERT's pooler): not a
    ``nnx.Param``, so neither counted, trained nor compressed."""


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Hyper-parameters of :class:`Bert`, the fields of a Hugging Face ``config.json``.

    The fields ``vocab_size``, ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
    ``intermediate_size``, ``max_position_embeddings`` and ``type_vocab_size`` mean what they mean
    in ``transformers.BertConfig``.

    Attributes:
        hidden_act: the config's name (a key of :data:`HF_ACTIVATIONS`), kept for writing back.
        layer_norm_eps: LayerNorm epsilon.
        pad_token_id: the padding id (written back).
        type_vocab_size: token types; 0: no token-type embedding (DistilBERT, MPNet).
        model_type: the Hugging Face ``model_type`` (one of :data:`ENCODER_MODEL_TYPES`): which
            tensor names and ``config.json`` fields the checkpoint has.
        position_padding_idx: None: token ``t`` has position ``t``; an id ``p``: positions count the
            tokens that are not ``p``, from ``p + 1``, and padding tokens get position ``p``
            (RoBERTa, XLM-R, MPNet).
        relative_attention_num_buckets: 0: none; else MPNet's relative-position buckets (32).
        hf_fields: the JSON text of the ``config.json`` fields the model does not use, written back
            unchanged (a string, so the config stays hashable).
    """

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    model_type: str = "bert"
    position_padding_idx: int | None = None
    relative_attention_num_buckets: int = 0
    hf_fields: str = ""

    def __post_init__(self):
        check_config_ints(self, "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                          "intermediate_size", "max_position_embeddings")
        if self.model_type not in ENCODER_MODEL_TYPES:
            raise ValueError(f"model_type must be one of {ENCODER_MODEL_TYPES}, got {self.model_type!r}")
        for name in ("type_vocab_size", "relative_attention_num_buckets"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if self.relative_attention_num_buckets not in (0, 32):
            # MPNet's encoder computes the buckets for 32 whatever the table's size
            raise ValueError(f"relative_attention_num_buckets {self.relative_attention_num_buckets} is not "
                             "supported (only 32, as transformers' MPNet computes)")
        padding = self.position_padding_idx
        if padding is not None and (isinstance(padding, bool) or not isinstance(padding, int)
                                    or not 0 <= padding < self.max_position_embeddings - 1):
            raise ValueError(f"position_padding_idx must be None or an int in [0, max_position_embeddings - 1), "
                             f"got {padding!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must divide hidden_size "
                             f"({self.hidden_size})")
        if self.hidden_act not in HF_ACTIVATIONS:
            raise ValueError(f"hidden_act must be one of {sorted(HF_ACTIVATIONS)}, got {self.hidden_act!r}")
        check_config_positive(self, "layer_norm_eps")

    @property
    def max_tokens(self) -> int:
        """The longest input: ``max_position_embeddings``, less ``position_padding_idx + 1`` where
        positions are counted past the padding id."""
        offset = 0 if self.position_padding_idx is None else self.position_padding_idx + 1
        return self.max_position_embeddings - offset

    @property
    def activation(self) -> str:
        """The activation's name in :data:`~jaxbsd.models.layers.ACTIVATIONS`."""
        return HF_ACTIVATIONS[self.hidden_act]

    @classmethod
    def from_hf(cls, data: dict, where: str = "config.json") -> "BertConfig":
        """The config of a Hugging Face ``config.json`` dict; ``ValueError`` naming ``where`` for a
        model that is not a BERT with absolute positions, or a missing or bad field."""
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
        model_type = data.get("model_type")
        if model_type not in ("bert", "roberta", "xlm-roberta"):
            raise ValueError(f"{where}: model_type is {model_type!r}; jaxbsd.models.bert reads "
                             "BERT checkpoints (model_type 'bert', 'roberta', 'xlm-roberta') only")
        kind = data.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise ValueError(f"{where}: position_embedding_type {kind!r} is not supported (only 'absolute')")
        fields = {f.name: f.default for f in dataclasses.fields(cls)}
        missing = [n for n in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                               "intermediate_size") if n not in data]
        if missing:
            raise ValueError(f"{where}: missing field(s) {missing}")
        ours = set(fields) - {"model_type", "position_padding_idx", "relative_attention_num_buckets", "hf_fields"}
        values = {n: data.get(n, d) for n, d in fields.items() if n in ours}
        if values["pad_token_id"] is None:
            values["pad_token_id"] = 0 if model_type == "bert" else 1
        values["model_type"] = model_type
        if model_type != "bert":  # RoBERTa's embeddings count positions past the padding id
            values["position_padding_idx"] = values["pad_token_id"]
        values["hf_fields"] = json.dumps({k: v for k, v in data.items() if k not in ours and k != "model_type"},
                                         sort_keys=True)
        try:
            return cls(**values)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from err

    def to_hf(self) -> dict:
        """A ``config.json`` dict that ``transformers``' ``BertModel`` (``RobertaModel``,
        ``XLMRobertaModel``) reads: the checkpoint's other fields, then the model's."""
        if self.model_type not in ("bert", "roberta", "xlm-roberta"):
            raise ValueError(f"to_hf writes BERT and RoBERTa configs, not {self.model_type!r}")
        ours = {k: v for k, v in dataclasses.asdict(self).items()
                if k not in ("position_padding_idx", "relative_attention_num_buckets", "hf_fields")}
        base = {"bert": "BertModel", "roberta": "RobertaModel", "xlm-roberta": "XLMRobertaModel"}[self.model_type]
        return {"attention_probs_dropout_prob": 0.1, "hidden_dropout_prob": 0.1, "initializer_range": 0.02,
                **self.other_fields(), "architectures": [base], "position_embedding_type": "absolute", **ours}

    def other_fields(self) -> dict:
        """The checkpoint's ``config.json`` fields the model does not use (:attr:`hf_fields`)."""
        return json.loads(self.hf_fields) if self.hf_fields else {}

    @classmethod
    def tiny(cls, **overrides) -> "BertConfig":
        """A small BERT for tests: vocabulary 64, width 16, 2 layers of 2 heads, MLP 32."""
        base = dict(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=32)
        return cls(**{**base, **overrides})


def _layer_norm(dim: int, eps: float, rngs: nnx.Rngs) -> nnx.LayerNorm:
    return nnx.LayerNorm(dim, epsilon=eps, param_dtype=PARAM_DTYPE, rngs=rngs)


class BertEmbeddings(nnx.Module):
    """``LayerNorm(word[ids] + position[p] + token_type[type_ids])``: ``(B, T) -> (B, T, d)``.

    ``p`` is ``t`` or, with :attr:`BertConfig.position_padding_idx`, counted past the padding id;
    without token types (``type_vocab_size`` 0) that term is absent.
    """

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        d = config.hidden_size
        self.padding_idx = config.position_padding_idx
        self.word = nnx.Embed(config.vocab_size, d, param_dtype=PARAM_DTYPE, rngs=rngs)
        self.position = nnx.Embed(config.max_position_embeddings, d, param_dtype=PARAM_DTYPE, rngs=rngs)
        self.token_type = (nnx.Embed(config.type_vocab_size, d, param_dtype=PARAM_DTYPE, rngs=rngs)
                           if config.type_vocab_size else nnx.data(None))
        self.norm = _layer_norm(d, config.layer_norm_eps, rngs)

    def positions(self, ids: jax.Array) -> jax.Array:
        """Position ids ``(B, T)`` (``(1, T)`` without a padding offset)."""
        if self.padding_idx is None:
            return jnp.arange(ids.shape[-1])[None, :]
        real = (ids != self.padding_idx).astype(jnp.int32)
        return jnp.cumsum(real, axis=1) * real + self.padding_idx

    def __call__(self, ids: jax.Array, token_type_ids: jax.Array) -> jax.Array:
        x = self.word(ids) + self.position(self.positions(ids))
        if self.token_type is not None:
            x = x + self.token_type(token_type_ids)
        return self.norm(x)


class BertAttention(nnx.Module):
    """Multi-head self-attention with a key mask: ``(B, T, d), (B, T) -> (B, T, d)`` (before the
    residual and LayerNorm, which :class:`BertLayer` applies)."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        d = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = d // self.num_heads
        self.query = nnx.Linear(d, d, param_dtype=PARAM_DTYPE, rngs=rngs)
        self.key = nnx.Linear(d, d, param_dtype=PARAM_DTYPE, rngs=rngs)
        self.value = nnx.Linear(d, d, param_dtype=PARAM_DTYPE, rngs=rngs)
        self.output = nnx.Linear(d, d, param_dtype=PARAM_DTYPE, rngs=rngs)

    def __call__(self, x: jax.Array, mask: jax.Array, position_bias: jax.Array | None = None) -> jax.Array:
        b, t, d = x.shape

        def heads(y):  # (B, T, d) -> (B, heads, T, hd)
            return y.reshape(b, t, self.num_heads, self.head_dim).transpose(0, 2, 1, 3)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        logits = jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(self.head_dim)
        # Padded keys get no weight; (B, 1, 1, T) broadcasts at equal rank.
        bias = jnp.where(mask[:, None, None, :] > 0, 0.0, _MASK_VALUE).astype(logits.dtype)
        if position_bias is not None:  # (1, heads, T, T): MPNet's relative positions
            logits = logits + position_bias.astype(logits.dtype)
        weights = jax.nn.softmax(logits + bias, axis=-1)
        out = jnp.einsum("bhqk,bhkd->bqhd", weights, v).reshape(b, t, d)
        return self.output(out)


class BertLayer(nnx.Module):
    """Post-LN encoder layer: ``x = attention_norm(x + attention(x)); x = output_norm(x + mlp(x))``.

    ``layer.mlp`` is the only attribute compression touches (contract ``(..., d) -> (..., d)``).
    """

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        d = config.hidden_size
        self.attention = BertAttention(config, rngs=rngs)
        self.attention_norm = _layer_norm(d, config.layer_norm_eps, rngs)
        self.mlp = MLP(d, config.intermediate_size, activation=config.activation, rngs=rngs)
        self.output_norm = _layer_norm(d, config.layer_norm_eps, rngs)

    def __call__(self, x: jax.Array, mask: jax.Array, position_bias: jax.Array | None = None) -> jax.Array:
        x = self.attention_norm(x + self.attention(x, mask, position_bias))
        return self.output_norm(x + self.mlp(x))


class Bert(nnx.Module):
    """The BERT encoder: ``bert(ids, mask, token_type_ids=None) -> (B, T, d)`` hidden states.

    ``bert.layers`` is an ``nnx.List`` of :class:`BertLayer`; ``bert.layers[i].mlp`` the MLPs.
    """

    kind = "bert"

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.embeddings = BertEmbeddings(config, rngs=rngs)
        self.layers = nnx.List([BertLayer(config, rngs=rngs) for _ in range(config.num_hidden_layers)])
        self.pooler_kernel = nnx.data(None)  # the checkpoint's pooler, if any (Unused variables)
        self.pooler_bias = nnx.data(None)
        buckets = config.relative_attention_num_buckets
        self.relative_attention_bias = (nnx.Embed(buckets, config.num_attention_heads, param_dtype=PARAM_DTYPE,
                                                  rngs=rngs) if buckets else nnx.data(None))

    def __call__(self, ids: jax.Array, mask: jax.Array | None = None,
                 token_type_ids: jax.Array | None = None) -> jax.Array:
        if ids.ndim != 2:
            raise ValueError(f"ids must have shape (B, T), got {ids.shape}")
        if ids.shape[1] > self.config.max_tokens:
            raise ValueError(f"ids: {ids.shape[1]} tokens exceed the {self.config.max_tokens} positions of "
                             f"max_position_embeddings ({self.config.max_position_embeddings})")
        mask = jnp.ones(ids.shape, jnp.int32) if mask is None else mask
        token_type_ids = jnp.zeros(ids.shape, jnp.int32) if token_type_ids is None else token_type_ids
        x = self.embeddings(ids, token_type_ids)
        position_bias = None
        if self.relative_attention_bias is not None:
            t = ids.shape[1]
            buckets = relative_position_bucket(np.arange(t)[None, :] - np.arange(t)[:, None])  # (T, T), static
            position_bias = self.relative_attention_bias(jnp.asarray(buckets)).transpose(2, 0, 1)[None]
        for layer in self.layers:
            x = layer(x, mask, position_bias)
        return x


def relative_position_bucket(relative_position: np.ndarray, num_buckets: int = 32,
                             max_distance: int = 128) -> np.ndarray:
    """MPNet's (and T5's bidirectional) bucket of each ``relative_position`` (key − query), int64.

    Half the buckets are for keys before the query; within each half, distances below a quarter of
    the buckets get their own bucket and longer ones share logarithmically spaced buckets up to
    ``max_distance``. Computed in float32 in ``transformers``' order of operations, so the
    truncation at the bucket edges is the same.
    """
    n = -np.asarray(relative_position, np.int64)
    half = num_buckets // 2
    bucket = (n < 0).astype(np.int64) * half
    n = np.abs(n)
    max_exact = half // 2
    with np.errstate(divide="ignore"):
        scaled = (np.log(n.astype(np.float32) / np.float32(max_exact)) / np.float32(math.log(max_distance / max_exact))
                  * np.float32(half - max_exact))
    large = max_exact + np.where(n < max_exact, 0, scaled).astype(np.int64)
    return bucket + np.where(n < max_exact, n, np.minimum(large, half - 1))


def pool(hidden: jax.Array, mask: jax.Array, mode: str) -> jax.Array:
    """Sentence-transformers' pooling of ``hidden (B, T, d)`` over the tokens of ``mask (B, T)``.

    ``"mean"``: the mean of the unmasked tokens; ``"cls"``: the first token; ``"max"``: the
    elementwise max over unmasked tokens; ``"mean_sqrt_len"``: their sum over sqrt(count).
    """
    m = mask.astype(hidden.dtype)[:, :, None]
    count = jnp.maximum(jnp.sum(m, axis=1), 1e-9)  # (B, 1); an empty row pools to 0, not NaN
    if mode == "mean":
        return jnp.sum(hidden * m, axis=1) / count
    if mode == "mean_sqrt_len":
        return jnp.sum(hidden * m, axis=1) / jnp.sqrt(count)
    if mode == "cls":
        return hidden[:, 0]
    if mode == "max":
        return jnp.max(jnp.where(m > 0, hidden, jnp.asarray(-1e9, hidden.dtype)), axis=1)
    raise ValueError(f"pooling must be one of {POOLINGS}, got {mode!r}")


class _StaticByContent:
    """A static attribute (a tokenizer) that compares and hashes by its serialized content.

    A static attribute is part of the module's graphdef, the key of every compiled program of the
    model (``nnx.jit``, a jitted ``nnx.merge``). A ``tokenizers.Tokenizer`` compares by identity,
    so each loaded encoder would compile its own programs, and the cache would keep them and the
    tokenizer alive for the process; by content, two loads of one directory share them. Objects
    without ``to_str`` (None, anything else) compare by identity.
    """

    __slots__ = ("value", "_key")

    def __init__(self, value: Any):
        self.value = value
        to_str = getattr(value, "to_str", None)
        # Hashed once: the graphdef is hashed on every jitted call.
        self._key = (type(value), hashlib.sha256(to_str().encode()).hexdigest()) if callable(to_str) else id(value)

    def __eq__(self, other) -> bool:
        if not isinstance(other, _StaticByContent):
            return NotImplemented
        return self.value is other.value or (not isinstance(self._key, int) and self._key == other._key)

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        return f"StaticByContent({type(self.value).__name__})"


class Encoder(nnx.Module):
    """A sentence encoder: a :class:`Bert`, its tokenizer and the pooling pipeline.

    Args:
        bert: the encoder.
        tokenizer: a ``tokenizers.Tokenizer`` (or None: :meth:`encode` then refuses text).
        pooling: one of :data:`POOLINGS`.
        normalize: divide each embedding by its Euclidean norm (sentence-transformers' ``Normalize``).
        max_seq_length: texts are truncated to this many tokens (special tokens included).
        source: the directory it was read from (:func:`~jaxbsd.models.bert.params.from_pretrained`
            sets it), or None; :func:`~jaxbsd.models.bert.params.save_pretrained` copies the files
            it does not change from there.

    ``encoder(ids, mask, token_type_ids=None) -> (B, d)`` is the jittable forward pass;
    :meth:`encode` tokenizes, batches and returns ``np.ndarray (N, d)``.
    """

    def __init__(self, bert: Bert, tokenizer: Any = None, *, pooling: str = "mean", normalize: bool = False,
                 max_seq_length: int | None = None, source: str | None = None):
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        limit = bert.config.max_tokens
        max_seq_length = limit if max_seq_length is None else int(max_seq_length)
        if not 2 <= max_seq_length <= limit:
            raise ValueError(f"max_seq_length must lie in [2, {limit}] (the positions of max_position_embeddings), "
                             f"got {max_seq_length}")
        self.bert = bert
        self.pooling = pooling
        self.normalize = bool(normalize)
        self.max_seq_length = max_seq_length
        self._tokenizer = nnx.static(_StaticByContent(tokenizer))  # structure, not state: it is no pytree
        self.source = None if source is None else str(source)

    @property
    def tokenizer(self) -> Any:
        """The ``tokenizers.Tokenizer`` (or None)."""
        return self._tokenizer.value

    @tokenizer.setter
    def tokenizer(self, tokenizer: Any) -> None:
        self._tokenizer = nnx.static(_StaticByContent(tokenizer))

    def __call__(self, ids: jax.Array, mask: jax.Array | None = None,
                 token_type_ids: jax.Array | None = None) -> jax.Array:
        mask = jnp.ones(ids.shape, jnp.int32) if mask is None else mask
        return self.sentence_embedding(self.bert(ids, mask, token_type_ids), mask)

    def sentence_embedding(self, hidden: jax.Array, mask: jax.Array) -> jax.Array:
        """The pooling pipeline alone: the last layer's tokens ``hidden (B, T, d)`` and ``mask (B, T)``
        to the embeddings ``(B, d)`` (pooled, then normalized if :attr:`normalize`)."""
        emb = pool(hidden, mask, self.pooling)
        if self.normalize:  # torch.nn.functional.normalize: x / max(‖x‖, 1e-12)
            emb = emb / jnp.maximum(jnp.linalg.norm(emb, axis=-1, keepdims=True), 1e-12)
        return emb

    def tokenize(self, texts, *, pad_to: int = 8) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(ids, mask, token_type_ids)``, each ``(N, T)`` int32, padded to the longest text (rounded
        up to a multiple of ``pad_to``, so few shapes compile), truncated to ``max_seq_length``."""
        if self.tokenizer is None:
            raise ValueError("this Encoder has no tokenizer; call it on token ids instead")
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise ValueError("texts must be a list of strings")
        tok = self.tokenizer
        tok.no_padding()
        tok.enable_truncation(self.max_seq_length)
        encodings = tok.encode_batch(list(texts))
        longest = max((len(e.ids) for e in encodings), default=1)
        t = min(-(-longest // pad_to) * pad_to, self.max_seq_length)
        pad = self.bert.config.pad_token_id
        ids = np.full((len(encodings), t), pad, np.int32)
        mask = np.zeros((len(encodings), t), np.int32)
        types = np.zeros((len(encodings), t), np.int32)
        for i, e in enumerate(encodings):
            n = len(e.ids)
            ids[i, :n], mask[i, :n], types[i, :n] = e.ids, e.attention_mask, e.type_ids
        return ids, mask, types

    def encode(self, texts, batch_size: int = 32) -> np.ndarray:
        """Embeddings of ``texts`` (a list of N strings): ``np.ndarray (N, d)`` float32, in order.

        Texts are sorted by length and batched ``batch_size`` at a time (as sentence-transformers does),
        so each batch pads little.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        texts = list(texts) if not isinstance(texts, str) else texts
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise ValueError("texts must be a list of strings")
        d = self.bert.config.hidden_size
        out = np.zeros((len(texts), d), np.float32)
        order = np.argsort([-len(t) for t in texts], kind="stable")
        for start in range(0, len(texts), batch_size):
            rows = order[start:start + batch_size]
            ids, mask, types = self.tokenize([texts[i] for i in rows])
            if len(rows) < batch_size and len(texts) > batch_size:  # one batch shape per length
                extra = batch_size - len(rows)
                ids, mask, types = (np.concatenate([a, np.zeros((extra, a.shape[1]), a.dtype)]) for a in (ids, mask, types))
            emb = _forward(self, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
            out[rows] = np.asarray(emb)[:len(rows)]
        return out


@nnx.jit
def _forward(encoder: Encoder, ids, mask, types):
    return encoder(ids, mask, types)


def calibration_windows(encoder: Encoder, texts, seq_len: int, count: int, *, seed: int = 0) -> np.ndarray:
    """``(count, seq_len)`` int32 token ids without padding for calibration: the texts' tokens (no
    special tokens) concatenated in order, cut into windows of ``seq_len − 2`` and framed by
    ``[CLS]`` … ``[SEP]`` (``<s>`` … ``</s>``); ``count`` windows drawn at random (``seed``) without replacement.
    Every calibration token is then a real one (a padded batch would feed the MLPs padding too)."""
    if encoder.tokenizer is None:
        raise ValueError("calibration_windows: the encoder has no tokenizer")
    if not 3 <= seq_len <= encoder.max_seq_length:
        raise ValueError(f"seq_len must lie in [3, {encoder.max_seq_length}], got {seq_len!r}")
    tok = encoder.tokenizer
    tok.no_padding()
    tok.no_truncation()
    stream = np.concatenate([np.asarray(e.ids, np.int32) for e in tok.encode_batch(list(texts),
                                                                                 add_special_tokens=False)]
                            + [np.zeros(0, np.int32)])
    body = seq_len - 2
    n = stream.size // body
    if n < count:
        raise ValueError(f"texts: {stream.size} tokens give {n} windows of {seq_len}; {count} requested")
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    if cls_id is None or sep_id is None:  # RoBERTa's, XLM-R's and MPNet's names
        cls_id, sep_id = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    if cls_id is None or sep_id is None:
        raise ValueError("calibration_windows: the tokenizer has no [CLS] and [SEP] (or <s> and </s>) tokens")
    pick = np.sort(np.random.default_rng(seed).choice(n, count, replace=False))
    windows = stream[: n * body].reshape(n, body)[pick]
    edge = np.ones((count, 1), np.int32)
    return np.concatenate([edge * cls_id, windows, edge * sep_id], axis=1)
