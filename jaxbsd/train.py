"""Training and evaluation of the vision transformers (Optax + Flax NNX); checkpoints.

:func:`train` works on any model with ``model(images) -> logits`` — including one whose
``block.mlp`` was replaced by a decoupled module (the compression pipeline fine-tunes
that way); only ``nnx.Param`` variables are trained.  DeiT (``model.distilled``) is
trained with hard distillation when a teacher is given (see :mod:`jaxbsd.models.deit`).

Settings live in one frozen dataclass, :class:`TrainConfig` (names, defaults, validation);
the ``jaxbsd train`` flags are generated from its fields.  Its defaults are the paper's
(Adam, learning rate 1e-4, batch 128, no augmentation); :data:`RECIPES` holds the recipe
this project trained each (model, data set) with, the one recorded in
``experiments/results/training.json``, and :meth:`TrainConfig.recipe` picks it.

The character language model (:class:`jaxbsd.models.LM` on a :class:`jaxbsd.data.TextDataset`)
trains with :func:`train_lm` (``train`` hands text data sets to it) on next-character
cross-entropy; :func:`evaluate_lm` gives bits per character, :func:`ngram_bpc` the unigram and
bigram baselines. ``TrainConfig.steps`` stops any training after that many steps.

Reproducibility: batches come from :func:`jaxbsd.data.batches` seeded per epoch from
``seed``, stochastic-depth streams are reseeded from ``seed``, and every step is one
jitted XLA computation, so the same seed gives bit-identical parameters on CPU.

Checkpoints: :func:`save_checkpoint`, :func:`load_checkpoint` and
:func:`read_checkpoint_header` live in :mod:`jaxbsd.checkpoint` (Orbax, atomic) and are
re-exported here.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm import tqdm

from jaxbsd import data as _data
from jaxbsd.models.capture import padded_batches
from jaxbsd.checkpoint import (
    CHECKPOINT_FORMAT,
    load_checkpoint,
    read_checkpoint_header,
    save_checkpoint,
)

__all__ = [
    "TrainConfig",
    "RECIPES",
    "train",
    "evaluate",
    "predict",
    "make_optimizer",
    "random_shift",
    "train_lm",
    "evaluate_lm",
    "lm_windows_loss",
    "ngram_bpc",
    "save_checkpoint",
    "load_checkpoint",
    "read_checkpoint_header",
    "CHECKPOINT_FORMAT",
]

_SCHEDULES = ("constant", "cosine")


# ----------------------------------------------------------------------------- settings


def _field(default, help: str, **extra):
    return dataclasses.field(default=default, metadata={"help": help, **extra})


def _is_int(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def _is_number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating)) and math.isfinite(value)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Every setting of :func:`train`, validated once (``ValueError`` naming the field).

    The defaults are the paper's training setting (Adam, constant learning rate 1e-4, batch
    128, no augmentation or regularisation, 20 epochs). ``TrainConfig.recipe(model, dataset)``
    gives the recipe this project used for a (model, data set), from :data:`RECIPES`.
    ``drop_path`` is a model setting (the stochastic-depth rate the model is built with;
    None keeps the preset's); :func:`train` does not read it, whoever builds the model does
    (the CLI, the experiments).

    Example::

        cfg = TrainConfig.recipe("vit", "digits").replace(epochs=10)
        train(model, dataset, cfg)
    """

    epochs: int = _field(20, "passes over the training split")
    steps: int | None = _field(None, "stop after this many steps in all, the schedule spanning them (default: all epochs)")
    lr: float = _field(1e-4, "peak learning rate")
    batch_size: int = _field(128, "examples per step")
    seed: int = _field(0, "initialisation, shuffling, stochastic-depth and split seed")
    schedule: str = _field("constant", "learning-rate schedule", choices=_SCHEDULES)
    warmup_epochs: float = _field(0.0, "linear warm-up length of the cosine schedule, in epochs")
    weight_decay: float = _field(0.0, "AdamW decay on weight matrices (0: plain Adam, the paper's)")
    label_smoothing: float = _field(0.0, "smoothing of the one-hot targets, in [0, 1)")
    shift: int = _field(0, "augment with random translations of up to this many pixels (0: none)")
    drop_path: float | None = _field(None, "stochastic-depth rate of the model (default: the preset's)")
    eval_batch_size: int = _field(512, "images per forward pass when evaluating")

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "eval_batch_size"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.steps is not None and (not _is_int(self.steps) or self.steps < 1):
            raise ValueError(f"steps must be None or a positive int, got {self.steps!r}")
        for name in ("seed", "shift"):
            value = getattr(self, name)
            if not _is_int(value) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        if not (_is_number(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive finite number, got {self.lr!r}")
        if self.schedule not in _SCHEDULES:
            raise ValueError(f"schedule must be one of {_SCHEDULES}, got {self.schedule!r}")
        for name in ("warmup_epochs", "weight_decay"):
            value = getattr(self, name)
            if not (_is_number(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if not (_is_number(self.label_smoothing) and 0.0 <= self.label_smoothing < 1.0):
            raise ValueError(f"label_smoothing must lie in [0, 1), got {self.label_smoothing!r}")
        if self.drop_path is not None and not (_is_number(self.drop_path) and 0.0 <= self.drop_path < 1.0):
            raise ValueError(f"drop_path must be None or lie in [0, 1), got {self.drop_path!r}")

    def replace(self, **changes) -> "TrainConfig":
        """A copy with ``changes`` (validated; an unknown name is a ``ValueError``)."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ValueError(f"unknown TrainConfig fields {unknown}; expected {sorted(f.name for f in dataclasses.fields(self))}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON data."""
        return dataclasses.asdict(self)

    @classmethod
    def recipe(cls, model: str, dataset: str) -> "TrainConfig":
        """The recipe for ``model`` on ``dataset`` from :data:`RECIPES`, else the defaults."""
        return RECIPES.get((model, dataset), cls())

    def cli_args(self, base: "TrainConfig | None" = None) -> list[str]:
        """``jaxbsd train`` flags that turn ``base`` (default: ``TrainConfig()``) into this."""
        base = TrainConfig() if base is None else base
        args: list[str] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value != getattr(base, f.name) and value is not None:
                args += [f"--{f.name.replace('_', '-')}", str(value)]
        return args


def _cosine(epochs: int, warmup: float, **regularisation) -> TrainConfig:
    return TrainConfig(epochs=epochs, lr=1e-3, schedule="cosine", warmup_epochs=warmup, **regularisation)


_REGULARISED = dict(weight_decay=0.05, label_smoothing=0.1)

#: The training recipe per (model, data set): what ``jaxbsd train`` uses by default.  The
#: entries with a run in ``experiments/results/training.json`` are that run's settings (a test
#: checks them against the file); the others are the same recipe for a related data set.
RECIPES: dict[tuple[str, str], TrainConfig] = {
    # recorded in training.json
    ("vit", "digits"): _cosine(40, 2),
    ("vit", "usps"): _cosine(60, 2, drop_path=0.1, shift=1, **_REGULARISED),
    ("deit", "usps"): _cosine(40, 3, drop_path=0.1, shift=1, **_REGULARISED),
    ("vit", "fashion-mnist"): _cosine(20, 1, drop_path=0.1, **_REGULARISED),
    ("swin", "cifar10"): _cosine(20, 1, shift=2, **_REGULARISED),  # Swin's preset drop_path is 0.1
    # recorded in training_vit_cifar10.json (72.07 %; the paper trains 200 epochs for 75.47 %)
    ("vit", "cifar10"): _cosine(60, 1, drop_path=0.1, shift=2, **_REGULARISED),
    # recorded in training_lm_pystdlib.json: the character LM (train_lm; an epoch is one pass over
    # the train modules in windows of the model's 128 characters, 1,807 steps of 16 windows; the
    # 400 steps, 0.22 of an epoch, are what ~15 minutes of the shared 2-core CPU allow)
    ("lm", "pystdlib"): TrainConfig(epochs=1, steps=400, lr=3e-3, batch_size=16, schedule="cosine",
                                    warmup_epochs=0.01, weight_decay=0.1, eval_batch_size=64),
    # not trained for training.json; used by the experiments when no checkpoint exists
    ("vit", "mnist"): _cosine(20, 1, drop_path=0.1, shift=1, **_REGULARISED),
    ("swin", "fashion-mnist"): _cosine(20, 1, **_REGULARISED),
}


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


@nnx.jit
def _eval_step(model, x, y, valid):
    pred = jnp.argmax(model(x), axis=-1)
    return jnp.sum((pred == y) & valid)


@nnx.jit
def _logits_step(model, x):
    return model(x)


def _check_arrays(images, labels) -> None:
    if getattr(images, "ndim", None) != 4:
        raise ValueError(f"images must have shape (N, H, W, C), got {getattr(images, 'shape', None)}")
    if labels is not None and (getattr(labels, "ndim", None) != 1 or labels.shape[0] != images.shape[0]):
        raise ValueError(
            f"labels must have shape ({images.shape[0]},), got {getattr(labels, 'shape', None)}"
        )
    if images.shape[0] == 0:
        raise ValueError("images must hold at least one example")


def _check_positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def predict(model, images, batch_size: int = 512) -> np.ndarray:
    """Logits ``(N, classes)`` of ``model`` (put in eval mode) on ``(N, H, W, C)`` images."""
    _check_arrays(images, None)
    _check_positive_int("batch_size", batch_size)
    model.eval()
    out = [
        np.asarray(_logits_step(model, jnp.asarray(chunk)))[:valid]
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
    _check_arrays(images, labels)
    _check_positive_int("batch_size", batch_size)
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


# ----------------------------------------------------------------------------- training


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
    if schedule not in _SCHEDULES:
        raise ValueError(f"schedule must be one of {_SCHEDULES}, got {schedule!r}")
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


def _epoch_seed(seed: int, epoch: int) -> int:
    # Distinct, reproducible shuffles per (seed, epoch); SeedSequence mixes the pair well.
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


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
    if config is None:
        config = TrainConfig()
    elif not isinstance(config, TrainConfig):
        raise ValueError(f"config must be a TrainConfig, got {type(config).__name__}")
    if settings:
        config = config.replace(**settings)
    for name in ("train_images", "train_labels", "test_images", "test_labels"):
        if not hasattr(dataset, name):
            raise ValueError(f"dataset must be a jaxbsd.data.Dataset, missing {name!r}")
    if teacher is not None and not getattr(model, "distilled", False):
        raise ValueError("teacher is only used by distilled models (DeiT); got a teacher for "
                         f"{type(model).__name__}")
    epochs, batch_size, seed, shift = config.epochs, config.batch_size, int(config.seed), int(config.shift)
    eval_batch_size, label_smoothing = config.eval_batch_size, config.label_smoothing
    images, labels = dataset.train_images, np.asarray(dataset.train_labels, np.int32)
    _check_arrays(images, labels)
    n = images.shape[0]
    batch = min(batch_size, n)
    steps_per_epoch = n // batch

    per_batch_teacher = teacher is not None and shift > 0
    if teacher is not None:
        teacher.eval()
    if teacher is not None and not per_batch_teacher:
        # The teacher is fixed and there is no augmentation, so its hard labels are
        # computed once instead of once per step.
        teacher_labels = np.argmax(predict(teacher, images, eval_batch_size), axis=-1).astype(np.int32)
    else:
        teacher_labels = labels
    targets = np.stack([labels, teacher_labels], axis=1)  # (N, 2): label, distillation target

    total_steps = epochs * steps_per_epoch if config.steps is None else min(config.steps, epochs * steps_per_epoch)
    epochs = -(-total_steps // steps_per_epoch)  # the epochs that ``steps`` reaches into
    optimizer = make_optimizer(
        model, lr=config.lr, schedule=config.schedule, total_steps=total_steps,
        warmup_steps=int(round(config.warmup_epochs * steps_per_epoch)), weight_decay=config.weight_decay,
    )
    nnx.reseed(model, dropout=seed)
    # cached_partial clones the module graph (sharing its Variables), freezing static
    # attributes such as ``deterministic``: switch to train mode *before* caching.  The
    # original model can then go to eval mode for evaluation without affecting the step.
    model.train()
    step = nnx.cached_partial(_train_step, model, optimizer)
    recorded = {**config.to_dict(), "batch_size": batch, "teacher": teacher is not None}
    history: list[dict[str, Any]] = []
    for epoch in range(1, epochs + 1):
        start = time.perf_counter()
        loss_sum = jnp.zeros((), jnp.float32)
        correct = jnp.zeros((), jnp.int32)
        seen = 0
        bar = tqdm(
            total=steps_per_epoch, desc=f"epoch {epoch}/{epochs}", disable=not progress, file=sys.stderr,
            mininterval=0.5 if sys.stderr.isatty() else 30.0, leave=False,
        )
        augment_rng = np.random.default_rng(_epoch_seed(seed + 1, epoch))
        # Steps are dispatched asynchronously; to show progress, wait for the previous step
        # (one stays in flight, so preparing the next batch overlaps the running one) and
        # then advance the bar: it counts finished batches, not dispatched ones.
        track = progress or on_step is not None
        pending = None
        done = 0

        def finished(loss_value):
            nonlocal done
            loss_value.block_until_ready()
            done += 1
            bar.update(1)
            if progress and (done % 20 == 0 or done == steps_per_epoch):
                bar.set_postfix(loss=f"{float(loss_sum) / seen:.4f}", acc=f"{int(correct) / seen:.4f}")
            if on_step is not None:
                on_step(epoch, done)

        epoch_steps = min(steps_per_epoch, total_steps - (epoch - 1) * steps_per_epoch)
        for i, (x, t) in enumerate(_data.batches(images, targets, batch, seed=_epoch_seed(seed, epoch), drop_last=True)):
            if i == epoch_steps:  # ``steps`` ends training inside this epoch
                break
            x = jnp.asarray(random_shift(x, shift, augment_rng))
            y_dist = jnp.asarray(t[:, 1])
            if per_batch_teacher:  # the teacher labels the augmented images it is shown
                y_dist = jnp.argmax(_logits_step(teacher, x), axis=-1).astype(jnp.int32)
            loss, c = step(x, jnp.asarray(t[:, 0]), y_dist, float(label_smoothing))
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
        test_acc = evaluate(model, dataset.test_images, dataset.test_labels, eval_batch_size)
        record = {
            "epoch": epoch,
            "loss": float(loss_sum) / max(seen, 1),
            "train_acc": int(correct) / max(seen, 1),
            "test_acc": test_acc,
            "seconds": time.perf_counter() - start,
        }
        if not math.isfinite(record["loss"]):
            raise FloatingPointError(f"training loss became {record['loss']} in epoch {epoch}")
        history.append(record)
        if progress and on_epoch is None:
            print(
                f"epoch {epoch:3d}/{epochs}  loss {record['loss']:.4f}  train {record['train_acc']:.4f}"
                f"  test {test_acc:.4f}  ({record['seconds']:.1f} s)",
                file=sys.stderr, flush=True,
            )
        if checkpoint is not None:
            save_checkpoint(checkpoint, model, {**(metadata or {}), "history": history, "train": recorded})
        if on_epoch is not None:
            on_epoch(record)
    model.eval()
    return history


# ----------------------------------------------------------------------------- language model

_LN2 = math.log(2.0)


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
def _lm_train_step(model, optimizer, windows):
    loss, grads = nnx.value_and_grad(lm_windows_loss)(model, windows)
    optimizer.update(model, grads)
    return loss


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
    _check_positive_int("batch_size", batch_size)
    context = model.config.context if context is None else context
    windows, mask = _data.eval_windows(np.asarray(ids), context, stride)
    model.eval()
    total = 0.0
    for start, valid, chunk in padded_batches(windows.astype(np.int32), batch_size):
        m = np.zeros((chunk.shape[0], context), bool)
        m[:valid] = mask[start : start + valid]
        total += float(_lm_eval_step(model, jnp.asarray(chunk), jnp.asarray(m)))
    bpc = total / int(mask.sum()) / _LN2
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
    _check_positive_int("vocab_size", vocab_size)
    if not (_is_number(alpha) and alpha > 0):
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
    if config is None:
        config = TrainConfig()
    elif not isinstance(config, TrainConfig):
        raise ValueError(f"config must be a TrainConfig, got {type(config).__name__}")
    if settings:
        config = config.replace(**settings)
    if not isinstance(dataset, _data.TextDataset):
        raise ValueError(f"dataset must be a jaxbsd.data.TextDataset, got {type(dataset).__name__}")
    for name, default in (("label_smoothing", 0.0), ("shift", 0), ("drop_path", None)):
        if getattr(config, name) != default:
            raise ValueError(f"{name} is an image setting; a language model takes {default!r}, "
                             f"got {getattr(config, name)!r}")
    context = getattr(getattr(model, "config", None), "context", None)
    if not _is_int(context):
        raise ValueError(f"model must have config.context (an LM), got {type(model).__name__}")
    vocab_size = getattr(model.config, "vocab_size", None)
    if vocab_size != dataset.vocab.size:
        raise ValueError(f"model vocab_size ({vocab_size}) must equal the dataset's ({dataset.vocab.size})")
    epochs, seed = config.epochs, int(config.seed)
    windows_per_epoch = (len(dataset.train) - context) // context  # at any offset < context
    if windows_per_epoch < 1:
        raise ValueError(f"the train split ({len(dataset.train)} ids) is shorter than two windows of "
                         f"context {context}")
    batch = min(config.batch_size, windows_per_epoch)
    steps_per_epoch = windows_per_epoch // batch
    if len(dataset.validation) < 2:
        raise ValueError("the validation split must hold at least 2 ids")

    total_steps = epochs * steps_per_epoch if config.steps is None else min(config.steps, epochs * steps_per_epoch)
    epochs = -(-total_steps // steps_per_epoch)  # the epochs that ``steps`` reaches into
    optimizer = make_optimizer(
        model, lr=config.lr, schedule=config.schedule, total_steps=total_steps,
        warmup_steps=int(round(config.warmup_epochs * steps_per_epoch)), weight_decay=config.weight_decay,
    )
    model.train()
    step = nnx.cached_partial(_lm_train_step, model, optimizer)
    history: list[dict[str, Any]] = []
    recorded = {**config.to_dict(), "batch_size": batch, "context": context}
    for epoch in range(1, epochs + 1):
        start = time.perf_counter()
        rng = np.random.default_rng(_epoch_seed(seed, epoch))
        windows = _data.text_windows(dataset.train, context, offset=int(rng.integers(context)))
        windows = windows[:windows_per_epoch].astype(np.int32)
        bar = tqdm(total=steps_per_epoch, desc=f"epoch {epoch}/{epochs}", disable=not progress, file=sys.stderr,
                   mininterval=0.5 if sys.stderr.isatty() else 30.0, leave=False)
        loss_sum = jnp.zeros((), jnp.float32)
        pending, done = None, 0
        order = np.arange(len(windows))
        epoch_steps = min(steps_per_epoch, total_steps - (epoch - 1) * steps_per_epoch)
        for i, (x, _) in enumerate(_data.batches(windows, order, batch, seed=_epoch_seed(seed + 1, epoch),
                                                 drop_last=True)):
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
        bar.close()
        mean_loss = float(loss_sum) / max(done, 1)
        if not math.isfinite(mean_loss):
            raise FloatingPointError(f"training loss became {mean_loss} in epoch {epoch}")
        val_bpc = evaluate_lm(model, dataset.validation, batch_size=config.eval_batch_size)
        model.train()
        record = {"epoch": epoch, "loss": mean_loss, "train_bpc": mean_loss / _LN2, "val_bpc": val_bpc,
                  "steps": done, "seconds": time.perf_counter() - start}
        history.append(record)
        if progress and on_epoch is None:
            print(f"epoch {epoch:3d}/{epochs}  loss {mean_loss:.4f}  train {record['train_bpc']:.4f} bpc"
                  f"  validation {val_bpc:.4f} bpc  ({record['seconds']:.1f} s)", file=sys.stderr, flush=True)
        if checkpoint is not None:
            save_checkpoint(checkpoint, model, {**(metadata or {}), "history": history, "train": recorded})
        if on_epoch is not None:
            on_epoch(record)
    model.eval()
    return history
