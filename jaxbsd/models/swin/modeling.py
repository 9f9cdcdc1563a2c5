"""Swin Transformer (Liu et al., 2021) in Flax NNX, at the paper's small scale.

Paper settings (appendix, "Swin — SVHN, CIFAR10"): embedding 64, 4 heads, window 4,
MLP 256, stochastic depth 0.1, no dropout.  The paper gives no depth or stage layout;
our choice, for 32×32 inputs:

* patch 4 (``image_size // 8``), so the first token grid is 8×8 = 2×2 windows of 4×4;
* stage 1: two blocks at 8×8, W-MSA then SW-MSA (cyclic shift by window/2 with an
  attention mask so tokens never attend across the wrapped boundary);
* patch merging: concatenate 2×2 neighbours (4C), LayerNorm, project 4C → **C**.
  Real Swin doubles the width (4C → 2C); we keep C = 64 so that every MLP in the model
  is the same 64 → 256 → 64 function, as the paper's compression tables assume;
* stage 2: one block at 4×4, where the window covers the whole map, so the shift is
  disabled (there is nothing to shift across) and attention is global;
* LayerNorm, global average pooling, linear head.

All blocks live in one flat ``model.blocks`` (an ``nnx.List`` of 3), so
``model.blocks[i].mlp`` addresses every MLP exactly as for ViT.  Each block's
attention has its own learned relative position bias table ((2w−1)², heads).
Stochastic depth rises linearly from 0 to ``drop_path`` over the blocks (Swin's rule).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxbsd.models.layers import PARAM_DTYPE, Attention, Block, ImagePresets, PatchEmbed, check_vision_config
from jaxbsd.models.vit.modeling import drop_path_rates

__all__ = ["SwinConfig", "Swin", "WindowAttention", "PatchMerging", "shift_mask"]

# Logit offset for masked pairs: exp(-1e9) is exactly 0 in float32 and float64, so a
# masked token gets zero weight (-100, as in the reference code, leaks ~1e-44).
_MASK_VALUE = -1e9


@dataclasses.dataclass(frozen=True)
class SwinConfig(ImagePresets):
    """Hyper-parameters of :class:`Swin`.

    Attributes:
        image_size, channels, num_classes: input/output description.
        patch_size: patch side; ``image_size / patch_size`` is the first grid side.
        dim: token width C, kept through patch merging.
        depths: blocks per stage; a patch merging (grid halves) precedes each stage
            after the first.  Blocks alternate W-MSA / SW-MSA within a stage.
        num_heads: heads in every block.
        window_size: window side; clipped to the grid side when the grid is smaller.
        mlp_dim: MLP hidden width.
        drop_path: maximal stochastic-depth rate.
    """

    image_size: int = 32
    channels: int = 3
    num_classes: int = 10
    patch_size: int = 4
    dim: int = 64
    depths: tuple[int, ...] = (2, 1)
    num_heads: int = 4
    window_size: int = 4
    mlp_dim: int = 256
    activation: str = "gelu"
    drop_path: float = 0.1

    def __post_init__(self):
        check_vision_config(self, "window_size")
        if not isinstance(self.depths, tuple) or not self.depths or any(
            not isinstance(d, int) or d < 1 for d in self.depths
        ):
            raise ValueError(f"depths must be a non-empty tuple of positive ints, got {self.depths!r}")
        for stage, grid in enumerate(self.grid_sizes):
            if stage < len(self.depths) - 1 and grid % 2:
                raise ValueError(f"grid side {grid} of stage {stage} must be even for patch merging")
            window = min(self.window_size, grid)
            if grid % window:
                raise ValueError(
                    f"window_size ({self.window_size}) must divide the grid side ({grid}) of stage {stage}"
                )

    @property
    def grid_sizes(self) -> tuple[int, ...]:
        """Token-grid side of each stage."""
        first = self.image_size // self.patch_size
        return tuple(first // 2**s for s in range(len(self.depths)))

    @property
    def depth(self) -> int:
        return sum(self.depths)

    @classmethod
    def for_images(cls, image_size: int, channels: int, num_classes: int = 10, **overrides):
        """The paper's Swin for this image size; patch ``image_size // 8`` (8×8 first grid)."""
        if "patch_size" not in overrides:
            if image_size % 8:
                raise ValueError(f"image_size {image_size} is not a multiple of 8; pass patch_size")
            overrides["patch_size"] = image_size // 8
        return cls(image_size=image_size, channels=channels, num_classes=num_classes, **overrides)

    @classmethod
    def tiny(cls, **kw):
        """8×8×1 images, patch 1 (8×8 grid), width 16: still 2 windows per side."""
        base = dict(image_size=8, channels=1, num_classes=3, patch_size=1, dim=16, num_heads=2,
                    mlp_dim=32, drop_path=0.1)
        return cls(**{**base, **kw})


