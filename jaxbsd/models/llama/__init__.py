"""The Llama family of decoders (``llama``, ``mistral``, ``qwen2``, ``qwen3``) read from (and written
back to) a Hugging Face directory.

:mod:`jaxbsd.models.llama.modeling` holds the config and the modules (the causal LM :class:`Llama`,
whose ``blocks[i].mlp`` are jaxbsd's ``GatedMLP``); :mod:`jaxbsd.models.llama.params` the Hugging Face
tensor names and :func:`~jaxbsd.models.llama.params.from_pretrained` /
:func:`~jaxbsd.models.llama.params.save_pretrained`; :mod:`jaxbsd.models.llama.convert` jaxbsd's character
LM as a ``LlamaForCausalLM`` (:func:`~jaxbsd.models.llama.convert.save_lm_pretrained`).
"""

from jaxbsd.models.llama.convert import char_tokenizer, from_lm, save_lm_pretrained
from jaxbsd.models.llama.modeling import (
    ARCHITECTURES,
    MODEL_TYPES,
    ROPE_TYPES,
    Llama,
    LlamaAttention,
    LlamaBlock,
    LlamaConfig,
    apply_rope,
    rope_frequencies,
    rope_tables,
)
from jaxbsd.models.llama.params import from_pretrained, hf_tensors, save_pretrained

__all__ = ["LlamaConfig", "Llama", "LlamaBlock", "LlamaAttention", "MODEL_TYPES", "ARCHITECTURES", "ROPE_TYPES",
           "rope_frequencies", "rope_tables", "apply_rope", "from_pretrained", "save_pretrained", "hf_tensors", "from_lm", "save_lm_pretrained", "char_tokenizer", "MODEL_CLASSES"]

#: What :func:`jaxbsd.models.hub.save_pretrained` hands to this family's :func:`save_pretrained`.
MODEL_CLASSES = (Llama,)

# Checkpoints record a model by ``module.qualname``: the family's public path.
Llama.__module__ = __name__
