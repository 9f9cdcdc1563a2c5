"""The Vision Transformer family: :mod:`jaxbsd.models.vit.modeling` (config and modules)."""

from jaxbsd.models.vit.modeling import PAPER_PATCH_SIZES, ViT, ViTConfig, drop_path_rates

from jaxbsd.models.vit.params import from_pretrained, save_pretrained

__all__ = ["from_pretrained", "save_pretrained", "MODEL_CLASSES", "ViTConfig", "ViT", "PAPER_PATCH_SIZES", "drop_path_rates"]

#: What :func:`jaxbsd.models.hub.save_pretrained` hands to this family's :func:`save_pretrained`.
MODEL_CLASSES = (ViT,)

# Checkpoints record a model by ``module.qualname``: the family's public path, as before the split.
ViT.__module__ = __name__
