"""The Vision Transformer family: :mod:`jaxbsd.models.vit.modeling` (config and modules)."""

from jaxbsd.models.vit.modeling import PAPER_PATCH_SIZES, ViT, ViTConfig, drop_path_rates

__all__ = ["ViTConfig", "ViT", "PAPER_PATCH_SIZES", "drop_path_rates"]

# Checkpoints record a model by ``module.qualname``: the family's public path, as before the split.
ViT.__module__ = __name__
