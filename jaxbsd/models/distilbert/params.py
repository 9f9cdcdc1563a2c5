"""Hugging Face DistilBERT checkpoints (``model_type`` ``"distilbert"``) as BERT-shaped encoders.

DistilBERT (Sanh et al., 2019) is a post-LN BERT without token types and without a pooler, whose
LayerNorms have epsilon 1e-12 whatever the config says; its ``config.json`` names the sizes
``dim``, ``n_layers``, ``n_heads``, ``hidden_dim`` and the MLP's ``activation``. A checkpoint with
``sinusoidal_pos_embds`` stores its fixed position table like a learned one, so it loads the same.
The modules are :mod:`jaxbsd.models.bert.modeling`'s (``bert.layers[i].mlp`` is jaxbsd's
:class:`~jaxbsd.models.layers.MLP`), loading and saving :mod:`jaxbsd.models.bert.params`'.
"""

from __future__ import annotations

import os

from jaxbsd.models.bert.modeling import BertConfig, Encoder
from jaxbsd.models.bert.params import config_from_fields, encoder_names, load_encoder
from jaxbsd.models.hub import open_checkpoint
from jaxbsd.models.layers import PARAM_DTYPE

__all__ = ["config_from_hf", "hf_config", "hf_tensors", "from_pretrained"]

# BertConfig field -> DistilBERT's config.json name.
_FIELDS = {"vocab_size": "vocab_size", "hidden_size": "dim", "num_hidden_layers": "n_layers",
           "num_attention_heads": "n_heads", "intermediate_size": "hidden_dim", "hidden_act": "activation",
           "max_position_embeddings": "max_position_embeddings"}


def config_from_hf(data: dict, where: str = "config.json") -> BertConfig:
    """The :class:`BertConfig` of a DistilBERT ``config.json`` dict; ``ValueError`` naming ``where``."""
    if not isinstance(data, dict) or data.get("model_type") != "distilbert":
        raise ValueError(f"{where}: expected a DistilBERT config (model_type 'distilbert')")
    pad = data.get("pad_token_id")
    return config_from_fields(data, where, _FIELDS, model_type="distilbert", type_vocab_size=0, layer_norm_eps=1e-12,
                              pad_token_id=0 if pad is None else pad)


def hf_config(config: BertConfig) -> dict:
    """The DistilBERT ``config.json`` dict of ``config`` (the checkpoint's other fields kept)."""
    return {"dropout": 0.1, "attention_dropout": 0.1, "initializer_range": 0.02, **config.other_fields(),
            "architectures": ["DistilBertModel"], "model_type": "distilbert", "pad_token_id": config.pad_token_id,
            **{theirs: getattr(config, ours) for ours, theirs in _FIELDS.items()}}


def hf_tensors(config: BertConfig) -> dict[tuple, tuple[str, bool]]:
    """``{our state path: (DistilBERT tensor name, transposed)}`` for every parameter."""
    return encoder_names(config, "transformer.layer.{i}",
                         ("attention.q_lin", "attention.k_lin", "attention.v_lin", "attention.out_lin", "ffn.lin1",
                          "ffn.lin2"), ("sa_layer_norm", "output_layer_norm"))


def from_pretrained(path: str | os.PathLike, *, dtype=PARAM_DTYPE) -> Encoder:
    """Load a Hugging Face DistilBERT directory as an :class:`~jaxbsd.models.bert.Encoder`.

    The files are those :func:`jaxbsd.models.bert.from_pretrained` reads (a ``distilbert.`` tensor
    prefix is accepted; task heads are not read), its parameters of ``dtype``. Raises ``ValueError``
    naming the path as it does.
    """
    root, data = open_checkpoint(path)
    config = config_from_hf(data, str(root / "config.json"))
    return load_encoder(root, config, ("", "distilbert."), dtype)
