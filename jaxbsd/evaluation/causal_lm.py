"""Label-free evaluation of a causal language model against its original: bits per token and
next-token agreement, on held-out id sequences with padding.

Both take ``ids`` ``(N, T)`` and an optional ``mask`` ``(N, T)`` (1: a real token, 0: padding). Padding
must be on the right of each row: a causal model's real positions never see it, so the models are called
on the ids alone (``model(ids) -> (N, T, vocab)``: jaxbsd's :class:`~jaxbsd.models.LM`, the Hugging Face
decoders of :mod:`jaxbsd.models.gpt2` and :mod:`jaxbsd.models.llama`, anything with that contract).

* :func:`bits_per_token`: the mean of ``−log₂ p(ids[:, t+1] | ids[:, :t+1])`` over the real targets;
* :func:`next_token_agreement`: the share of real positions where the model's most likely next token is
  the reference's (the compressed model against the uncompressed one).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxbsd.evaluation.checks import check_positive_int
from jaxbsd.evaluation.perplexity import LN2
from jaxbsd.models.capture import padded_batches

__all__ = ["bits_per_token", "next_token_agreement"]


def _check(ids, mask, min_len: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, mask)`` as ``int32`` / ``bool`` numpy arrays; ``ValueError`` naming the argument."""
    ids = np.asarray(ids)
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer) or ids.shape[0] < 1 or ids.shape[1] < min_len:
        raise ValueError(f"ids must be an (N, T) integer array with N >= 1 and T >= {min_len}, got "
                         f"{ids.shape} {ids.dtype}")
    if mask is None:
        mask = np.ones(ids.shape, bool)
    else:
        mask = np.asarray(mask)
        if mask.shape != ids.shape:
            raise ValueError(f"mask must have the shape of ids {ids.shape}, got {mask.shape}")
        if not np.isin(mask, (0, 1)).all():
            raise ValueError("mask must hold 0 (padding) and 1 (real tokens) only")
        mask = mask.astype(bool)
        if (mask[:, 1:] > mask[:, :-1]).any():
            raise ValueError("mask: padding must be on the right of each row (a real token after padding)")
    return ids.astype(np.int32), mask


def _batches(ids: np.ndarray, mask: np.ndarray, batch_size: int):
    """``(ids, mask)`` batches of ``batch_size`` rows, the last one padded with masked rows."""
    for start, valid, chunk in padded_batches(ids, batch_size):
        m = np.zeros(chunk.shape, bool)
        m[:valid] = mask[start:start + valid]
        yield jnp.asarray(chunk), jnp.asarray(m)


@nnx.jit
def _loss_sum(model, ids, mask):
    logits = model(ids[:, :-1])
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, ids[:, 1:])
    return jnp.sum(jnp.where(mask[:, 1:], losses, jnp.zeros_like(losses)))


def bits_per_token(model, ids, mask=None, *, batch_size: int = 32) -> float:
    """Bits per token of ``model`` on ``ids``: the mean of ``−log₂ p(ids[n, t+1] | ids[n, :t+1])`` over the
    pairs whose target ``ids[n, t+1]`` is real (``mask`` 1; None: all).

    Args:
      model: ``model(ids (B, T−1)) -> (B, T−1, vocab)`` logits, causal.
      ids: ``(N, T)`` integer ids, ``T ≥ 2``.
      mask: ``(N, T)`` 0/1, padding on the right of each row, or None.
      batch_size: rows per forward pass (one compiled program: the last batch is padded).

    Raises:
      ValueError: naming the argument (shapes, a mask that is not 0/1 or pads on the left, no real target).
    """
    check_positive_int("batch_size", batch_size)
    ids, mask = _check(ids, mask, 2)
    count = int(mask[:, 1:].sum())
    if not count:
        raise ValueError("mask leaves no real target (no row has two real tokens)")
    model.eval()
    total = sum(float(_loss_sum(model, i, m)) for i, m in _batches(ids, mask, batch_size))
    bits = total / count / LN2
    if not math.isfinite(bits):
        raise FloatingPointError(f"bits per token is {bits}")
    return bits


@nnx.jit
def _agreements(model, reference, ids, mask):
    same = jnp.argmax(model(ids), axis=-1) == jnp.argmax(reference(ids), axis=-1)
    return jnp.sum(same & mask)


def next_token_agreement(model, reference, ids, mask=None, *, batch_size: int = 32) -> float:
    """Share of the real positions ``(n, t)`` (``mask`` 1; None: all) where ``argmax model(ids)[n, t]`` equals
    ``argmax reference(ids)[n, t]``: how often the model predicts the reference's most likely next token
    (ties: the lowest id, as ``argmax`` picks).

    Args:
      model, reference: ``(B, T) -> (B, T, vocab)`` logits, causal, of one vocabulary.
      ids: ``(N, T)`` integer ids; mask: ``(N, T)`` 0/1, padding on the right of each row, or None.
      batch_size: rows per forward pass.

    Raises:
      ValueError: naming the argument (shapes, a mask that is not 0/1 or pads on the left, no real token).
    """
    check_positive_int("batch_size", batch_size)
    ids, mask = _check(ids, mask, 1)
    count = int(mask.sum())
    if not count:
        raise ValueError("mask leaves no real token")
    model.eval()
    reference.eval()
    same = sum(int(_agreements(model, reference, i, m)) for i, m in _batches(ids, mask, batch_size))
    return same / count

