"""Data-efficient image Transformer (Touvron et al., 2021): ViT plus a distillation token.

The model prepends two learned tokens, [CLS] and [DIST], and has two linear heads on
them.  Training with hard distillation (see :mod:`jaxbsd.training`) minimises

    ½ CE(head(cls), y) + ½ CE(head_dist(dist), argmax teacher(x)),

and inference averages the two heads' logits (that is what ``model(images)`` returns).
Without a teacher both heads are trained on the labels.

The paper's DeiT/USPS baseline has 668,650 parameters but no published architecture.
:meth:`DeiTConfig.usps` uses embedding 96, depth 6, 3 heads, MLP 384, patch 4 (16
patches of 4×4): **676,724 parameters**, 1.2 % above the paper's count.  Every MLP is
96 → 384 → 96 (74,208 parameters each).
"""

from __future__ import annotations

import dataclasses

import jax
from flax import nnx

from jaxbsd.models.layers import PARAM_DTYPE
from jaxbsd.models.vit.modeling import ViT, ViTConfig

__all__ = ["DeiTConfig", "DeiT"]


@dataclasses.dataclass(frozen=True)
class DeiTConfig(ViTConfig):
    """Hyper-parameters of :class:`DeiT` (the fields of :class:`ViTConfig`).

    The defaults are the USPS model (see the module docstring). ``distillation_head`` False: one
    head on the [CLS] token (``transformers``' ``DeiTForImageClassification``, whose embeddings
    still carry the distillation token).
    """

    image_size: int = 16
    channels: int = 1
    num_classes: int = 10
    patch_size: int = 4
    dim: int = 96
    depth: int = 6
    num_heads: int = 3
    mlp_dim: int = 384
    distillation_head: bool = True

    @classmethod
    def for_images(cls, image_size: int, channels: int, num_classes: int = 10, **overrides):
        """The DeiT-USPS width/depth with the paper's patch size for ``image_size``."""
        return super().for_images(image_size, channels, num_classes, **overrides)

    @classmethod
    def tiny(cls, **kw):
        base = dict(image_size=8, channels=1, num_classes=3, patch_size=4, dim=16, depth=2,
                    num_heads=2, mlp_dim=32)
        return cls(**{**base, **kw})


class DeiT(ViT):
    """DeiT classifier: ``model(images)`` → mean of the two heads' logits ``(B, classes)`` (the class
    head's alone without ``distillation_head``)."""

    kind = "deit"
    num_prefix_tokens = 2

    def __init__(self, config: DeiTConfig, *, rngs: nnx.Rngs):
        if not isinstance(config, DeiTConfig):
            raise ValueError(f"config must be a DeiTConfig, got {type(config).__name__}")
        super().__init__(config, rngs=rngs)
        self.head_dist = (nnx.Linear(config.dim, config.num_classes, param_dtype=PARAM_DTYPE, rngs=rngs)
                          if config.distillation_head else nnx.data(None))

    @property
    def distilled(self) -> bool:
        """Whether the model has the distillation head (the training loop then uses the two-head
        distillation loss)."""
        return self.head_dist is not None

    def heads(self, images: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Logits of the class head and of the distillation head, each ``(B, classes)``."""
        if self.head_dist is None:
            raise ValueError("heads: this DeiT has no distillation head (distillation_head=False)")
        x = self.features(images)
        return self.head(x[:, 0]), self.head_dist(x[:, 1])

    def __call__(self, images: jax.Array) -> jax.Array:
        if self.head_dist is None:
            return self.head(self.features(images)[:, 0])
        cls_logits, dist_logits = self.heads(images)
        return 0.5 * (cls_logits + dist_logits)
