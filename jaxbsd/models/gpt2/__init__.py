"""GPT-2 read from (and written back to) a Hugging Face directory.

:mod:`jaxbsd.models.gpt2.modeling` holds the config and the modules (the causal LM :class:`GPT2`, whose
``blocks[i].mlp`` are jaxbsd's ``MLP``); :mod:`jaxbsd.models.gpt2.params` the Hugging Face tensor names
and :func:`~jaxbsd.models.gpt2.params.from_pretrained` / :func:`~jaxbsd.models.gpt2.params.save_pretrained`.
"""

from jaxbsd.models.gpt2.modeling import GPT2, GPT2Attention, GPT2Block, GPT2Config
from jaxbsd.models.gpt2.params import from_pretrained, hf_tensors, save_pretrained

__all__ = ["GPT2Config", "GPT2", "GPT2Block", "GPT2Attention", "from_pretrained", "save_pretrained",
           "hf_tensors", "MODEL_CLASSES"]

#: What :func:`jaxbsd.models.hub.save_pretrained` hands to this family's :func:`save_pretrained`.
MODEL_CLASSES = (GPT2,)

# Checkpoints record a model by ``module.qualname``: the family's public path.
GPT2.__module__ = __name__
