"""BERT-family encoders read from (and written back to) a Hugging Face directory.

Layout (post-LN BERT, Devlin et al. 2019; the ``BertModel`` of ``transformers``)::

    ids (B, T) ─ embeddings ─▶ depth × BertLayer ─▶ hidden (B, T, d) ─ pooling ─▶ (B, d) [─ normalize]

    embeddings:  LayerNorm(word[ids] + position[0..T-1] + token_type[type_ids])
    BertLayer:   x = LayerNorm(x + attention(x, mask));  x = LayerNorm(x + mlp(x))
    mlp:         jaxbsd's own MLP, fc2(h(fc1(x))), so the engine knows its spec without looking

**Hugging Face layout.** :func:`from_pretrained` reads ``config.json`` (``model_type`` ``"bert"``,
absolute positions), ``model.safetensors`` through ``safetensors``' numpy API (a ``bert.`` prefix,
as ``BertFor…`` checkpoints have, is accepted), ``tokenizer.json`` through ``tokenizers``, and the
sentence-transformers files where present: ``modules.json`` (a ``Normalize`` module),
``1_Pooling/config.json`` (mean, CLS, max or mean-sqrt-len pooling) and
``sentence_bert_config.json`` (``max_seq_length``). Without them the encoder mean-pools, as
sentence-transformers does for a plain BERT. :func:`save_pretrained` writes the same layout back
where the model is still a standard BERT: every MLP untouched, or all pruned to one width (a BERT
with a smaller ``intermediate_size``).

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
import json
import math
import os
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxbsd.solver import metrics
from jaxbsd.models.layers import MLP, PARAM_DTYPE, check_config_ints

__all__ = ["BertConfig", "Bert", "BertLayer", "BertAttention", "BertEmbeddings", "Encoder", "Unused",
           "POOLINGS", "HF_ACTIVATIONS", "from_pretrained", "save_pretrained", "hf_tensors", "calibration_windows",
           "embed_eval_set", "fidelity"]

#: ``hidden_act`` of a Hugging Face config -> the name in :data:`~jaxbsd.models.layers.ACTIVATIONS`.
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                  "gelu_fast": "gelu_tanh", "relu": "relu"}
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

    def __post_init__(self):
        check_config_ints(self, "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                          "intermediate_size", "max_position_embeddings", "type_vocab_size")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must divide hidden_size "
                             f"({self.hidden_size})")
        if self.hidden_act not in HF_ACTIVATIONS:
            raise ValueError(f"hidden_act must be one of {sorted(HF_ACTIVATIONS)}, got {self.hidden_act!r}")
        eps = self.layer_norm_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
            raise ValueError(f"layer_norm_eps must be a positive finite number, got {eps!r}")

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
        if data.get("model_type") != "bert":
            raise ValueError(f"{where}: model_type is {data.get('model_type')!r}; jaxbsd.models.bert reads "
                             "BERT checkpoints (model_type 'bert') only")
        kind = data.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise ValueError(f"{where}: position_embedding_type {kind!r} is not supported (only 'absolute')")
        fields = {f.name: f.default for f in dataclasses.fields(cls)}
        missing = [n for n in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                               "intermediate_size") if n not in data]
        if missing:
            raise ValueError(f"{where}: missing field(s) {missing}")
        values = {n: data.get(n, d) for n, d in fields.items()}
        if values["pad_token_id"] is None:
            values["pad_token_id"] = 0
        try:
            return cls(**values)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from err

    def to_hf(self) -> dict:
        """A ``config.json`` dict that ``transformers.BertModel`` reads."""
        return {"architectures": ["BertModel"], "model_type": "bert", "position_embedding_type": "absolute",
                "attention_probs_dropout_prob": 0.1, "hidden_dropout_prob": 0.1, "initializer_range": 0.02,
                **dataclasses.asdict(self)}

    @classmethod
    def tiny(cls, **overrides) -> "BertConfig":
        """A small BERT for tests: vocabulary 64, width 16, 2 layers of 2 heads, MLP 32."""
        base = dict(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=32)
        return cls(**{**base, **overrides})


def _layer_norm(dim: int, eps: float, rngs: nnx.Rngs) -> nnx.LayerNorm:
    return nnx.LayerNorm(dim, epsilon=eps, param_dtype=PARAM_DTYPE, rngs=rngs)


class BertEmbeddings(nnx.Module):
    """``LayerNorm(word[ids] + position[t] + token_type[type_ids])``: ``(B, T) -> (B, T, d)``."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        d = config.hidden_size
        self.word = nnx.Embed(config.vocab_size, d, param_dtype=PARAM_DTYPE, rngs=rngs)
        self.position = nnx.Embed(config.max_position_embeddings, d, param_dtype=PARAM_DTYPE, rngs=rngs)
        self.token_type = nnx.Embed(config.type_vocab_size, d, param_dtype=PARAM_DTYPE, rngs=rngs)
        self.norm = _layer_norm(d, config.layer_norm_eps, rngs)

    def __call__(self, ids: jax.Array, token_type_ids: jax.Array) -> jax.Array:
        positions = jnp.arange(ids.shape[-1])[None, :]
        return self.norm(self.word(ids) + self.position(positions) + self.token_type(token_type_ids))


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

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        b, t, d = x.shape

        def heads(y):  # (B, T, d) -> (B, heads, T, hd)
            return y.reshape(b, t, self.num_heads, self.head_dim).transpose(0, 2, 1, 3)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        logits = jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(self.head_dim)
        # Padded keys get no weight; (B, 1, 1, T) broadcasts at equal rank.
        bias = jnp.where(mask[:, None, None, :] > 0, 0.0, _MASK_VALUE).astype(logits.dtype)
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

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        x = self.attention_norm(x + self.attention(x, mask))
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

    def __call__(self, ids: jax.Array, mask: jax.Array | None = None,
                 token_type_ids: jax.Array | None = None) -> jax.Array:
        if ids.ndim != 2:
            raise ValueError(f"ids must have shape (B, T), got {ids.shape}")
        if ids.shape[1] > self.config.max_position_embeddings:
            raise ValueError(f"ids: {ids.shape[1]} tokens exceed max_position_embeddings "
                             f"({self.config.max_position_embeddings})")
        mask = jnp.ones(ids.shape, jnp.int32) if mask is None else mask
        token_type_ids = jnp.zeros(ids.shape, jnp.int32) if token_type_ids is None else token_type_ids
        x = self.embeddings(ids, token_type_ids)
        for layer in self.layers:
            x = layer(x, mask)
        return x


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


