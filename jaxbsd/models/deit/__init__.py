"""The DeiT family (ViT plus a distillation token): :mod:`jaxbsd.models.deit.modeling`."""

from jaxbsd.models.deit.modeling import DeiT, DeiTConfig

__all__ = ["DeiTConfig", "DeiT"]

# Checkpoints record a model by ``module.qualname``: the family's public path, as before the split.
DeiT.__module__ = __name__
