"""The DeiT family (ViT plus a distillation token): :mod:`jaxbsd.models.deit.modeling`."""

from jaxbsd.models.deit.modeling import DeiT, DeiTConfig

from jaxbsd.models.deit.params import from_pretrained, save_pretrained

__all__ = ["from_pretrained", "save_pretrained", "MODEL_CLASSES", "DeiTConfig", "DeiT"]

#: What :func:`jaxbsd.models.hub.save_pretrained` hands to this family's :func:`save_pretrained`.
MODEL_CLASSES = (DeiT,)

# Checkpoints record a model by ``module.qualname``: the family's public path, as before the split.
DeiT.__module__ = __name__