class Encoder(nnx.Module):
    """A sentence encoder: a :class:`Bert`, its tokenizer and the pooling pipeline.

    Args:
        bert: the encoder.
        tokenizer: a ``tokenizers.Tokenizer`` (or None: :meth:`encode` then refuses text).
        pooling: one of :data:`POOLINGS`.
        normalize: divide each embedding by its Euclidean norm (sentence-transformers' ``Normalize``).
        max_seq_length: texts are truncated to this many tokens (special tokens included).

    ``encoder(ids, mask, token_type_ids=None) -> (B, d)`` is the jittable forward pass;
    :meth:`encode` tokenizes, batches and returns ``np.ndarray (N, d)``.
    """

    def __init__(self, bert: Bert, tokenizer: Any = None, *, pooling: str = "mean", normalize: bool = False,
                 max_seq_length: int | None = None):
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        limit = bert.config.max_position_embeddings
        max_seq_length = limit if max_seq_length is None else int(max_seq_length)
        if not 2 <= max_seq_length <= limit:
            raise ValueError(f"max_seq_length must lie in [2, {limit}] (max_position_embeddings), "
                             f"got {max_seq_length}")
        self.bert = bert
        self.pooling = pooling
        self.normalize = bool(normalize)
        self.max_seq_length = max_seq_length
        self.tokenizer = nnx.static(tokenizer)  # structure, not state: it is no pytree

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
    ``[CLS]`` … ``[SEP]``; ``count`` windows drawn at random (``seed``) without replacement.
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
    if cls_id is None or sep_id is None:
        raise ValueError("calibration_windows: the tokenizer has no [CLS] or [SEP] token")
    pick = np.sort(np.random.default_rng(seed).choice(n, count, replace=False))
    windows = stream[: n * body].reshape(n, body)[pick]
    edge = np.ones((count, 1), np.int32)
    return np.concatenate([edge * cls_id, windows, edge * sep_id], axis=1)


