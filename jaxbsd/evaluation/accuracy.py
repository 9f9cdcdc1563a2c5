"""Classification accuracy of image models: logits and top-1 accuracy over batched images."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxbsd.evaluation.checks import check_images, check_positive_int
from jaxbsd.models.capture import padded_batches

__all__ = ["predict", "evaluate", "logits_step"]


@nnx.jit
def _eval_step(model, x, y, valid):
    pred = jnp.argmax(model(x), axis=-1)
    return jnp.sum((pred == y) & valid)


@nnx.jit
def logits_step(model, x):
    """``model(x)`` as one jitted computation: ``(B, H, W, C)`` images to ``(B, classes)`` logits."""
    return model(x)


def predict(model, images, batch_size: int = 512) -> np.ndarray:
    """Logits ``(N, classes)`` of ``model`` (put in eval mode) on ``(N, H, W, C)`` images."""
    check_images(images, None)
    check_positive_int("batch_size", batch_size)
    model.eval()
    out = [
        np.asarray(logits_step(model, jnp.asarray(chunk)))[:valid]
        for _, valid, chunk in padded_batches(images, batch_size)
    ]
    return np.concatenate(out)


def evaluate(model, images, labels, batch_size: int = 512) -> float:
    """Top-1 accuracy, a fraction in [0, 1].  Puts ``model`` in eval mode.

    Args:
        model: maps ``(B, H, W, C)`` images to ``(B, classes)`` logits.
        images: ``(N, H, W, C)``.
        labels: ``(N,)`` integer classes.
        batch_size: images per forward pass (the last batch is padded and masked).
    """
    check_images(images, labels)
    check_positive_int("batch_size", batch_size)
    model.eval()
    labels = np.asarray(labels, dtype=np.int32)
    correct = 0
    for start, valid, chunk in padded_batches(images, batch_size):
        size = chunk.shape[0]
        y = np.zeros(size, np.int32)
        y[:valid] = labels[start : start + valid]
        mask = np.arange(size) < valid
        correct += int(_eval_step(model, jnp.asarray(chunk), jnp.asarray(y), jnp.asarray(mask)))
    return correct / images.shape[0]
