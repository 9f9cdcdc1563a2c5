"""The DistilBERT encoders of Hugging Face directories (:mod:`jaxbsd.models.distilbert.params`): BERT-shaped,
run by :mod:`jaxbsd.models.bert.modeling`'s modules as an :class:`~jaxbsd.models.bert.Encoder`."""

from jaxbsd.models.bert.modeling import Encoder
from jaxbsd.models.bert.params import save_pretrained
from jaxbsd.models.distilbert.params import config_from_hf, from_pretrained, hf_config, hf_tensors

__all__ = ["from_pretrained", "save_pretrained", "config_from_hf", "hf_config", "hf_tensors", "MODEL_CLASSES"]

#: What :func:`jaxbsd.models.hub.save_pretrained` hands to this family's :func:`save_pretrained`.
MODEL_CLASSES = (Encoder,)
