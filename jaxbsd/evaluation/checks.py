"""Argument checks shared by evaluation and training: each raises ``ValueError`` naming the argument."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["is_int", "is_number", "check_positive_int", "check_images"]


def is_int(value) -> bool:
    """Whether ``value`` is a Python or NumPy integer (a bool is not)."""
    return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def is_number(value) -> bool:
    """Whether ``value`` is a finite Python or NumPy int or float (a bool is not)."""
    return not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating)) and math.isfinite(value)


def check_positive_int(name: str, value) -> None:
    """``ValueError`` naming ``name`` unless ``value`` is an int (Python or NumPy) ≥ 1."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def check_images(images, labels) -> None:
    """``ValueError`` unless ``images`` is ``(N, H, W, C)`` with N ≥ 1 and ``labels`` (None: not
    checked) is ``(N,)``."""
    if getattr(images, "ndim", None) != 4:
        raise ValueError(f"images must have shape (N, H, W, C), got {getattr(images, 'shape', None)}")
    if labels is not None and (getattr(labels, "ndim", None) != 1 or labels.shape[0] != images.shape[0]):
        raise ValueError(
            f"labels must have shape ({images.shape[0]},), got {getattr(labels, 'shape', None)}"
        )
    if images.shape[0] == 0:
        raise ValueError("images must hold at least one example")
