"""Training, evaluation and checkpoints for the vision transformers (Optax + Flax NNX).

Training (paper appendix tables): Adam, learning rate 1e-4, batch 128, no augmentation.
:func:`train` works on any model with ``model(images) -> logits`` — including one whose
``block.mlp`` was replaced by a decoupled module (the compression pipeline fine-tunes
that way); only ``nnx.Param`` variables are trained.  DeiT (``model.distilled``) is
trained with hard distillation when a teacher is given (see :mod:`jaxbsd.models.deit`).

Reproducibility: batches come from :func:`jaxbsd.data.batches` seeded per epoch from
``seed``, stochastic-depth streams are reseeded from ``seed``, and every step is one
jitted XLA computation, so the same seed gives bit-identical parameters on CPU.

Checkpoints: one ``.npz`` file per model.  Each variable of ``nnx.state(model)`` is a
numpy array under its dotted path (``blocks.0.mlp.fc1.kernel``; PRNG keys as their raw
key data), and a ``__header__`` entry holds JSON: format version, model kind and config
(so :func:`load_checkpoint` can rebuild the model), caller metadata, the variable
table (type, shape, dtype) and a SHA-256 over names, dtypes, shapes and bytes.  It is
written to a temporary file in the target directory and moved into place with
``os.replace``, so a reader never sees a half-written checkpoint.  Why not Orbax: it
writes a directory tree of many files, asynchronously by default, and brings a large
dependency; our models have < 1 M parameters and we want one small, atomic,
self-describing file that numpy alone can read.  Truncation or bit flips are caught by
the zip CRCs and the checksum and reported as ``ValueError`` naming the file.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import pathlib
import sys
import tempfile
import time
import zipfile
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm import tqdm

from jaxbsd import data as _data
from jaxbsd.models import MODELS, build_model, config_to_dict

__all__ = [
    "train",
    "evaluate",
    "predict",
    "make_optimizer",
    "random_shift",
    "save_checkpoint",
    "load_checkpoint",
    "read_checkpoint_header",
    "CHECKPOINT_FORMAT",
]

CHECKPOINT_FORMAT = "jaxbsd-checkpoint"
_CHECKPOINT_VERSION = 1
_HEADER_KEY = "__header__"
_SCHEDULES = ("constant", "cosine")


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


def _padded_batches(images, batch_size):
    """Fixed-size batches (the last one zero-padded) so each jitted step compiles once."""
    n = images.shape[0]
    size = min(batch_size, n)
    for start in range(0, n, size):
        chunk = np.asarray(images[start : start + size])
        valid = chunk.shape[0]
        if valid < size:
            chunk = np.concatenate([chunk, np.zeros((size - valid,) + chunk.shape[1:], chunk.dtype)])
        yield start, valid, chunk


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
        for _, valid, chunk in _padded_batches(images, batch_size)
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
    for start, valid, chunk in _padded_batches(images, batch_size):
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
    *,
    epochs: int = 20,
    lr: float = 1e-4,
    batch_size: int = 128,
    seed: int = 0,
    teacher=None,
    schedule: str = "constant",
    warmup_epochs: float = 0.0,
    weight_decay: float = 0.0,
    label_smoothing: float = 0.0,
    shift: int = 0,
    progress: bool = True,
    checkpoint: str | os.PathLike | None = None,
    metadata: dict | None = None,
    eval_batch_size: int = 512,
    on_epoch: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Train ``model`` in place on ``dataset`` with Adam; evaluate on the test split each epoch.

    Args:
        model: a ViT/Swin/DeiT (possibly with replaced MLPs); trained in place, left in
            eval mode.
        dataset: a :class:`jaxbsd.data.Dataset`.
        epochs: passes over the training split (the last incomplete batch is dropped,
            a different one each epoch).
        lr: peak learning rate (paper: 1e-4).
        batch_size: examples per step (paper: 128).
        seed: shuffling and stochastic-depth seed.
        teacher: for a distilled model (DeiT), a model whose argmax predictions on the
            training images are the distillation head's targets (hard distillation).
        schedule: ``"constant"`` (paper) or ``"cosine"`` (with ``warmup_epochs``).
        warmup_epochs: linear warm-up length for the cosine schedule.
        weight_decay: AdamW decay on weight matrices (0: plain Adam, the paper's setting).
        label_smoothing: smoothing of the one-hot targets (0: the paper's setting).
        shift: data augmentation by random translations of up to ``shift`` pixels
            (0: none, the paper's setting).
        progress: show a tqdm bar with running loss and accuracy.
        checkpoint: if given, :func:`save_checkpoint` there after every epoch, with
            ``metadata`` plus the history and the training settings.
        metadata: extra JSON-serialisable data for the checkpoint.
        eval_batch_size: batch size for test evaluation.
        on_epoch: called with each epoch's record as soon as it is complete (e.g. to log).

    Returns:
        One dict per epoch: ``epoch``, ``loss`` (mean training loss), ``train_acc``,
        ``test_acc`` (fractions), ``seconds`` (wall time of the epoch incl. evaluation).
    """
    for name in ("train_images", "train_labels", "test_images", "test_labels"):
        if not hasattr(dataset, name):
            raise ValueError(f"dataset must be a jaxbsd.data.Dataset, missing {name!r}")
    _check_positive_int("epochs", epochs)
    _check_positive_int("batch_size", batch_size)
    _check_positive_int("eval_batch_size", eval_batch_size)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must lie in [0, 1), got {label_smoothing!r}")
    if isinstance(shift, bool) or not isinstance(shift, (int, np.integer)) or shift < 0:
        raise ValueError(f"shift must be a non-negative int, got {shift!r}")
    if warmup_epochs < 0:
        raise ValueError(f"warmup_epochs must be >= 0, got {warmup_epochs!r}")
    if teacher is not None and not getattr(model, "distilled", False):
        raise ValueError("teacher is only used by distilled models (DeiT); got a teacher for "
                         f"{type(model).__name__}")
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

    optimizer = make_optimizer(
        model, lr=lr, schedule=schedule, total_steps=epochs * steps_per_epoch,
        warmup_steps=int(round(warmup_epochs * steps_per_epoch)), weight_decay=weight_decay,
    )
    nnx.reseed(model, dropout=seed)
    # cached_partial clones the module graph (sharing its Variables), freezing static
    # attributes such as ``deterministic``: switch to train mode *before* caching.  The
    # original model can then go to eval mode for evaluation without affecting the step.
    model.train()
    step = nnx.cached_partial(_train_step, model, optimizer)
    settings = dict(epochs=epochs, lr=lr, batch_size=batch, seed=int(seed), schedule=schedule,
                    warmup_epochs=warmup_epochs, weight_decay=weight_decay,
                    label_smoothing=label_smoothing, shift=int(shift), teacher=teacher is not None)
    history: list[dict[str, Any]] = []
    for epoch in range(1, epochs + 1):
        start = time.perf_counter()
        loss_sum = jnp.zeros((), jnp.float32)
        correct = jnp.zeros((), jnp.int32)
        seen = 0
        bar = tqdm(
            _data.batches(images, targets, batch, seed=_epoch_seed(int(seed), epoch), drop_last=True),
            total=steps_per_epoch, desc=f"epoch {epoch}/{epochs}", disable=not progress,
            file=sys.stderr, mininterval=1.0 if sys.stderr.isatty() else 30.0, leave=False,
        )
        augment_rng = np.random.default_rng(_epoch_seed(int(seed) + 1, epoch))
        for i, (x, t) in enumerate(bar):
            x = jnp.asarray(random_shift(x, shift, augment_rng))
            y_dist = jnp.asarray(t[:, 1])
            if per_batch_teacher:  # the teacher labels the augmented images it is shown
                y_dist = jnp.argmax(_logits_step(teacher, x), axis=-1).astype(jnp.int32)
            loss, c = step(x, jnp.asarray(t[:, 0]), y_dist, float(label_smoothing))
            loss_sum = loss_sum + loss * x.shape[0]
            correct = correct + c
            seen += x.shape[0]
            if progress and (i % 20 == 19 or i == steps_per_epoch - 1):
                bar.set_postfix(loss=f"{float(loss_sum) / seen:.4f}", acc=f"{int(correct) / seen:.4f}")
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
            save_checkpoint(checkpoint, model, {**(metadata or {}), "history": history, "train": settings})
        if on_epoch is not None:
            on_epoch(record)
    model.eval()
    return history


