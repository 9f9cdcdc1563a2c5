"""A Hugging Face ``preprocessor_config.json`` (ViT's and DeiT's image processors) in numpy.

:class:`ImageProcessor` applies, in ``transformers``' order: resize to ``size`` (bilinear or
bicubic, computed as Pillow computes it on 8-bit images: its antialiased separable filters with
22-bit fixed-point weights, horizontal pass then vertical, each rounded back to ``uint8``), centre
crop to ``crop_size``, rescale by ``rescale_factor`` and normalise by ``image_mean`` /
``image_std``. Images are NHWC ``uint8``; the output is NHWC float32 (jaxbsd's vision layout).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib

import numpy as np

__all__ = ["ImageProcessor", "resize_like_pillow", "RESAMPLE_FILTERS"]

# Pillow's fixed-point precision for 8-bit resampling (libImaging/Resample.c).
_PRECISION_BITS = 32 - 8 - 2


def _bilinear(x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    return np.where(x < 1.0, 1.0 - x, 0.0)


def _bicubic(x: np.ndarray, a: float = -0.5) -> np.ndarray:
    x = np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    far = (((x - 5.0) * x + 8.0) * x - 4.0) * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


#: Pillow's resample codes (``preprocessor_config.json``'s ``resample``) -> (filter, support).
RESAMPLE_FILTERS = {2: (_bilinear, 1.0), 3: (_bicubic, 2.0)}


def _weights(in_size: int, out_size: int, resample: int) -> np.ndarray:
    """``(out_size, in_size)`` int64 fixed-point weights of one resampling pass (Pillow's
    ``precompute_coeffs`` and ``normalize_coeffs_8bpc``)."""
    kernel, support = RESAMPLE_FILTERS[resample]
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = support * filterscale
    weights = np.zeros((out_size, in_size), np.float64)
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        lo = max(int(center - support + 0.5), 0)  # C's (int) truncates; the clamp makes it a floor
        hi = min(int(center + support + 0.5), in_size)
        w = kernel((np.arange(lo, hi) - center + 0.5) / filterscale)
        total = w.sum()
        weights[xx, lo:hi] = w / total if total != 0 else w
    scaled = weights * (1 << _PRECISION_BITS)
    return np.where(scaled < 0, np.trunc(scaled - 0.5), np.trunc(scaled + 0.5)).astype(np.int64)


def _resample_axis(images: np.ndarray, weights: np.ndarray, axis: int) -> np.ndarray:
    moved = np.moveaxis(images.astype(np.int64), axis, -1)
    acc = moved @ weights.T + (1 << (_PRECISION_BITS - 1))
    return np.moveaxis(np.clip(acc >> _PRECISION_BITS, 0, 255).astype(np.uint8), -1, axis)


def resize_like_pillow(images: np.ndarray, height: int, width: int, resample: int) -> np.ndarray:
    """``uint8 (N, H, W, C) -> uint8 (N, height, width, C)`` as ``PIL.Image.resize((width, height),
    resample)`` resizes each image (``resample`` 2 bilinear or 3 bicubic)."""
    if resample not in RESAMPLE_FILTERS:
        raise ValueError(f"resample must be one of {sorted(RESAMPLE_FILTERS)} (bilinear, bicubic), got {resample!r}")
    out = images
    if width != images.shape[2]:
        out = _resample_axis(out, _weights(images.shape[2], width, resample), 2)
    if height != images.shape[1]:
        out = _resample_axis(out, _weights(images.shape[1], height, resample), 1)
    return out


def _size(config: dict, key: str, where: str) -> tuple[int, int] | None:
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value, value
    if isinstance(value, dict) and set(value) == {"height", "width"}:
        return int(value["height"]), int(value["width"])
    raise ValueError(f"{where}: {key} {value!r} is not supported (expected {{'height': h, 'width': w}})")


@dataclasses.dataclass(frozen=True)
class ImageProcessor:
    """The image pipeline of a ``preprocessor_config.json`` (see the module docs).

    Attributes:
        size: ``(height, width)`` to resize to, or None (no resize).
        resample: Pillow's filter code (2 bilinear, 3 bicubic).
        crop_size: ``(height, width)`` of the centre crop, or None.
        rescale_factor: the factor applied to the ``uint8`` values (None: none).
        image_mean, image_std: per-channel normalisation (None: none).
    """

    size: tuple[int, int] | None = None
    resample: int = 2
    crop_size: tuple[int, int] | None = None
    rescale_factor: float | None = 1 / 255
    image_mean: tuple[float, ...] | None = None
    image_std: tuple[float, ...] | None = None

    @classmethod
    def from_config(cls, config: dict, where: str = "preprocessor_config.json") -> "ImageProcessor":
        """The processor of a ``preprocessor_config.json`` dict; ``ValueError`` naming ``where`` and
        the option it cannot apply."""
        if not isinstance(config, dict):
            raise ValueError(f"{where}: expected a JSON object")
        size = _size(config, "size", where) if config.get("do_resize", True) else None
        crop = _size(config, "crop_size", where) if config.get("do_center_crop", False) else None
        resample = config.get("resample", 2)
        if size is not None and resample not in RESAMPLE_FILTERS:
            raise ValueError(f"{where}: resample {resample!r} is not supported (2 bilinear, 3 bicubic)")
        if crop is not None and size is not None and (crop[0] > size[0] or crop[1] > size[1]):
            raise ValueError(f"{where}: crop_size {crop} exceeds size {size}")
        for option in ("do_pad", "do_convert_rgb", "do_reduce_labels"):
            if config.get(option):
                raise ValueError(f"{where}: {option} is not supported")
        mean = std = None
        if config.get("do_normalize", True):
            mean, std = tuple(config.get("image_mean", (0.5,) * 3)), tuple(config.get("image_std", (0.5,) * 3))
            if len(mean) != len(std) or not all(math.isfinite(s) and s > 0 for s in std):
                raise ValueError(f"{where}: image_mean {mean} and image_std {std} must be of one length, std > 0")
        rescale = float(config.get("rescale_factor", 1 / 255)) if config.get("do_rescale", True) else None
        return cls(size=size, resample=int(resample), crop_size=crop, rescale_factor=rescale, image_mean=mean,
                   image_std=std)

    @classmethod
    def from_file(cls, file: pathlib.Path) -> "ImageProcessor":
        """:meth:`from_config` of a ``preprocessor_config.json`` file."""
        from jaxbsd.models.hub import read_json

        return cls.from_config(read_json(file, "the image processor config"), str(file))

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """The ``(height, width)`` of the processed images for inputs of that size."""
        size = self.size or (height, width)
        return self.crop_size or size

    def __call__(self, images) -> np.ndarray:
        """``uint8 (N, H, W, C)`` images -> float32 ``(N, h, w, C)`` model inputs."""
        images = np.asarray(images)
        if images.dtype != np.uint8 or images.ndim != 4:
            raise ValueError(f"images must be uint8 of shape (N, H, W, C), got {images.dtype} {images.shape}")
        if self.size is not None:
            images = resize_like_pillow(images, *self.size, self.resample)
        if self.crop_size is not None:
            (h, w), (ch, cw) = images.shape[1:3], self.crop_size
            top, left = (h - ch) // 2, (w - cw) // 2
            images = images[:, top:top + ch, left:left + cw]
        x = images.astype(np.float64) * self.rescale_factor if self.rescale_factor is not None else images
        x = x.astype(np.float32)
        if self.image_mean is not None:
            channels = images.shape[-1]
            if len(self.image_mean) != channels:
                raise ValueError(f"images have {channels} channels, image_mean {len(self.image_mean)}")
            x = (x - np.asarray(self.image_mean, np.float32)) / np.asarray(self.image_std, np.float32)
        return x.astype(np.float32)
