"""Training of the character language model: :func:`train_lm` (next-character cross-entropy).

:class:`jaxbsd.models.LM` on a :class:`jaxbsd.data.TextDataset`; the loss is
:func:`jaxbsd.evaluation.perplexity.lm_windows_loss`, and each epoch ends with
:func:`jaxbsd.evaluation.perplexity.evaluate_lm` on the validation modules.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, Callable

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxbsd import data as _data
from jaxbsd.evaluation.checks import is_int
from jaxbsd.evaluation.perplexity import LN2, evaluate_lm, lm_windows_loss
from jaxbsd.training.loop import end_epoch, epoch_seed, progress_bar, step_budget
from jaxbsd.training.optim import optimizer_for
from jaxbsd.training.recipes import TrainConfig, resolve_config

__all__ = ["train_lm"]


@nnx.jit
def _lm_train_step(model, optimizer, windows):
    loss, grads = nnx.value_and_grad(lm_windows_loss)(model, windows)
    optimizer.update(model, grads)
    return loss


def train_lm(
    model,
    dataset,
    config: TrainConfig | None = None,
    *,
    progress: bool = True,
    checkpoint: str | os.PathLike | None = None,
    metadata: dict | None = None,
    on_epoch: Callable[[dict[str, Any]], None] | None = None,
    on_step: Callable[[int, int], None] | None = None,
    **settings,
) -> list[dict[str, Any]]:
    """Train a language model in place on a :class:`jaxbsd.data.TextDataset`, next-character
    cross-entropy, Adam(W); evaluate bits per character on the validation modules each epoch.

    An epoch is one pass over the train stream in non-overlapping windows of
    ``model.config.context + 1`` ids (:func:`jaxbsd.data.text_windows`) starting at a random
    offset in ``[0, context)`` drawn per epoch, shuffled, ``batch_size`` windows a step, the last
    incomplete batch dropped: every train character is a target about once per epoch.

    ``config`` is a :class:`TrainConfig`: ``epochs``, ``steps``, ``lr``, ``batch_size``, ``seed``,
    ``schedule``, ``warmup_epochs``, ``weight_decay`` (AdamW on matrices: the embedding too) and
    ``eval_batch_size`` apply; ``label_smoothing``, ``shift`` and ``drop_path`` are image
    settings and must keep their defaults (``ValueError`` otherwise). The same seed gives the
    same parameters on the same machine.

    Returns:
        One dict per epoch: ``epoch``, ``loss`` (mean training cross-entropy, nats), ``train_bpc``
        (that loss in bits), ``val_bpc`` (:func:`evaluate_lm` on ``dataset.validation``),
        ``steps``, ``seconds``. The test split is not touched.
    """
    config = resolve_config(config, settings)
    context, windows_per_epoch, batch, steps_per_epoch = _plan_lm(model, dataset, config)
    seed = int(config.seed)
    total_steps, epochs = step_budget(config, steps_per_epoch)
    optimizer = optimizer_for(model, config, total_steps, steps_per_epoch)
    model.train()
    step = nnx.cached_partial(_lm_train_step, model, optimizer)
    history: list[dict[str, Any]] = []
    recorded = {**config.to_dict(), "batch_size": batch, "context": context}
    for epoch in range(1, epochs + 1):
        start = time.perf_counter()
        rng = np.random.default_rng(epoch_seed(seed, epoch))
        windows = _data.text_windows(dataset.train, context, offset=int(rng.integers(context)))
        windows = windows[:windows_per_epoch].astype(np.int32)
        bar = progress_bar(steps_per_epoch, epoch, epochs, progress)
        epoch_steps = min(steps_per_epoch, total_steps - (epoch - 1) * steps_per_epoch)
        loss_sum, done = _lm_epoch(step, windows, batch, epoch_seed(seed + 1, epoch), epoch_steps, bar,
                                   epoch, on_step)
        bar.close()
        mean_loss = float(loss_sum) / max(done, 1)
        if not math.isfinite(mean_loss):
            raise FloatingPointError(f"training loss became {mean_loss} in epoch {epoch}")
        val_bpc = evaluate_lm(model, dataset.validation, batch_size=config.eval_batch_size)
        model.train()
        record = {"epoch": epoch, "loss": mean_loss, "train_bpc": mean_loss / LN2, "val_bpc": val_bpc,
                  "steps": done, "seconds": time.perf_counter() - start}
        line = (f"epoch {epoch:3d}/{epochs}  loss {mean_loss:.4f}  train {record['train_bpc']:.4f} bpc"
                f"  validation {val_bpc:.4f} bpc  ({record['seconds']:.1f} s)")
        end_epoch(model, record, history, line, progress=progress, checkpoint=checkpoint, metadata=metadata,
                  recorded=recorded, on_epoch=on_epoch)
    model.eval()
    return history


def _plan_lm(model, dataset, config: TrainConfig) -> tuple[int, int, int, int]:
    """Check the arguments; ``(context, windows_per_epoch, batch, steps_per_epoch)``."""
    if not isinstance(dataset, _data.TextDataset):
        raise ValueError(f"dataset must be a jaxbsd.data.TextDataset, got {type(dataset).__name__}")
    for name, default in (("label_smoothing", 0.0), ("shift", 0), ("drop_path", None)):
        if getattr(config, name) != default:
            raise ValueError(f"{name} is an image setting; a language model takes {default!r}, "
                             f"got {getattr(config, name)!r}")
    context = getattr(getattr(model, "config", None), "context", None)
    if not is_int(context):
        raise ValueError(f"model must have config.context (an LM), got {type(model).__name__}")
    vocab_size = getattr(model.config, "vocab_size", None)
    if vocab_size != dataset.vocab.size:
        raise ValueError(f"model vocab_size ({vocab_size}) must equal the dataset's ({dataset.vocab.size})")
    windows_per_epoch = (len(dataset.train) - context) // context  # at any offset < context
    if windows_per_epoch < 1:
        raise ValueError(f"the train split ({len(dataset.train)} ids) is shorter than two windows of "
                         f"context {context}")
    batch = min(config.batch_size, windows_per_epoch)
    steps_per_epoch = windows_per_epoch // batch
    if len(dataset.validation) < 2:
        raise ValueError("the validation split must hold at least 2 ids")
    return context, windows_per_epoch, batch, steps_per_epoch


def _lm_epoch(step, windows: np.ndarray, batch: int, shuffle_seed: int, epoch_steps: int, bar, epoch: int,
              on_step: Callable[[int, int], None] | None):
    """Epoch ``epoch``'s first ``epoch_steps`` steps over ``windows`` shuffled by ``shuffle_seed``:
    ``(loss_sum, steps done)``, ``loss_sum`` a device scalar. ``on_step(epoch, done)`` follows every
    finished step."""
    loss_sum = jnp.zeros((), jnp.float32)
    pending, done = None, 0
    order = np.arange(len(windows))
    for i, (x, _) in enumerate(_data.batches(windows, order, batch, seed=shuffle_seed, drop_last=True)):
        if i == epoch_steps:  # ``steps`` ends training inside this epoch
            break
        loss = step(jnp.asarray(x))
        loss_sum = loss_sum + loss
        # One step stays in flight while the next batch is prepared; count finished ones.
        if pending is not None:
            pending.block_until_ready()
            done += 1
            bar.update(1)
            if on_step is not None:
                on_step(epoch, done)
        pending = loss
    if pending is not None:
        pending.block_until_ready()
        done += 1
        bar.update(1)
        if on_step is not None:
            on_step(epoch, done)
    return loss_sum, done
