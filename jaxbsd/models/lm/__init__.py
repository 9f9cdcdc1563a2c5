"""The gated-MLP character language model: :mod:`jaxbsd.models.lm.modeling` (config and modules)."""

from jaxbsd.models.lm.modeling import LM, CausalSelfAttention, DecoderBlock, GatedMLP, LMConfig, rotary_embedding

__all__ = ["LMConfig", "LM", "GatedMLP", "CausalSelfAttention", "DecoderBlock", "rotary_embedding"]

# Checkpoints record a model by ``module.qualname``: the family's public path, as before the split.
LM.__module__ = __name__
