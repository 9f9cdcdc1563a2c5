"""Hugging Face MPNet checkpoints (``model_type`` ``"mpnet"``) as BERT-shaped encoders.

MPNet (Song et al., 2020) is a post-LN BERT without token types whose positions count past the
padding id 1 (as RoBERTa's; ``transformers`` fixes the id at 1 whatever ``pad_token_id`` says) and
whose every layer adds one learned bias per head and relative-position bucket to the attention
logits (``encoder.relative_attention_bias``, 32 buckets, distances up to 128:
:func:`~jaxbsd.models.bert.modeling.relative_position_bucket`). The modules are
:mod:`jaxbsd.models.bert.modeling`'s (``bert.layers[i].mlp`` is jaxbsd's
:class:`~jaxbsd.models.layers.MLP`), loading and saving :mod:`jaxbsd.models.bert.params`'.
"""

from __future__ import annotations

import os

from jaxbsd.models.bert.modeling import BertConfig, Encoder
from jaxbsd.models.bert.params import config_from_fields, encoder_names, load_encoder
from jaxbsd.models.hub import open_checkpoint
from jaxbsd.models.layers import PARAM_DTYPE

__all__ = ["config_from_hf", "hf_config", "hf_tensors", "from_pretrained"]

_FIELDS = {name: name for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                   "intermediate_size")}
_OPTIONAL = {"hidden_act": "gelu", "max_position_embeddings": 512, "layer_norm_eps": 1e-12,
             "relative_attention_num_buckets": 32}
# transformers' MPNetEmbeddings.padding_idx
_PADDING_IDX = 1


def config_from_hf(data: dict, where: str = "config.json") -> BertConfig:
    """The :class:`BertConfig` of an MPNet ``config.json`` dict; ``ValueError`` naming ``where``."""
    if not isinstance(data, dict) or data.get("model_type") != "mpnet":
        raise ValueError(f"{where}: expected an MPNet config (model_type 'mpnet')")
    fields = {**_FIELDS, **{name: name for name in _OPTIONAL if name in data}}
    defaults = {name: value for name, value in _OPTIONAL.items() if name not in data}
    pad = data.get("pad_token_id")
    return config_from_fields(data, where, fields, **defaults, model_type="mpnet", type_vocab_size=0,
                              position_padding_idx=_PADDING_IDX, pad_token_id=_PADDING_IDX if pad is None else pad)


def hf_config(config: BertConfig) -> dict:
    """The MPNet ``config.json`` dict of ``config`` (the checkpoint's other fields kept)."""
    names = {**_FIELDS, **{name: name for name in _OPTIONAL}}
    return {"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "initializer_range": 0.02,
            **config.other_fields(), "architectures": ["MPNetModel"], "model_type": "mpnet",
            "pad_token_id": config.pad_token_id, **{theirs: getattr(config, ours) for ours, theirs in names.items()}}


def hf_tensors(config: BertConfig) -> dict[tuple, tuple[str, bool]]:
    """``{our state path: (MPNet tensor name, transposed)}`` for every parameter."""
    return encoder_names(config, "encoder.layer.{i}",
                         ("attention.attn.q", "attention.attn.k", "attention.attn.v", "attention.attn.o",
                          "intermediate.dense", "output.dense"), ("attention.LayerNorm", "output.LayerNorm"),
                         {("relative_attention_bias", "embedding"): "encoder.relative_attention_bias.weight"})


def from_pretrained(path: str | os.PathLike, *, dtype=PARAM_DTYPE) -> Encoder:
    """Load a Hugging Face MPNet directory as an :class:`~jaxbsd.models.bert.Encoder`.

    The files are those :func:`jaxbsd.models.bert.from_pretrained` reads (an ``mpnet.`` tensor
    prefix is accepted; task heads are not read, the pooler is kept), its parameters of ``dtype``.
    Raises ``ValueError`` naming the path as it does.
    """
    root, data = open_checkpoint(path)
    return load_encoder(root, config_from_hf(data, str(root / "config.json")), ("", "mpnet."), dtype)