@functools.lru_cache(maxsize=None)
def relative_position_index(window: int) -> np.ndarray:
    """``(w², w²)`` index into the ((2w−1)², heads) bias table for each token pair."""
    coords = np.stack(np.meshgrid(np.arange(window), np.arange(window), indexing="ij"))
    coords = coords.reshape(2, -1)  # (2, w²), row-major token order
    rel = coords[:, :, None] - coords[:, None, :] + (window - 1)  # (2, w², w²)
    index = rel[0] * (2 * window - 1) + rel[1]
    index.setflags(write=False)
    return index


@functools.lru_cache(maxsize=None)
def shift_mask(grid: int, window: int, shift: int) -> np.ndarray:
    """Additive attention mask ``(num_windows, w², w²)`` for a cyclically shifted grid.

    After rolling the grid by ``-shift``, a window may hold tokens from up to four
    regions that were not neighbours in the image; pairs from different regions get
    ``_MASK_VALUE``, pairs from the same region 0.  With ``shift == 0`` it is all zeros.
    """
    labels = np.zeros((grid, grid), dtype=np.int64)
    if shift:
        bands = (slice(0, grid - window), slice(grid - window, grid - shift), slice(grid - shift, grid))
        count = 0
        for rows in bands:
            for cols in bands:
                labels[rows, cols] = count
                count += 1
    nw = grid // window
    win = labels.reshape(nw, window, nw, window).transpose(0, 2, 1, 3).reshape(nw * nw, window * window)
    mask = np.where(win[:, :, None] == win[:, None, :], 0.0, _MASK_VALUE)
    mask.setflags(write=False)
    return mask