# ----------------------------------------------------------------------------- fidelity


def embed_eval_set(encoder: Encoder, passages, pairs, *, batch_size: int = 64) -> dict[str, np.ndarray]:
    """The embeddings a fidelity evaluation needs: ``{"passages": (N, d), "titles": (Q, d),
    "sections": (Q, d)}`` for ``passages`` (N texts) and ``pairs`` (Q ``(title, section text)``)."""
    pairs = list(pairs)
    return {"passages": encoder.encode(list(passages), batch_size=batch_size),
            "titles": encoder.encode([t for t, _ in pairs], batch_size=batch_size),
            "sections": encoder.encode([d for _, d in pairs], batch_size=batch_size)}


def fidelity(reference: dict[str, np.ndarray], compressed: dict[str, np.ndarray], *, k: int = 10) -> dict[str, float]:
    """Label-free fidelity of a compressed encoder against the original, from :func:`embed_eval_set`
    of both on the same texts:

    * ``mean_cosine``: mean cosine between compressed and original embeddings of the passages;
    * ``neighbour_overlap``: mean share of each passage's ``k`` nearest passages both agree on;
    * ``recall@1``, ``recall@10``: title → section retrieval with the compressed encoder (queries and
      documents both embedded by it), and ``reference_recall@1``/``@10`` with the original.
    """
    out = {"mean_cosine": float(metrics.mean_cosine(reference["passages"], compressed["passages"])),
           "neighbour_overlap": float(metrics.neighbour_overlap(reference["passages"], compressed["passages"], k=k))}
    for prefix, emb in (("", compressed), ("reference_", reference)):
        for cut, value in metrics.retrieval_recall(emb["titles"], emb["sections"], ks=(1, 10)).items():
            out[f"{prefix}recall@{cut}"] = value
    return out


# ----------------------------------------------------------------------------- Hugging Face names


def hf_tensors(config: BertConfig) -> dict[tuple, tuple[str, bool]]:
    """``{our state path: (Hugging Face tensor name, transposed)}`` for every parameter of
    :class:`Bert` (Flax kernels are ``(in, out)``, PyTorch weights ``(out, in)``)."""
    names = {
        ("embeddings", "word", "embedding"): ("embeddings.word_embeddings.weight", False),
        ("embeddings", "position", "embedding"): ("embeddings.position_embeddings.weight", False),
        ("embeddings", "token_type", "embedding"): ("embeddings.token_type_embeddings.weight", False),
        ("embeddings", "norm", "scale"): ("embeddings.LayerNorm.weight", False),
        ("embeddings", "norm", "bias"): ("embeddings.LayerNorm.bias", False),
    }
    for i in range(config.num_hidden_layers):
        hf = f"encoder.layer.{i}"
        ours = {
            ("attention", "query"): f"{hf}.attention.self.query",
            ("attention", "key"): f"{hf}.attention.self.key",
            ("attention", "value"): f"{hf}.attention.self.value",
            ("attention", "output"): f"{hf}.attention.output.dense",
            ("mlp", "fc1"): f"{hf}.intermediate.dense",
            ("mlp", "fc2"): f"{hf}.output.dense",
        }
        for path, name in ours.items():
            names[("layers", i, *path, "kernel")] = (f"{name}.weight", True)
            names[("layers", i, *path, "bias")] = (f"{name}.bias", False)
        for path, name in {("attention_norm",): f"{hf}.attention.output.LayerNorm",
                           ("output_norm",): f"{hf}.output.LayerNorm"}.items():
            names[("layers", i, *path, "scale")] = (f"{name}.weight", False)
            names[("layers", i, *path, "bias")] = (f"{name}.bias", False)
    return names


