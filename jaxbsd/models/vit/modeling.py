"""Vision Transformer (Dosovitskiy et al., 2021) in Flax NNX, at the paper's small scale.

Paper settings (appendix, "ViT — MNIST, SVHN, CIFAR10"): embedding 64, 8 heads, MLP 256,
patch 7 for 28×28, 8 for 32×32, 4 for USPS 16×16.  For sklearn's 8×8 digits (not in the
paper) the presets use patch 4 (a 2×2 grid).  The paper does not state the depth; its ViT
compression tables have three steps (one per block), so the presets use **depth 3**.

Layout: linear patch embedding → [CLS] token + learned position embedding → ``depth``
pre-norm blocks (``model.blocks``, an ``nnx.List``; each holds its MLP as
``block.mlp``) → LayerNorm → linear head on the [CLS] token.
No dropout (the paper trains without it), so train and eval modes agree.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxbsd.models.layers import (
    ImagePresets,
    EMBED_INIT,
    PARAM_DTYPE,
    Attention,
    Block,
    PatchEmbed,
    check_vision_config,
)

__all__ = ["ViTConfig", "ViT", "PAPER_PATCH_SIZES"]

#: Patch size by image side, from the paper's data table (8 → 4 is our choice, see above).
PAPER_PATCH_SIZES = {28: 7, 32: 8, 16: 4, 8: 4}


@dataclasses.dataclass(frozen=True)
class ViTConfig(ImagePresets):
    """Hyper-parameters of :class:`ViT`.

    Attributes:
        image_size: side of the square input images.
        channels: input channels (NHWC last axis).
        num_classes: output classes.
        patch_size: side of the square patches; must divide ``image_size``.
        dim: embedding width m (every MLP is ``dim → mlp_dim → dim``).
        depth: number of transformer blocks.
        num_heads: attention heads; must divide ``dim``.
        mlp_dim: MLP hidden width.
        activation: MLP activation (a key of :data:`~jaxbsd.models.layers.ACTIVATIONS`).
        drop_path: maximal stochastic-depth rate (linearly increasing over blocks).
        layer_norm_eps: the LayerNorms' epsilon (Hugging Face checkpoints: their config's).
        hf_fields: the JSON text of a Hugging Face ``config.json`` the model was read from
            (written back by :func:`jaxbsd.models.vit.params.save_pretrained`); "" for jaxbsd's own.
    """

    image_size: int = 28
    channels: int = 1
    num_classes: int = 10
    patch_size: int = 7
    dim: int = 64
    depth: int = 3
    num_heads: int = 8
    mlp_dim: int = 256
    activation: str = "gelu"
    drop_path: float = 0.0
    layer_norm_eps: float = 1e-6
    hf_fields: str = ""

    def __post_init__(self):
        check_vision_config(self, "depth")
        eps = self.layer_norm_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
            raise ValueError(f"layer_norm_eps must be a number in (0, 1), got {eps!r}")

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @classmethod
    def for_images(cls, image_size: int, channels: int, num_classes: int = 10, **overrides):
        """The paper's architecture for images of this size (patch from the data table)."""
        if "patch_size" not in overrides:
            if image_size not in PAPER_PATCH_SIZES:
                raise ValueError(
                    f"image_size {image_size} has no paper patch size "
                    f"(known: {sorted(PAPER_PATCH_SIZES)}); pass patch_size"
                )
            overrides["patch_size"] = PAPER_PATCH_SIZES[image_size]
        return cls(image_size=image_size, channels=channels, num_classes=num_classes, **overrides)

    @classmethod
    def tiny(cls, **kw):
        """A few-thousand-parameter model on 8×8×1 images, for tests."""
        base = dict(image_size=8, channels=1, num_classes=3, patch_size=4, dim=16, depth=2,
                    num_heads=2, mlp_dim=32)
        return cls(**{**base, **kw})


def drop_path_rates(rate: float, depth: int) -> list[float]:
    """Stochastic-depth rates increasing linearly from 0 to ``rate`` over the blocks."""
    return [float(r) for r in np.linspace(0.0, rate, depth)]


class ViT(nnx.Module):
    """Vision Transformer classifier.

    ``model(images)``: ``(B, H, W, C)`` NHWC → logits ``(B, num_classes)``.
    """

    kind = "vit"
    #: extra learned tokens prepended to the patches ([CLS]); DeiT adds a distillation token.
    num_prefix_tokens = 1

    def __init__(self, config: ViTConfig, *, rngs: nnx.Rngs):
        if not isinstance(config, ViTConfig):
            raise ValueError(f"config must be a ViTConfig, got {type(config).__name__}")
        self.config = config
        c = config
        self.patch_embed = PatchEmbed(c.patch_size, c.channels, c.dim, rngs=rngs)
        tokens = self.num_prefix_tokens + c.num_patches
        self.prefix_tokens = nnx.Param(
            EMBED_INIT(rngs.params(), (1, self.num_prefix_tokens, c.dim), PARAM_DTYPE)
        )
        self.pos_embed = nnx.Param(EMBED_INIT(rngs.params(), (1, tokens, c.dim), PARAM_DTYPE))
        self.blocks = nnx.List(
            [
                Block(
                    c.dim,
                    c.mlp_dim,
                    Attention(c.dim, c.num_heads, rngs=rngs),
                    drop_path=rate,
                    activation=c.activation,
                    eps=c.layer_norm_eps,
                    rngs=rngs,
                )
                for rate in drop_path_rates(c.drop_path, c.depth)
            ]
        )
        self.norm = nnx.LayerNorm(c.dim, epsilon=c.layer_norm_eps, param_dtype=PARAM_DTYPE, rngs=rngs)
        self.head = nnx.Linear(c.dim, c.num_classes, param_dtype=PARAM_DTYPE, rngs=rngs)

    def embed(self, images: jax.Array) -> jax.Array:
        """Input tokens of block 0: ``(B, H, W, C) -> (B, prefix + patches, dim)``."""
        x = self.patch_embed(images)
        b = x.shape[0]
        x = x.reshape(b, -1, self.config.dim)
        prefix = self.prefix_tokens[...].astype(x.dtype)
        prefix = jnp.broadcast_to(prefix, (b,) + prefix.shape[1:])
        return jnp.concatenate([prefix, x], axis=1) + self.pos_embed[...].astype(x.dtype)

    def block_input(self, images: jax.Array, index: int) -> jax.Array:
        """Tokens fed to ``self.blocks[index]``, shape ``(B, T, dim)``."""
        x = self.embed(images)
        for block in self.blocks[:index]:
            x = block(x)
        return x

    def features(self, images: jax.Array) -> jax.Array:
        """Final normalised tokens ``(B, T, dim)``."""
        return self.norm(self.block_input(images, len(self.blocks)))

    def __call__(self, images: jax.Array) -> jax.Array:
        return self.head(self.features(images)[:, 0])

    def preprocess(self, images) -> np.ndarray:
        """Raw ``uint8`` images ``(N, H, W, C)`` to model inputs ``(N, image_size, image_size, C)``
        float32 through the Hugging Face ``preprocessor_config.json`` the model was read with
        (:class:`jaxbsd.models.vit.preprocessing.ImageProcessor`); ``ValueError`` without one."""
        processor = getattr(self, "image_processor", None)
        if processor is None:
            raise ValueError("preprocess: this model was not read with a preprocessor_config.json")
        return processor(images)
