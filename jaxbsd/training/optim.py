"""Optimizers of the training loops: Adam(W) on a model's ``nnx.Param`` variables, with schedules."""

from __future__ import annotations

import functools
import math

import jax
import optax
from flax import nnx

from jaxbsd.training.recipes import SCHEDULES, TrainConfig

__all__ = ["make_optimizer", "optimizer_for"]


def make_optimizer(model, *, lr: float = 1e-4, schedule: str = "constant", total_steps: int = 1,
                   warmup_steps: int = 0, weight_decay: float = 0.0) -> nnx.Optimizer:
    """Adam on the model's ``nnx.Param`` variables.

    ``schedule="constant"`` is the paper's setting; ``"cosine"`` warms up linearly over
    ``warmup_steps`` and decays to 0 at ``total_steps`` (used to reach the paper's
    accuracies in fewer epochs on CPU).  ``weight_decay > 0`` gives AdamW (decoupled
    decay) on the matrices only (parameters with ndim ≥ 2), not on biases, norms or
    position tables of rank < 2.
    """
    if not (isinstance(weight_decay, (int, float)) and math.isfinite(weight_decay) and weight_decay >= 0):
        raise ValueError(f"weight_decay must be a finite number >= 0, got {weight_decay!r}")
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a positive finite number, got {lr!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    total_steps = max(int(total_steps), 1)
    warmup = min(max(int(warmup_steps), 0), total_steps - 1) if schedule == "cosine" else 0
    tx = _adam(float(lr), schedule, total_steps, warmup, float(weight_decay))
    return nnx.Optimizer(model, tx, wrt=nnx.Param)


def _matrices(params):
    return jax.tree.map(lambda p: p.ndim >= 2, params)


@functools.lru_cache(maxsize=64)
def _adam(lr: float, schedule: str, total_steps: int, warmup: int,
          weight_decay: float = 0.0) -> optax.GradientTransformation:
    # The transformation is a static part of the optimizer's graph, so jitted steps are
    # cached per transformation object: reusing it for equal settings avoids a recompile
    # on every call of train() (the compression pipeline fine-tunes many times).
    if schedule == "cosine":
        rate = optax.warmup_cosine_decay_schedule(
            init_value=0.0 if warmup else lr, peak_value=lr, warmup_steps=warmup,
            decay_steps=total_steps, end_value=0.0,
        )
    else:
        rate = lr
    if weight_decay:
        return optax.adamw(rate, weight_decay=weight_decay, mask=_matrices)
    return optax.adam(rate)


def optimizer_for(model, config: TrainConfig, total_steps: int, steps_per_epoch: int) -> nnx.Optimizer:
    """:func:`make_optimizer` with ``config``'s learning rate, schedule and weight decay, over
    ``total_steps``, warming up for ``config.warmup_epochs`` epochs of ``steps_per_epoch``."""
    return make_optimizer(
        model, lr=config.lr, schedule=config.schedule, total_steps=total_steps,
        warmup_steps=int(round(config.warmup_epochs * steps_per_epoch)), weight_decay=config.weight_decay,
    )
