"""Steps the training loops share: per-epoch seeds, the step budget, the progress bar, the end of an epoch."""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

import numpy as np
from tqdm import tqdm

from jaxbsd.checkpoint import save_checkpoint
from jaxbsd.training.recipes import TrainConfig

__all__ = ["epoch_seed", "step_budget", "progress_bar", "end_epoch"]


def epoch_seed(seed: int, epoch: int) -> int:
    """A seed for ``(seed, epoch)``: distinct, reproducible shuffles per epoch (``SeedSequence`` mixes
    the pair)."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


def step_budget(config: TrainConfig, steps_per_epoch: int) -> tuple[int, int]:
    """``(total_steps, epochs)``: all ``config.epochs`` of ``steps_per_epoch`` steps, or ``config.steps``
    if fewer, and the epochs those steps reach into (the last one then partial)."""
    epochs = config.epochs
    total_steps = epochs * steps_per_epoch if config.steps is None else min(config.steps, epochs * steps_per_epoch)
    return total_steps, -(-total_steps // steps_per_epoch)


def progress_bar(total: int, epoch: int, epochs: int, progress: bool) -> tqdm:
    """The tqdm bar of one epoch, on stderr (disabled without ``progress``)."""
    return tqdm(
        total=total, desc=f"epoch {epoch}/{epochs}", disable=not progress, file=sys.stderr,
        mininterval=0.5 if sys.stderr.isatty() else 30.0, leave=False,
    )


def end_epoch(model, record: dict[str, Any], history: list[dict[str, Any]], line: str, *, progress: bool,
              checkpoint: str | os.PathLike | None, metadata: dict | None, recorded: dict[str, Any],
              on_epoch: Callable[[dict[str, Any]], None] | None) -> None:
    """Append ``record`` to ``history``; print ``line`` (with ``progress`` and no ``on_epoch``); save the
    checkpoint (``metadata`` plus the history and the settings ``recorded``); call ``on_epoch``."""
    history.append(record)
    if progress and on_epoch is None:
        print(line, file=sys.stderr, flush=True)
    if checkpoint is not None:
        save_checkpoint(checkpoint, model, {**(metadata or {}), "history": history, "train": recorded})
    if on_epoch is not None:
        on_epoch(record)
