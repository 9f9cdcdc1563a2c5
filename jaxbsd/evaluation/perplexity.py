"""Language-model evaluation: bits per character of a model, and n-gram baselines.

:func:`lm_windows_loss` is the next-token cross-entropy of a batch of id windows (what
:func:`jaxbsd.training.train_lm` minimises); :func:`evaluate_lm` scores every character of an id
stream once, in bits; :func:`ngram_bpc` gives the add-alpha unigram and bigram baselines on the same
characters.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxbsd import data as _data
from jaxbsd.evaluation.checks import check_positive_int, is_number
from jaxbsd.models.capture import padded_batches

__all__ = ["LN2", "lm_windows_loss", "evaluate_lm", "ngram_bpc"]

#: ln 2: nats per bit.
LN2 = math.log(2.0)


def lm_windows_loss(model, windows: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Mean next-token cross-entropy (nats) of ``model`` on ``(B, T + 1)`` id windows.

    Inputs are ``windows[:, :-1]``, targets ``windows[:, 1:]``; ``mask`` ``(B, T)`` bool (default
    all) selects the targets that count. Divide by ln 2 for bits per character.
    """
    logits = model(windows[:, :-1])
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, windows[:, 1:])
    if mask is None:
        return losses.mean()
    mask = mask.astype(losses.dtype)
    return jnp.sum(losses * mask) / jnp.maximum(jnp.sum(mask), 1.0)


@nnx.jit
def _lm_eval_step(model, windows, mask):
    logits = model(windows[:, :-1])
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, windows[:, 1:])
    return jnp.sum(jnp.where(mask, losses, 0.0))


def evaluate_lm(model, ids, *, context: int | None = None, stride: int | None = None,
                batch_size: int = 64) -> float:
    """Bits per character of ``model`` on the id stream ``ids``: every id after the first is
    predicted once (:func:`jaxbsd.data.eval_windows`), the mean of −log₂ p over them.

    Args:
        model: maps ``(B, T)`` ids to ``(B, T, vocab)`` logits, causally (an :class:`~jaxbsd.models.LM`).
        ids: ``(N,)`` integer ids, N ≥ 2.
        context: window length T (default ``model.config.context``).
        stride: distance between window starts (default ``context``: non-overlapping windows,
            a target sees 0 to context − 1 earlier characters, context/2 on average; a smaller
            stride gives every target more context and costs context/stride as many passes).
        batch_size: windows per forward pass (the last batch is padded and masked).
    """
    check_positive_int("batch_size", batch_size)
    context = model.config.context if context is None else context
    windows, mask = _data.eval_windows(np.asarray(ids), context, stride)
    model.eval()
    total = 0.0
    for start, valid, chunk in padded_batches(windows.astype(np.int32), batch_size):
        m = np.zeros((chunk.shape[0], context), bool)
        m[:valid] = mask[start : start + valid]
        total += float(_lm_eval_step(model, jnp.asarray(chunk), jnp.asarray(m)))
    bpc = total / int(mask.sum()) / LN2
    if not math.isfinite(bpc):
        raise FloatingPointError(f"bits per character is {bpc}")
    return bpc


def ngram_bpc(train_ids, eval_ids, order: int, vocab_size: int, alpha: float = 1.0) -> float:
    """Bits per character of an add-``alpha`` (Laplace) smoothed n-gram model, fitted on
    ``train_ids`` and scored on ``eval_ids[1:]`` (the targets :func:`evaluate_lm` scores).

    ``order=1`` (unigram): p(c) = (n(c) + α) / (N + αV). ``order=2`` (bigram):
    p(c | b) = (n(b c) + α) / (n(b ·) + αV), with n(b ·) the bigrams starting with b.
    """
    if order not in (1, 2):
        raise ValueError(f"order must be 1 (unigram) or 2 (bigram), got {order!r}")
    check_positive_int("vocab_size", vocab_size)
    if not (is_number(alpha) and alpha > 0):
        raise ValueError(f"alpha must be a positive finite number, got {alpha!r}")
    train_ids = np.asarray(train_ids, np.int64)
    eval_ids = np.asarray(eval_ids, np.int64)
    for name, ids in (("train_ids", train_ids), ("eval_ids", eval_ids)):
        if ids.ndim != 1 or len(ids) < 2 or ids.min() < 0 or ids.max() >= vocab_size:
            raise ValueError(f"{name} must be a 1-D array of >= 2 ids in [0, {vocab_size})")
    if order == 1:
        counts = np.bincount(train_ids, minlength=vocab_size).astype(np.float64)
        logp = np.log2(counts + alpha) - np.log2(counts.sum() + alpha * vocab_size)
        return float(-logp[eval_ids[1:]].mean())
    pairs = np.bincount(train_ids[:-1] * vocab_size + train_ids[1:], minlength=vocab_size**2)
    pairs = pairs.reshape(vocab_size, vocab_size).astype(np.float64)
    logp = np.log2(pairs + alpha) - np.log2(pairs.sum(axis=1, keepdims=True) + alpha * vocab_size)
    return float(-logp[eval_ids[:-1], eval_ids[1:]].mean())