def window_partition(x: jax.Array, window: int) -> jax.Array:
    """``(B, H, W, C) -> (B, num_windows, w², C)``, windows in row-major order."""
    b, h, w, c = x.shape
    x = x.reshape(b, h // window, window, w // window, window, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, (h // window) * (w // window), window * window, c)


def window_reverse(x: jax.Array, window: int, h: int, w: int) -> jax.Array:
    """Inverse of :func:`window_partition`."""
    b, _, _, c = x.shape
    x = x.reshape(b, h // window, w // window, window, window, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, h, w, c)


class WindowAttention(nnx.Module):
    """(Shifted-)window multi-head self-attention on a ``(B, H, W, C)`` token grid.

    Args:
        dim, num_heads: width and heads.
        grid: side of the (square) grid this block sees.
        window: window side (clipped to ``grid``).
        shift: cyclic shift; forced to 0 when the window covers the grid.
    """

    def __init__(self, dim: int, num_heads: int, grid: int, window: int, shift: int, *, rngs: nnx.Rngs):
        window = min(window, grid)
        if grid % window:
            raise ValueError(f"window ({window}) must divide grid ({grid})")
        self.grid = grid
        self.window = window
        # A window as large as the map sees every token already: shifting would only
        # wrap the map around, so SW-MSA degenerates to W-MSA.
        self.shift = shift if window < grid else 0
        if not 0 <= self.shift < window:
            raise ValueError(f"shift must lie in [0, window), got {shift}")
        self.num_heads = num_heads
        self.attn = Attention(dim, num_heads, rngs=rngs)
        init = nnx.initializers.truncated_normal(stddev=0.02)
        self.relative_bias = nnx.Param(
            init(rngs.params(), ((2 * window - 1) ** 2, num_heads), PARAM_DTYPE)
        )

    def attention_bias(self) -> jax.Array:
        """Relative position bias plus shift mask, ``(1, num_windows, heads, w², w²)``."""
        t = self.window * self.window
        bias = self.relative_bias[...][relative_position_index(self.window).reshape(-1)]
        bias = bias.reshape(t, t, self.num_heads).transpose(2, 0, 1)[None, None]
        if self.shift:
            mask = jnp.asarray(shift_mask(self.grid, self.window, self.shift), bias.dtype)
            bias = bias + mask[None, :, None]
        return bias

    def __call__(self, x: jax.Array) -> jax.Array:
        _, h, w, _ = x.shape
        if h != self.grid or w != self.grid:
            raise ValueError(f"expected a {self.grid}×{self.grid} grid, got {(h, w)}")
        if self.shift:
            x = jnp.roll(x, (-self.shift, -self.shift), axis=(1, 2))
        out = self.attn(window_partition(x, self.window), self.attention_bias())
        out = window_reverse(out, self.window, h, w)
        if self.shift:
            out = jnp.roll(out, (self.shift, self.shift), axis=(1, 2))
        return out


class PatchMerging(nnx.Module):
    """Concatenate 2×2 neighbours and project: ``(B, H, W, C) -> (B, H/2, W/2, out_dim)``."""

    def __init__(self, dim: int, out_dim: int, *, rngs: nnx.Rngs):
        self.norm = nnx.LayerNorm(4 * dim, epsilon=1e-5, param_dtype=PARAM_DTYPE, rngs=rngs)
        self.reduction = nnx.Linear(4 * dim, out_dim, use_bias=False, param_dtype=PARAM_DTYPE, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = jnp.concatenate(
            [x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], axis=-1
        )
        return self.reduction(self.norm(x))


class Swin(nnx.Module):
    """Swin Transformer classifier: ``model(images)``, ``(B, H, W, C)`` → ``(B, classes)``.

    Has stochastic depth: call ``model.train()`` before training and ``model.eval()``
    for deterministic inference (the default after construction).
    """

    kind = "swin"

    def __init__(self, config: SwinConfig, *, rngs: nnx.Rngs):
        if not isinstance(config, SwinConfig):
            raise ValueError(f"config must be a SwinConfig, got {type(config).__name__}")
        self.config = config
        c = config
        self.patch_embed = PatchEmbed(c.patch_size, c.channels, c.dim, rngs=rngs)
        self.embed_norm = nnx.LayerNorm(c.dim, epsilon=1e-5, param_dtype=PARAM_DTYPE, rngs=rngs)
        rates = iter(drop_path_rates(c.drop_path, c.depth))
        blocks, starts = [], []
        for stage, (depth, grid) in enumerate(zip(c.depths, c.grid_sizes)):
            starts.append(len(blocks))
            for j in range(depth):
                shift = c.window_size // 2 if j % 2 else 0
                attn = WindowAttention(c.dim, c.num_heads, grid, c.window_size, shift, rngs=rngs)
                blocks.append(
                    Block(c.dim, c.mlp_dim, attn, drop_path=next(rates), activation=c.activation, rngs=rngs)
                )
        self.blocks = nnx.List(blocks)
        #: index of the first block of each stage after the first (a merging precedes it)
        self.merge_before = tuple(starts[1:])
        self.merges = nnx.List([PatchMerging(c.dim, c.dim, rngs=rngs) for _ in starts[1:]])
        self.norm = nnx.LayerNorm(c.dim, epsilon=1e-5, param_dtype=PARAM_DTYPE, rngs=rngs)
        self.head = nnx.Linear(c.dim, c.num_classes, param_dtype=PARAM_DTYPE, rngs=rngs)

    def embed(self, images: jax.Array) -> jax.Array:
        """Input grid of block 0: ``(B, H, W, C) -> (B, H/p, W/p, dim)``."""
        return self.embed_norm(self.patch_embed(images))

    def block_input(self, images: jax.Array, index: int) -> jax.Array:
        """Token grid fed to ``self.blocks[index]``, ``(B, h, w, dim)`` (after any merging)."""
        x = self.embed(images)
        for j in range(index + 1):
            if j in self.merge_before:
                x = self.merges[self.merge_before.index(j)](x)
            if j == index:
                break
            x = self.blocks[j](x)
        return x

    def __call__(self, images: jax.Array) -> jax.Array:
        x = self.block_input(images, len(self.blocks) - 1)
        x = self.blocks[-1](x)
        x = self.norm(x).mean(axis=(1, 2))
        return self.head(x)