# Older checkpoints name LayerNorm parameters gamma/beta.
_ALIASES = {".weight": ".gamma", ".bias": ".beta"}


def _lookup(tensors: dict, name: str):
    for prefix in ("", "bert."):
        if prefix + name in tensors:
            return tensors[prefix + name]
        if "LayerNorm" in name:
            for new, old in _ALIASES.items():
                if name.endswith(new) and prefix + name[: -len(new)] + old in tensors:
                    return tensors[prefix + name[: -len(new)] + old]
    return None


def _read_json(path: pathlib.Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: cannot read {what} ({err})") from err


def _sentence_transformers(root: pathlib.Path, hidden: int) -> tuple[str, bool, int | None]:
    """``(pooling, normalize, max_seq_length)`` from the sentence-transformers files (defaults: mean,
    no normalisation, no limit)."""
    pooling, normalize, max_len = "mean", False, None
    modules_file = root / "modules.json"
    pooling_dir = "1_Pooling"
    if modules_file.is_file():
        modules = _read_json(modules_file, "the sentence-transformers modules")
        if not isinstance(modules, list):
            raise ValueError(f"{modules_file}: expected a JSON list of modules")
        kinds = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules if isinstance(m, dict)}
        normalize = "Normalize" in kinds
        if "Pooling" in kinds:
            pooling_dir = kinds["Pooling"].get("path") or pooling_dir
        unknown = sorted(set(kinds) - {"Transformer", "Pooling", "Normalize"})
        if unknown:
            raise ValueError(f"{modules_file}: module(s) {unknown} are not supported (Transformer, Pooling, "
                             "Normalize are)")
    pool_file = root / pooling_dir / "config.json"
    if pool_file.is_file():
        cfg = _read_json(pool_file, "the pooling config")
        modes = [m for m in POOLINGS if cfg.get(f"pooling_mode_{m}_token" if m == "cls" else f"pooling_mode_{m}_tokens")]
        others = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v and
                  k not in ("pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens",
                            "pooling_mode_mean_sqrt_len_tokens")]
        if len(modes) != 1 or others:
            raise ValueError(f"{pool_file}: exactly one of the pooling modes {POOLINGS} must be on, "
                             f"got {modes + others}")
        pooling = modes[0]
        dim = cfg.get("word_embedding_dimension", hidden)
        if dim != hidden:
            raise ValueError(f"{pool_file}: word_embedding_dimension {dim} differs from hidden_size {hidden}")
    st_file = root / "sentence_bert_config.json"
    if st_file.is_file():
        max_len = _read_json(st_file, "the sentence-transformers config").get("max_seq_length")
    return pooling, normalize, max_len