# ----------------------------------------------------------------------------- checkpoints


def _flat_variables(model) -> dict[str, nnx.Variable]:
    return {".".join(map(str, path)): var for path, var in nnx.to_flat_state(nnx.state(model))}


def _is_key(value) -> bool:
    return jnp.issubdtype(getattr(value, "dtype", np.float32), jax.dtypes.prng_key)


def _checksum(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def save_checkpoint(path: str | os.PathLike, model, metadata: dict | None = None) -> pathlib.Path:
    """Write ``model``'s full state and ``metadata`` to one ``.npz`` file, atomically.

    Args:
        path: target file (``.npz`` is not appended; parent directories are created).
        model: any NNX module; ViT/Swin/DeiT also store their kind and config.
        metadata: JSON-serialisable dict (e.g. dataset, accuracy, history).

    Returns:
        the path written.
    """
    path = pathlib.Path(path)
    if metadata is not None and not isinstance(metadata, dict):
        raise ValueError(f"metadata must be a dict or None, got {type(metadata).__name__}")
    arrays: dict[str, np.ndarray] = {}
    table: dict[str, dict] = {}
    for name, var in _flat_variables(model).items():
        value = var[...]
        entry = {"type": type(var).__name__}
        if _is_key(value):
            entry["key_impl"] = str(jax.random.key_impl(value))
            value = jax.random.key_data(value)
        arr = np.asarray(value)
        entry.update(shape=list(arr.shape), dtype=arr.dtype.str)
        arrays[name] = arr
        table[name] = entry
    kind = getattr(type(model), "kind", None)
    config = getattr(model, "config", None)
    header = {
        "format": CHECKPOINT_FORMAT,
        "version": _CHECKPOINT_VERSION,
        "kind": kind if kind in MODELS else None,
        "config": config_to_dict(config) if config is not None and kind in MODELS else None,
        "metadata": metadata or {},
        "variables": table,
        "checksum": _checksum(arrays),
    }
    try:
        blob = json.dumps(header, allow_nan=True).encode()
    except TypeError as e:
        raise ValueError(f"metadata must be JSON-serialisable: {e}") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **{_HEADER_KEY: np.frombuffer(blob, np.uint8)}, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; use the usual file mode
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _read(path: pathlib.Path) -> tuple[dict, dict[str, np.ndarray]]:
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    expected = f"a {CHECKPOINT_FORMAT} .npz written by jaxbsd.train.save_checkpoint"
    try:
        with np.load(path, allow_pickle=False) as npz:
            files = {name: npz[name] for name in npz.files}  # reading checks every zip CRC
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as e:
        raise ValueError(f"checkpoint {path} is truncated or corrupt (expected {expected}): {e}") from None
    if _HEADER_KEY not in files:
        raise ValueError(f"checkpoint {path} has no {_HEADER_KEY} entry (expected {expected})")
    try:
        header = json.loads(files.pop(_HEADER_KEY).tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"checkpoint {path} has a corrupt header (expected JSON): {e}") from None
    if not isinstance(header, dict) or header.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint {path} is not {expected}")
    if header.get("version") != _CHECKPOINT_VERSION:
        raise ValueError(
            f"checkpoint {path} has version {header.get('version')!r}, expected {_CHECKPOINT_VERSION}"
        )
    table = header.get("variables", {})
    if set(table) != set(files):
        raise ValueError(f"checkpoint {path} is corrupt: its arrays do not match its variable table")
    if _checksum(files) != header.get("checksum"):
        raise ValueError(f"checkpoint {path} is corrupt: checksum mismatch")
    return header, files


def read_checkpoint_header(path: str | os.PathLike) -> dict:
    """The verified JSON header of a checkpoint: ``kind``, ``config``, ``metadata``, ``variables``."""
    return _read(pathlib.Path(path))[0]


def load_checkpoint(path: str | os.PathLike, model=None):
    """Restore a checkpoint written by :func:`save_checkpoint`.

    Args:
        path: the checkpoint file.
        model: a module with the same state structure to load into (in place), e.g. a
            model whose ``block.mlp`` were replaced the same way as the saved one.  If
            None, the model is rebuilt from the stored kind and config.

    Returns:
        ``(model, metadata)``; the model is in eval mode.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: truncated or corrupt file, or a state that does not match ``model``
            (missing/unexpected variables, shapes or dtypes), naming ``path``.
    """
    path = pathlib.Path(path)
    header, arrays = _read(path)
    if model is None:
        kind = header.get("kind")
        if kind not in MODELS or header.get("config") is None:
            raise ValueError(f"checkpoint {path} stores no known model kind; pass model=")
        try:
            model = build_model(kind, header["config"])
        except (TypeError, ValueError) as e:
            raise ValueError(f"checkpoint {path} has an invalid {kind} config: {e}") from None
    variables = _flat_variables(model)
    table = header["variables"]
    missing, unexpected = sorted(set(variables) - set(arrays)), sorted(set(arrays) - set(variables))
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {path} does not match the model {type(model).__name__}: "
            f"missing {missing[:5]}{'…' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{'…' if len(unexpected) > 5 else ''}"
        )
    values = {}
    for name, var in variables.items():
        current, arr = var[...], arrays[name]
        if _is_key(current):
            if "key_impl" not in table[name]:
                raise ValueError(f"checkpoint {path}: {name} was saved as data, expected a PRNG key")
            new = jax.random.wrap_key_data(arr, impl=table[name]["key_impl"])
            if new.shape != current.shape:
                raise ValueError(f"checkpoint {path}: {name} has shape {new.shape}, expected {current.shape}")
        else:
            want = (tuple(np.shape(current)), np.dtype(current.dtype))
            if (arr.shape, arr.dtype) != want:
                raise ValueError(
                    f"checkpoint {path}: {name} has shape {arr.shape} {arr.dtype}, "
                    f"expected {want[0]} {want[1]}"
                )
            new = jnp.asarray(arr)
        values[name] = new
    # Assign only after everything checked, so a failed load leaves the model untouched.
    for name, var in variables.items():
        var[...] = values[name]
    model.eval()
    return model, header.get("metadata", {})
