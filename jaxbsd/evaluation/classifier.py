"""Label-free fidelity of a compressed image classifier against its original.

:func:`classifier_logits` runs a classifier over images in batches; :func:`agreement` compares two
classifiers' logits on the same images: top-1 agreement (the fraction of images on which the
arg-max classes coincide) and the mean Kullback–Leibler divergence KL(p_original ‖ p_compressed)
of their softmax distributions, in nats. Neither needs labels.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

__all__ = ["classifier_logits", "agreement", "classifier_agreement"]


@nnx.jit
def _logits(model, x):
    return model(x)


def classifier_logits(model, images, *, batch_size: int = 256) -> np.ndarray:
    """``model``'s logits ``(N, classes)`` float32 on ``images`` ``(N, H, W, C)`` (model inputs: already
    preprocessed), ``batch_size`` at a time; the last batch is padded so that one shape compiles."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    images = np.asarray(images)
    if images.ndim != 4 or len(images) == 0:
        raise ValueError(f"images must have shape (N, H, W, C) with N >= 1, got {images.shape}")
    size = min(batch_size, len(images))
    out = []
    for start in range(0, len(images), size):
        batch = images[start:start + size]
        n = len(batch)
        if n < size:
            batch = np.concatenate([batch, np.zeros((size - n, *batch.shape[1:]), batch.dtype)])
        out.append(np.asarray(_logits(model, jnp.asarray(batch)), np.float32)[:n])
    return np.concatenate(out)


def agreement(reference: np.ndarray, compressed: np.ndarray) -> dict[str, float]:
    """Fidelity of ``compressed`` logits to ``reference`` logits, both ``(N, classes)``:

    - ``top1_agreement``: the fraction of rows whose arg-max classes are equal (ties: the first);
    - ``mean_kl``: the mean over rows of KL(softmax(reference) ‖ softmax(compressed)), in nats
      (computed from log-softmax in float64, so it is ≥ 0 and exactly 0 for equal logits);
    - ``max_kl``: the largest row's KL.

    Raises ``ValueError`` naming the argument for shapes that differ or are not ``(N, classes)``
    with N ≥ 1, or logits that are not finite.
    """
    ref, comp = np.asarray(reference, np.float64), np.asarray(compressed, np.float64)
    if ref.ndim != 2 or ref.shape[0] == 0:
        raise ValueError(f"reference must have shape (N, classes) with N >= 1, got {ref.shape}")
    if comp.shape != ref.shape:
        raise ValueError(f"compressed must have the shape of reference {ref.shape}, got {comp.shape}")
    for name, a in (("reference", ref), ("compressed", comp)):
        if not np.isfinite(a).all():
            raise ValueError(f"{name}: the logits are not all finite")
    log_p = _log_softmax(ref)
    log_q = _log_softmax(comp)
    kl = np.maximum(np.sum(np.exp(log_p) * (log_p - log_q), axis=-1), 0.0)
    return {"top1_agreement": float(np.mean(ref.argmax(-1) == comp.argmax(-1))), "mean_kl": float(kl.mean()),
            "max_kl": float(kl.max())}


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def classifier_agreement(original, compressed, images, *, batch_size: int = 256) -> dict[str, float]:
    """:func:`agreement` of two classifiers' logits on the same ``images`` (model inputs), plus
    ``images`` (their count)."""
    ref = classifier_logits(original, images, batch_size=batch_size)
    out = agreement(ref, classifier_logits(compressed, images, batch_size=batch_size))
    return {**out, "images": int(len(ref))}
