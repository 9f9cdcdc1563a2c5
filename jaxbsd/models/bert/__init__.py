"""BERT-family encoders read from (and written back to) a Hugging Face directory.

:mod:`jaxbsd.models.bert.modeling` holds the config, the modules and the sentence-embedding
pipeline (:class:`~jaxbsd.models.bert.modeling.Encoder`); :mod:`jaxbsd.models.bert.params` the
Hugging Face tensor names and :func:`~jaxbsd.models.bert.params.from_pretrained` /
:func:`~jaxbsd.models.bert.params.save_pretrained`.
"""

from jaxbsd.models.bert.modeling import (
    HF_ACTIVATIONS,
    POOLINGS,
    Bert,
    BertAttention,
    BertConfig,
    BertEmbeddings,
    BertLayer,
    Encoder,
    Unused,
    calibration_windows,
    pool,
)
from jaxbsd.models.bert.params import from_pretrained, hf_tensors, save_pretrained

__all__ = ["BertConfig", "Bert", "BertLayer", "BertAttention", "BertEmbeddings", "Encoder", "Unused",
           "POOLINGS", "HF_ACTIVATIONS", "pool", "from_pretrained", "save_pretrained", "hf_tensors",
           "calibration_windows", "MODEL_CLASSES"]

#: What :func:`jaxbsd.models.hub.save_pretrained` hands to this family's :func:`save_pretrained`.
MODEL_CLASSES = (Encoder,)

# Checkpoints record a model by ``module.qualname``: the family's public path, as before the split.
Bert.__module__ = Encoder.__module__ = __name__
