"""Building blocks shared by the ViT, Swin and DeiT models.

Every transformer block keeps its feed-forward network as one attribute, ``block.mlp``,
with the contract ``(..., dim) -> (..., dim)``.  Compression is then plain attribute
assignment (``model.blocks[i].mlp = other``), and Jacobian capture only needs that
one module (see :mod:`jaxbsd.models.capture`).

The :class:`MLP` is the paper's FCNN, f(x) = V1 h(V0 x + b0) + b1 (paper eq. for
``P_FC``), stored in Flax's row-vector convention: ``fc1.kernel`` has shape
``(dim, hidden)`` = V0ᵀ and ``fc2.kernel`` has shape ``(hidden, dim)`` = V1ᵀ.  The
structured-Jacobian path of the solver reads these kernels, the biases and the
activation's derivative from :data:`ACTIVATION_DERIVATIVES`.

All modules create their parameters in float32 explicitly, and every broadcast is
written between arrays of equal rank, so the code runs under
``jax_numpy_rank_promotion="raise"``.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxbsd.solver.activations import ACTIVATION_DERIVATIVES, ACTIVATIONS

__all__ = [
    "ACTIVATIONS",
    "ACTIVATION_DERIVATIVES",
    "MLP",
    "Attention",
    "DropPath",
    "PatchEmbed",
    "Block",
    "patchify",
    "config_to_dict",
    "config_from_dict",
]

PARAM_DTYPE = jnp.float32
# ViT/DeiT initialise token and position embeddings with a small normal (std 0.02).
EMBED_INIT = nnx.initializers.normal(stddev=0.02)


def _check_positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


class MLP(nnx.Module):
    """Transformer feed-forward network ``fc2(h(fc1(x)))``.

    Args:
        dim: input and output width m.
        hidden: hidden width δ·m.
        activation: a key of :data:`ACTIVATIONS` (``"gelu"`` is exact, erf-based).
        rngs: parameter initialisation keys.

    Shapes:
        ``(..., dim) -> (..., dim)``; ``fc1.kernel`` ``(dim, hidden)``, ``fc1.bias``
        ``(hidden,)``, ``fc2.kernel`` ``(hidden, dim)``, ``fc2.bias`` ``(dim,)``.
    """

    def __init__(self, dim: int, hidden: int, *, activation: str = "gelu", rngs: nnx.Rngs):
        _check_positive("dim", dim)
        _check_positive("hidden", hidden)
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}"
            )
        self.dim = dim
        self.hidden = hidden
        self.activation = activation
        self.fc1 = nnx.Linear(dim, hidden, param_dtype=PARAM_DTYPE, rngs=rngs)
        self.fc2 = nnx.Linear(hidden, dim, param_dtype=PARAM_DTYPE, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc2(ACTIVATIONS[self.activation](self.fc1(x)))


class DropPath(nnx.Module):
    """Stochastic depth: drop a whole residual branch per sample during training.

    Active only when ``deterministic`` is False (``model.train()``); the kept samples
    are rescaled by ``1 / (1 - rate)`` so the expectation is unchanged.
    """

    def __init__(self, rate: float, *, rngs: nnx.Rngs | None = None):
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"rate must lie in [0, 1), got {rate!r}")
        self.rate = float(rate)
        self.deterministic = True
        # Only a live branch needs a key stream; rate 0 keeps the state free of RNGs.
        if rate > 0.0:
            if rngs is None:
                raise ValueError("rngs is required when rate > 0")
            self.rngs = rngs["dropout"].fork()
        else:
            self.rngs = nnx.data(None)

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.deterministic or self.rate == 0.0:
            return x
        keep = 1.0 - self.rate
        shape = (x.shape[0],) + (1,) * (x.ndim - 1)
        mask = jax.random.bernoulli(self.rngs(), keep, shape)
        return jnp.where(mask, x / keep, jnp.zeros_like(x))


class Attention(nnx.Module):
    """Multi-head self-attention over the token axis.

    Args:
        dim: token width; must be divisible by ``num_heads``.
        num_heads: number of heads.

    ``__call__(x, bias=None)``: ``x`` has shape ``(..., T, dim)``; ``bias`` (optional) is
    added to the attention logits of shape ``(..., heads, T, T)`` and must have the
    same rank (size-1 axes broadcast).  It carries Swin's relative position bias and
    its shifted-window mask (large negative entries).
    """

    def __init__(self, dim: int, num_heads: int, *, rngs: nnx.Rngs):
        _check_positive("dim", dim)
        _check_positive("num_heads", num_heads)
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nnx.Linear(dim, 3 * dim, param_dtype=PARAM_DTYPE, rngs=rngs)
        self.proj = nnx.Linear(dim, dim, param_dtype=PARAM_DTYPE, rngs=rngs)

    def __call__(self, x: jax.Array, bias: jax.Array | None = None) -> jax.Array:
        *lead, tokens, _ = x.shape
        qkv = self.qkv(x).reshape(*lead, tokens, 3, self.num_heads, self.head_dim)
        # (..., T, heads, hd) -> (..., heads, T, hd)
        q, k, v = (jnp.swapaxes(qkv[..., i, :, :], -2, -3) for i in range(3))
        logits = jnp.einsum("...hqd,...hkd->...hqk", q, k) / math.sqrt(self.head_dim)
        if bias is not None:
            if bias.ndim != logits.ndim:
                raise ValueError(
                    f"bias must have rank {logits.ndim} (logits {logits.shape}), "
                    f"got shape {bias.shape}"
                )
            logits = logits + bias.astype(logits.dtype)
        weights = jax.nn.softmax(logits, axis=-1)
        out = jnp.einsum("...hqk,...hkd->...qhd", weights, v)
        return self.proj(out.reshape(*lead, tokens, self.dim))


def patchify(images: jax.Array, patch: int) -> jax.Array:
    """Cut NHWC images into non-overlapping patches.

    ``(B, H, W, C) -> (B, H/p, W/p, p·p·C)``; the patch vector is ordered (row, col, channel).
    """
    b, h, w, c = images.shape
    if h % patch or w % patch:
        raise ValueError(f"image size {(h, w)} must be divisible by patch size {patch}")
    x = images.reshape(b, h // patch, patch, w // patch, patch, c)
    x = x.transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, h // patch, w // patch, patch * patch * c)


class PatchEmbed(nnx.Module):
    """Linear patch embedding, equivalent to a conv with kernel = stride = ``patch``.

    ``(B, H, W, C) -> (B, H/p, W/p, dim)``: a grid, so Swin can keep the 2-D layout and
    ViT can flatten it.
    """

    def __init__(self, patch: int, channels: int, dim: int, *, rngs: nnx.Rngs):
        _check_positive("patch", patch)
        _check_positive("channels", channels)
        self.patch = patch
        self.channels = channels
        self.proj = nnx.Linear(patch * patch * channels, dim, param_dtype=PARAM_DTYPE, rngs=rngs)

    def __call__(self, images: jax.Array) -> jax.Array:
        if images.ndim != 4 or images.shape[-1] != self.channels:
            raise ValueError(
                f"images must have shape (B, H, W, {self.channels}), got {images.shape}"
            )
        return self.proj(patchify(images, self.patch))


class Block(nnx.Module):
    """Pre-norm transformer block: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``.

    Args:
        dim: token width.
        mlp_hidden: hidden width of the MLP.
        attn: the token-mixing module, ``(..., dim) -> (..., dim)`` on whatever token
            layout the model uses (``(B, T, dim)`` for ViT, ``(B, H, W, dim)`` for Swin).
        drop_path: stochastic-depth rate for both residual branches.
        activation: MLP activation name.
        eps: the LayerNorms' epsilon.

    ``block.mlp`` is the only attribute compression touches; :meth:`mlp_input` gives
    the MLP's input tokens for a block input, used by Jacobian capture.
    """

    def __init__(
        self,
        dim: int,
        mlp_hidden: int,
        attn: nnx.Module,
        *,
        drop_path: float = 0.0,
        activation: str = "gelu",
        eps: float = 1e-6,
        rngs: nnx.Rngs,
    ):
        self.norm1 = nnx.LayerNorm(dim, epsilon=eps, param_dtype=PARAM_DTYPE, rngs=rngs)
        self.attn = attn
        self.norm2 = nnx.LayerNorm(dim, epsilon=eps, param_dtype=PARAM_DTYPE, rngs=rngs)
        self.mlp = MLP(dim, mlp_hidden, activation=activation, rngs=rngs)
        self.drop_path = DropPath(drop_path, rngs=rngs)

    def attention_residual(self, x: jax.Array) -> jax.Array:
        """The state after the attention branch, ``x + attn(norm1(x))``."""
        return x + self.drop_path(self.attn(self.norm1(x)))

    def mlp_input(self, x: jax.Array) -> jax.Array:
        """The tokens that ``self.mlp`` sees for block input ``x`` (same layout as x)."""
        return self.norm2(self.attention_residual(x))

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.attention_residual(x)
        return x + self.drop_path(self.mlp(self.norm2(x)))


# --- config helpers shared by the model files ------------------------------------------


def config_to_dict(config) -> dict:
    """A frozen config dataclass as a JSON-ready dict (tuples become lists)."""
    return {
        f.name: list(v) if isinstance(v := getattr(config, f.name), tuple) else v
        for f in dataclasses.fields(config)
    }


def config_from_dict(cls, data: dict):
    """Rebuild a config dataclass ``cls`` from :func:`config_to_dict` output.

    Raises ``ValueError`` on unknown keys, so a checkpoint written by a different
    model version is reported instead of silently misread.
    """
    if not isinstance(data, dict):
        raise ValueError(f"config must be a dict, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"config has unknown fields for {cls.__name__}: {unknown}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def check_config_ints(config, *names: str) -> None:
    """``ValueError`` naming the field unless every ``names`` field is a positive int."""
    for name in names:
        _check_positive(name, getattr(config, name))


def check_config_positive(config, *names: str) -> None:
    """``ValueError`` naming the field unless every ``names`` field is a positive finite number
    (an int or a float; a bool is not one)."""
    for name in names:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def check_vision_config(config, *int_fields: str) -> None:
    """The checks every vision-transformer config shares: the ``int_fields`` are positive
    ints, the patch divides the image, the heads divide the width, ``drop_path`` in [0, 1)."""
    check_config_ints(config, "image_size", "channels", "num_classes", "patch_size", "dim", "num_heads",
                      "mlp_dim", *int_fields)
    if config.image_size % config.patch_size:
        raise ValueError(f"patch_size ({config.patch_size}) must divide image_size ({config.image_size})")
    if config.dim % config.num_heads:
        raise ValueError(f"num_heads ({config.num_heads}) must divide dim ({config.dim})")
    if not 0.0 <= config.drop_path < 1.0:
        raise ValueError(f"drop_path must lie in [0, 1), got {config.drop_path!r}")


#: ``(image_size, channels, num_classes)`` of every data set a config has a preset for.
IMAGE_PRESETS = {
    "mnist": (28, 1, 10),
    "fashion_mnist": (28, 1, 10),
    "usps": (16, 1, 10),
    "digits": (8, 1, 10),
    "cifar10": (32, 3, 10),
    "svhn": (32, 3, 10),
}


def _preset(image_size: int, channels: int, num_classes: int) -> classmethod:
    return classmethod(lambda cls, **kw: cls.for_images(image_size, channels, num_classes, **kw))


class ImagePresets:
    """Per-data-set constructors shared by the model configs (``ViTConfig.mnist()``, ...): each
    calls the config's ``for_images(image_size, channels, num_classes, **overrides)`` with the
    data set's shape from :data:`IMAGE_PRESETS`."""


for _name, _shape in IMAGE_PRESETS.items():
    setattr(ImagePresets, _name, _preset(*_shape))
