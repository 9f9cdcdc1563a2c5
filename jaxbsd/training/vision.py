"""Training of the image models (Optax + Flax NNX): :func:`train`.

:func:`train` works on any model with ``model(images) -> logits``, including one whose
``block.mlp`` was replaced by a decoupled module (the compression pipeline fine-tunes that way);
only ``nnx.Param`` variables are trained.  DeiT (``model.distilled``) is trained with hard
distillation when a teacher is given (see :mod:`jaxbsd.models.deit.modeling`).  A
:class:`jaxbsd.data.TextDataset` is handed to :func:`jaxbsd.training.lm.train_lm`.

Reproducibility: batches come from :func:`jaxbsd.data.batches` seeded per epoch from ``seed``,
stochastic-depth streams are reseeded from ``seed``, and every step is one jitted XLA
computation, so the same seed gives bit-identical parameters on CPU.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxbsd import data as _data
from jaxbsd.evaluation.accuracy import evaluate, logits_step, predict
from jaxbsd.evaluation.checks import check_images
from jaxbsd.training.lm import train_lm
from jaxbsd.training.loop import end_epoch, epoch_seed, progress_bar, step_budget
from jaxbsd.training.optim import optimizer_for
from jaxbsd.training.recipes import TrainConfig, resolve_config

__all__ = ["train", "random_shift"]


# ----------------------------------------------------------------------------- steps


def _cross_entropy(logits: jax.Array, labels: jax.Array, smoothing: float = 0.0) -> jax.Array:
    if smoothing:
        targets = optax.smooth_labels(jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype), smoothing)
        return optax.softmax_cross_entropy(logits, targets).mean()
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def _loss_and_logits(model, x, y, y_dist, smoothing=0.0):
    """Mean loss and the logits used for accuracy.

    A distilled model (DeiT) returns its two heads: the class head learns the labels, the
    distillation head the teacher's hard predictions ``y_dist`` (= ``y`` without teacher).
    """
    if getattr(model, "distilled", False):
        cls_logits, dist_logits = model.heads(x)
        loss = 0.5 * _cross_entropy(cls_logits, y, smoothing) + 0.5 * _cross_entropy(dist_logits, y_dist, smoothing)
        return loss, 0.5 * (cls_logits + dist_logits)
    logits = model(x)
    return _cross_entropy(logits, y, smoothing), logits


@nnx.jit(static_argnums=5)
def _train_step(model, optimizer, x, y, y_dist, smoothing):
    def loss_fn(model):
        return _loss_and_logits(model, x, y, y_dist, smoothing)

    # nnx.value_and_grad differentiates w.r.t. nnx.Param only; RNG counters and other
    # variables are updated in place but never trained.
    (loss, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    optimizer.update(model, grads)
    correct = jnp.sum(jnp.argmax(logits, axis=-1) == y)
    return loss, correct


def random_shift(images: np.ndarray, max_shift: int, rng: np.random.Generator) -> np.ndarray:
    """Translate each image by a random (dy, dx) in [-max_shift, max_shift]², edge-padded.

    ``(B, H, W, C) -> (B, H, W, C)``, vectorised with one gather (no loop over images).
    """
    if max_shift == 0:
        return images
    b, h, w, _ = images.shape
    k = int(max_shift)
    padded = np.pad(images, ((0, 0), (k, k), (k, k), (0, 0)), mode="edge")
    dy, dx = rng.integers(0, 2 * k + 1, size=(2, b))
    rows = dy[:, None] + np.arange(h)[None, :]  # (B, H)
    cols = dx[:, None] + np.arange(w)[None, :]  # (B, W)
    return padded[np.arange(b)[:, None, None], rows[:, :, None], cols[:, None, :]]


# ----------------------------------------------------------------------------- training


def train(
    model,
    dataset,
    config: TrainConfig | None = None,
    *,
    teacher=None,
    progress: bool = True,
    checkpoint: str | os.PathLike | None = None,
    metadata: dict | None = None,
    on_epoch: Callable[[dict[str, Any]], None] | None = None,
    on_step: Callable[[int, int], None] | None = None,
    **settings,
) -> list[dict[str, Any]]:
    """Train ``model`` in place on ``dataset`` with Adam; evaluate on the test split each epoch.

    Args:
        model: a ViT/Swin/DeiT (possibly with replaced MLPs); trained in place, left in
            eval mode.
        dataset: a :class:`jaxbsd.data.Dataset`.
        config: the settings (default ``TrainConfig()``, the paper's); see
            :class:`TrainConfig` for each field.  The last incomplete batch of an epoch is
            dropped, a different one each epoch.  With ``steps``, training stops after that
            many steps (the last epoch is then partial, and evaluated as usual).
        teacher: for a distilled model (DeiT), a model whose argmax predictions on the
            training images are the distillation head's targets (hard distillation).
        progress: show a tqdm bar per epoch, advanced after every batch, with running loss
            and accuracy.
        checkpoint: if given, :func:`save_checkpoint` there after every epoch, with
            ``metadata`` plus the history and the training settings.
        metadata: extra JSON-serialisable data for the checkpoint.
        on_epoch: called with each epoch's record as soon as it is complete (e.g. to log).
        on_step: called as ``on_step(epoch, batches_done)`` after every training step.
        **settings: :class:`TrainConfig` fields (``epochs=``, ``lr=``, ...), overriding
            ``config``'s.

    Returns:
        One dict per epoch: ``epoch``, ``loss`` (mean training loss), ``train_acc``,
        ``test_acc`` (fractions), ``seconds`` (wall time of the epoch incl. evaluation).

    Raises:
        ValueError: a bad setting (naming it), a dataset that is not a ``Dataset``, or a
            teacher for a model that is not distilled.

    A :class:`jaxbsd.data.TextDataset` is passed on to :func:`train_lm` (a language model).
    """
    if isinstance(dataset, _data.TextDataset):  # a language model: next-character training
        if teacher is not None:
            raise ValueError("teacher is only used by distilled models (DeiT), not language models")
        return train_lm(model, dataset, config, progress=progress, checkpoint=checkpoint, metadata=metadata,
                        on_epoch=on_epoch, on_step=on_step, **settings)
    config = resolve_config(config, settings)
    run = _plan(model, dataset, config, teacher, progress, on_step)
    optimizer = optimizer_for(model, config, run.total_steps, run.steps_per_epoch)
    nnx.reseed(model, dropout=run.seed)
    # cached_partial clones the module graph (sharing its Variables), freezing static
    # attributes such as ``deterministic``: switch to train mode *before* caching.  The
    # original model can then go to eval mode for evaluation without affecting the step.
    model.train()
    step = nnx.cached_partial(_train_step, model, optimizer)
    recorded = {**config.to_dict(), "batch_size": run.batch, "teacher": teacher is not None}
    history: list[dict[str, Any]] = []
    for epoch in range(1, run.epochs + 1):
        start = time.perf_counter()
        loss_sum, correct, seen = _train_epoch(run, step, epoch)
        test_acc = evaluate(model, dataset.test_images, dataset.test_labels, config.eval_batch_size)
        record = {
            "epoch": epoch,
            "loss": float(loss_sum) / max(seen, 1),
            "train_acc": int(correct) / max(seen, 1),
            "test_acc": test_acc,
            "seconds": time.perf_counter() - start,
        }
        if not math.isfinite(record["loss"]):
            raise FloatingPointError(f"training loss became {record['loss']} in epoch {epoch}")
        line = (f"epoch {epoch:3d}/{run.epochs}  loss {record['loss']:.4f}  train {record['train_acc']:.4f}"
                f"  test {test_acc:.4f}  ({record['seconds']:.1f} s)")
        end_epoch(model, record, history, line, progress=progress, checkpoint=checkpoint, metadata=metadata,
                  recorded=recorded, on_epoch=on_epoch)
    model.eval()
    return history


@dataclasses.dataclass(frozen=True)
class _Run:
    """What every epoch of :func:`train` reads: the data, the batching, the step budget, the options."""

    images: np.ndarray
    targets: np.ndarray  # (N, 2): label, distillation target
    batch: int
    steps_per_epoch: int
    total_steps: int
    epochs: int
    seed: int
    shift: int
    label_smoothing: float
    teacher: Any  # the teacher that labels each augmented batch, or None
    progress: bool
    on_step: Callable[[int, int], None] | None


def _plan(model, dataset, config: TrainConfig, teacher, progress: bool, on_step) -> _Run:
    """Check the arguments and fix the data, the batching and the step budget of a run."""
    for name in ("train_images", "train_labels", "test_images", "test_labels"):
        if not hasattr(dataset, name):
            raise ValueError(f"dataset must be a jaxbsd.data.Dataset, missing {name!r}")
    if teacher is not None and not getattr(model, "distilled", False):
        raise ValueError("teacher is only used by distilled models (DeiT); got a teacher for "
                         f"{type(model).__name__}")
    images, labels = dataset.train_images, np.asarray(dataset.train_labels, np.int32)
    check_images(images, labels)
    n = images.shape[0]
    batch = min(config.batch_size, n)
    steps_per_epoch = n // batch
    shift = int(config.shift)
    per_batch_teacher = teacher is not None and shift > 0
    targets = _distillation_targets(images, labels, teacher, per_batch_teacher, config.eval_batch_size)
    total_steps, epochs = step_budget(config, steps_per_epoch)
    return _Run(images=images, targets=targets, batch=batch, steps_per_epoch=steps_per_epoch,
                total_steps=total_steps, epochs=epochs, seed=int(config.seed), shift=shift,
                label_smoothing=config.label_smoothing, teacher=teacher if per_batch_teacher else None,
                progress=progress, on_step=on_step)


def _distillation_targets(images, labels, teacher, per_batch_teacher: bool, eval_batch_size: int) -> np.ndarray:
    """``(N, 2)`` int32: each image's label and its distillation target (the label without a teacher;
    a per-batch teacher labels the augmented images in the step instead)."""
    if teacher is not None:
        teacher.eval()
    if teacher is not None and not per_batch_teacher:
        # The teacher is fixed and there is no augmentation, so its hard labels are
        # computed once instead of once per step.
        teacher_labels = np.argmax(predict(teacher, images, eval_batch_size), axis=-1).astype(np.int32)
    else:
        teacher_labels = labels
    return np.stack([labels, teacher_labels], axis=1)


def _train_epoch(run: _Run, step, epoch: int):
    """One epoch's steps: ``(loss_sum, correct, seen)``, the summed loss and correct predictions over
    the ``seen`` training examples (device scalars, read once at the end of the epoch)."""
    loss_sum = jnp.zeros((), jnp.float32)
    correct = jnp.zeros((), jnp.int32)
    seen = 0
    bar = progress_bar(run.steps_per_epoch, epoch, run.epochs, run.progress)
    augment_rng = np.random.default_rng(epoch_seed(run.seed + 1, epoch))
    # Steps are dispatched asynchronously; to show progress, wait for the previous step
    # (one stays in flight, so preparing the next batch overlaps the running one) and
    # then advance the bar: it counts finished batches, not dispatched ones.
    track = run.progress or run.on_step is not None
    pending = None
    done = 0

    def finished(loss_value):
        nonlocal done
        loss_value.block_until_ready()
        done += 1
        bar.update(1)
        if run.progress and (done % 20 == 0 or done == run.steps_per_epoch):
            bar.set_postfix(loss=f"{float(loss_sum) / seen:.4f}", acc=f"{int(correct) / seen:.4f}")
        if run.on_step is not None:
            run.on_step(epoch, done)

    epoch_steps = min(run.steps_per_epoch, run.total_steps - (epoch - 1) * run.steps_per_epoch)
    batches = _data.batches(run.images, run.targets, run.batch, seed=epoch_seed(run.seed, epoch), drop_last=True)
    for i, (x, t) in enumerate(batches):
        if i == epoch_steps:  # ``steps`` ends training inside this epoch
            break
        x = jnp.asarray(random_shift(x, run.shift, augment_rng))
        y_dist = jnp.asarray(t[:, 1])
        if run.teacher is not None:  # the teacher labels the augmented images it is shown
            y_dist = jnp.argmax(logits_step(run.teacher, x), axis=-1).astype(jnp.int32)
        loss, c = step(x, jnp.asarray(t[:, 0]), y_dist, float(run.label_smoothing))
        loss_sum = loss_sum + loss * x.shape[0]
        correct = correct + c
        seen += x.shape[0]
        if track:
            if pending is not None:
                finished(pending)
            pending = loss
    if track and pending is not None:
        finished(pending)
    bar.close()
    return loss_sum, correct, seen