def from_pretrained(path: str | os.PathLike) -> Encoder:
    """Load a Hugging Face BERT directory as an :class:`Encoder` (see the module docs).

    Args:
        path: a directory with ``config.json``, ``model.safetensors`` and ``tokenizer.json``
            (and optionally the sentence-transformers files).

    Raises:
        ValueError: naming the path and what is missing or wrong: no such directory, no
            ``config.json``, a ``model_type`` other than ``"bert"``, no ``model.safetensors`` (also
            when only ``pytorch_model.bin`` is there), no ``tokenizer.json``, a tensor missing or of
            the wrong shape. Nothing is returned half-loaded.
    """
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    root = pathlib.Path(path)
    if not root.is_dir():
        raise ValueError(f"{root}: not a directory; expected a Hugging Face model directory "
                         "(config.json, model.safetensors, tokenizer.json)")
    config_file = root / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{root}: no config.json; expected a Hugging Face model directory")
    config = BertConfig.from_hf(_read_json(config_file, "the model config"), str(config_file))
    weights = root / "model.safetensors"
    if not weights.is_file():
        hint = (" (only pytorch_model.bin is there: convert it to model.safetensors, e.g. with "
                "transformers' save_pretrained(safe_serialization=True); jaxbsd does not read pickles)"
                if (root / "pytorch_model.bin").is_file() else "")
        raise ValueError(f"{root}: no model.safetensors{hint}")
    tokenizer_file = root / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise ValueError(f"{root}: no tokenizer.json (the fast tokenizer file of the tokenizers library)")
    pooling, normalize, max_len = _sentence_transformers(root, config.hidden_size)
    try:
        tensors = load_file(str(weights))
    except Exception as err:  # noqa: BLE001 — safetensors raises its own error types on corrupt files
        raise ValueError(f"{weights}: cannot read ({type(err).__name__}: {err})") from err
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    except Exception as err:  # noqa: BLE001
        raise ValueError(f"{tokenizer_file}: cannot read ({type(err).__name__}: {err})") from err

    abstract = nnx.eval_shape(lambda: Bert(config, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    flat = dict(nnx.to_flat_state(state))
    names = hf_tensors(config)
    missing, wrong = [], []
    values = {}
    for key, var in flat.items():
        name, transposed = names[key]
        array = _lookup(tensors, name)
        if array is None:
            missing.append(name)
            continue
        array = np.asarray(array)
        expected = var.shape[::-1] if transposed else var.shape
        if array.shape != tuple(expected):
            wrong.append(f"{name} has shape {array.shape}, expected {tuple(expected)}")
            continue
        values[key] = jnp.asarray(array.T if transposed else array, PARAM_DTYPE)
    if missing or wrong:
        problems = ([f"missing tensor(s) {missing[:4]}{' …' if len(missing) > 4 else ''}"] if missing else []) + wrong[:3]
        raise ValueError(f"{weights}: {'; '.join(problems)} (config.json: hidden_size {config.hidden_size}, "
                         f"intermediate_size {config.intermediate_size}, {config.num_hidden_layers} layers)")
    for key, var in flat.items():
        var.set_value(values[key])
    bert = nnx.merge(graphdef, nnx.from_flat_state(flat))
    kernel, bias = _lookup(tensors, "pooler.dense.weight"), _lookup(tensors, "pooler.dense.bias")
    if kernel is not None and bias is not None:
        d = config.hidden_size
        if kernel.shape != (d, d) or bias.shape != (d,):
            raise ValueError(f"{weights}: pooler.dense has shapes {kernel.shape}, {bias.shape}, expected "
                             f"({d}, {d}), ({d},)")
        bert.pooler_kernel = Unused(jnp.asarray(np.asarray(kernel).T, PARAM_DTYPE))
        bert.pooler_bias = Unused(jnp.asarray(bias, PARAM_DTYPE))
    if max_len is not None:
        max_len = min(int(max_len), config.max_position_embeddings)
    return Encoder(bert, tokenizer, pooling=pooling, normalize=normalize, max_seq_length=max_len)


# ----------------------------------------------------------------------------- saving


def _standard_mlp(module, dim: int, activation: str) -> tuple[int | None, str]:
    """``(hidden width, "")`` if ``module`` is an ordinary MLP ``fc2(h(fc1(x)))`` with both biases and
    the config's activation (jaxbsd's :class:`MLP` or a pruned one), else ``(None, why not)``."""
    fc1, fc2 = getattr(module, "fc1", None), getattr(module, "fc2", None)
    name = type(module).__name__
    if not (isinstance(fc1, nnx.Linear) and isinstance(fc2, nnx.Linear)):
        return None, f"{name} is not a two-layer MLP (fc1, fc2)"
    if getattr(module, "activation", None) != activation:
        return None, f"{name} has activation {getattr(module, 'activation', None)!r}, the config {activation!r}"
    if fc1.bias is None or fc2.bias is None:
        return None, f"{name} lacks a bias"
    params = [p for p, _ in nnx.to_flat_state(nnx.state(module, nnx.Param))]
    if len(params) != 4:
        return None, f"{name} holds parameters besides fc1 and fc2"
    if fc1.in_features != dim or fc2.out_features != dim or fc1.out_features != fc2.in_features:
        return None, f"{name} maps {fc1.in_features} -> {fc1.out_features} -> {fc2.out_features}"
    return int(fc1.out_features), ""


def save_pretrained(encoder: Encoder, path: str | os.PathLike) -> pathlib.Path:
    """Write ``encoder`` as a Hugging Face BERT directory (with the sentence-transformers files).

    Possible where the encoder is still a standard BERT: every ``bert.layers[i].mlp`` an ordinary
    two-layer MLP with biases and the config's activation, all of one hidden width (untouched, or
    pruned uniformly: ``intermediate_size`` is then the pruned width). Writes ``config.json``,
    ``model.safetensors`` (Hugging Face tensor names, float32), ``tokenizer.json``, ``modules.json``,
    ``1_Pooling/config.json`` and ``sentence_bert_config.json``.

    Returns the directory. Raises ``ValueError`` saying why for any other MLP (a decoupling, a
    low-rank factorisation, uneven widths), pointing to :func:`jaxbsd.save_compressed`.
    """
    from safetensors.numpy import save_file

    if not isinstance(encoder, Encoder):
        raise ValueError(f"encoder must be a jaxbsd.models.bert.Encoder, got {type(encoder).__name__}")
    bert = encoder.bert
    config = bert.config
    widths, reasons = set(), []
    for i, layer in enumerate(bert.layers):
        width, why = _standard_mlp(layer.mlp, config.hidden_size, config.activation)
        if width is None:
            reasons.append(f"bert.layers.{i}.mlp: {why}")
        widths.add(width)
    if reasons or len(widths) != 1:
        why = reasons[0] if reasons else f"the MLPs have different hidden widths {sorted(widths)}"
        raise ValueError(f"save_pretrained: the encoder is no longer a standard BERT ({why}); a BERT checkpoint "
                         "holds uniform two-layer MLPs only. Save it with jaxbsd.save_compressed instead")
    width = widths.pop()
    if encoder.tokenizer is None:
        raise ValueError("save_pretrained: the encoder has no tokenizer to write")
    config = dataclasses.replace(config, intermediate_size=width)
    root = pathlib.Path(path)
    root.mkdir(parents=True, exist_ok=True)
    tensors = {}
    flat = dict(nnx.to_flat_state(nnx.state(bert, nnx.Param)))
    for key, (name, transposed) in hf_tensors(config).items():
        a = np.asarray(flat[key][...], np.float32)
        tensors[name] = np.ascontiguousarray(a.T if transposed else a)
    if bert.pooler_kernel is not None:
        tensors["pooler.dense.weight"] = np.ascontiguousarray(np.asarray(bert.pooler_kernel[...], np.float32).T)
        tensors["pooler.dense.bias"] = np.asarray(bert.pooler_bias[...], np.float32)
    save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt"})
    (root / "config.json").write_text(json.dumps(config.to_hf(), indent=2) + "\n")
    encoder.tokenizer.save(str(root / "tokenizer.json"))
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if encoder.normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (root / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    (root / "1_Pooling").mkdir(exist_ok=True)
    pooling = {"word_embedding_dimension": config.hidden_size,
               **{("pooling_mode_cls_token" if m == "cls" else f"pooling_mode_{m}_tokens"): m == encoder.pooling
                  for m in POOLINGS}}
    (root / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2) + "\n")
    (root / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": encoder.max_seq_length, "do_lower_case": False}, indent=2) + "\n")
    return root
