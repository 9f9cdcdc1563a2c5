"""Compressing a transformer block by block (paper §5.3): decouple, replace, fine-tune, repeat.

One step for block ``i``:

1. draw ``S`` of the MLP's input tokens on a random subset of training images;
2. build the MLP's Jacobian there — structured ``[[V1, V0ᵀ, h'(X V0ᵀ + b0)]]`` for a standard
   :class:`~jaxbsd.models.layers.MLP` (never materialized), dense through ``jax.jacfwd``
   otherwise — and decouple it (any basis, robust or not, vmapped restarts); or, for the
   baselines, factor the dense layers by truncated SVD or DRONE;
3. ``model.blocks[i].mlp = new_module`` and evaluate;
4. fine-tune the whole model for ``finetune_epochs`` with Optax and evaluate again.

This module is an adapter of the compression engine (:func:`jaxbsd.compression.engine.run`), as
:func:`~jaxbsd.compression.engine.compress_model` is: the engine plans the ranks (explicit, or from a parameter
budget shared uniformly or greedily), builds each site and replacement with the method object,
and saves and resumes the state. What is this module's own is the data: the token capture,
batched and jitted through ``model.block_input`` over whole data sets (:class:`BlockCalibration`),
the images each step and each judge sees, and the fine-tuning step with its keep-or-discard rule.

Fine-tuning selects on validation, never on test: ``val_fraction`` of the training split is
held out (stratified, seeded); after each step the weights before and after fine-tuning are
compared by validation accuracy and the better are kept. Test accuracy is only reported.

Orders: ``"front-to-back"`` (FB), ``"back-to-front"`` (BF) or an explicit list of block
indices. Each finished step is recorded (accuracies, parameter counts, savings, accuracy drop,
Error(𝒥), Error(F), wall times) and, with ``state_dir``, saved atomically together with a
checkpoint of the model, so a rerun of an interrupted run resumes after its last finished step.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxbsd.solver import metrics
from jaxbsd.compression.config import CAPTURES, METHODS, ORDERS, PAPER_BSD, CompressionConfig
from jaxbsd.compression.distill import DISTILL_STREAM, distill_model, teacher_outputs
from jaxbsd.compression.engine import PLAN, Plan, Step, run, site_at
from jaxbsd.compression.state import RunState
from jaxbsd.compression.surgery import model_outputs
from jaxbsd.data import Dataset, split_train_test
from jaxbsd.models import count_params
from jaxbsd.models.capture import mlp_inputs
from jaxbsd.models.decoupled_mlp import DecoupledMLP
from jaxbsd.models.layers import MLP
from jaxbsd.evaluation import evaluate, predict
from jaxbsd.training import train

__all__ = [
    "METHODS",
    "ORDERS",
    "CAPTURES",
    "CompressionConfig",
    "PAPER_BSD",
    "BlockCalibration",
    "block_order",
    "sample_tokens",
    "compress_block",
    "compress",
    "check_state",
    "mlp_params",
    "validation_split",
    "capture_indices",
    "judge_indices",
    "distill_indices",
]




def block_order(order: str | Sequence[int], num_blocks: int) -> tuple[int, ...]:
    """Block indices for ``"front-to-back"``/``"fb"``, ``"back-to-front"``/``"bf"`` or a list."""
    if isinstance(order, str):
        key = ORDERS.get(order, order)
        if key == "fb":
            return tuple(range(num_blocks))
        if key == "bf":
            return tuple(reversed(range(num_blocks)))
        raise ValueError(f"order must be 'front-to-back', 'back-to-front' or a list of ints, got {order!r}")
    indices = tuple(int(i) for i in order)
    if not indices or len(set(indices)) != len(indices) or not all(0 <= i < num_blocks for i in indices):
        raise ValueError(f"order must list distinct block indices in [0, {num_blocks}), got {list(order)}")
    return indices


def mlp_params(module: nnx.Module) -> int:
    """Trainable parameters of one block's MLP module."""
    return count_params(module)


def sample_tokens(model, images, block_index: int, num_samples: int, key: jax.Array) -> jax.Array:
    """``(S, m)`` MLP input tokens of block ``block_index``, drawn without replacement."""
    tokens = mlp_inputs(model, images, block_index)
    flat = tokens.reshape(-1, tokens.shape[-1])
    if num_samples > flat.shape[0]:
        raise ValueError(f"num_samples ({num_samples}) exceeds the {flat.shape[0]} available tokens")
    return flat[jax.random.choice(key, flat.shape[0], (num_samples,), replace=False)]



def capture_indices(num_images: int, n: int, seed: int, step: int) -> np.ndarray:
    """``(n,)``: the training images (indices into the ``num_images`` of the training split
    :func:`compress` draws from) whose tokens step ``step`` of a run with ``seed`` is compressed
    from (step 0: the ones the ranks are planned on). The images outside every step's draw are
    held out from calibration (e.g. to evaluate a compressed model on images no step
    was calibrated on; the model may still have been trained on them)."""
    return np.random.default_rng([seed, step]).choice(num_images, n, replace=False)


def judge_indices(num_images: int, n_capture: int, n_judge: int, seed: int, step: int) -> np.ndarray:
    """Up to ``n_judge`` training images (indices) outside step ``step``'s ``n_capture``
    capture images, on which ``auto_judge="model"`` compares the candidates (the capture images
    themselves when every image is one of them)."""
    capture = capture_indices(num_images, n_capture, seed, step)
    rest = np.setdiff1d(np.arange(num_images), capture)
    if rest.size == 0:
        return capture
    return np.random.default_rng([seed, step, 1]).choice(rest, min(n_judge, rest.size), replace=False)


def distill_indices(num_images: int, n: int, seed: int) -> np.ndarray:
    """``(min(n, num_images),)``: the training images (indices) distillation uses in a run with
    ``seed`` (drawn apart from the calibration draws; only the images, never their labels)."""
    return np.random.default_rng([seed, DISTILL_STREAM]).choice(num_images, min(n, num_images), replace=False)


def mlp_width(module: nnx.Module) -> int:
    """Input width ``m`` of a block's MLP (original or already compressed)."""
    if isinstance(module, MLP):
        return int(module.dim)
    if isinstance(module, DecoupledMLP):
        return int(module.W0[...].shape[1])
    return int(getattr(module, "in_features"))




def validation_split(dataset, fraction: float, seed: int):
    """``(fit, val)``: ``fit`` is ``dataset`` with ``fraction`` of its training split held out
    as its *test* split (so fine-tuning reports validation accuracy), ``val`` the held-out
    ``(images, labels)``. ``fraction == 0``: ``(dataset, None)``."""
    if not fraction:
        return dataset, None
    try:
        tr_x, tr_y, va_x, va_y = split_train_test(dataset.train_images, dataset.train_labels, fraction, seed)
    except ValueError as err:
        raise ValueError(f"val_fraction: {err}") from None
    return Dataset(dataset.name, tr_x, tr_y, va_x, va_y, dataset.num_classes), (va_x, va_y)



def _path(block: int) -> str:
    return f"blocks.{block}.mlp"


def _block(path: str) -> int:
    return int(path.split(".")[1])


class BlockCalibration:
    """The :class:`~jaxbsd.compression.engine.CalibrationSource` of the paper's run.

    Each stage draws its own ``capture_images`` training images (:func:`capture_indices`: the
    planning stage 0, step ``s`` its own), and a block's tokens are its MLP inputs on them
    (batched and jitted, :func:`jaxbsd.models.capture.mlp_inputs`), or — ``capture="original"`` —
    those the original network gave on the step's images. Keys: the planning draw of block ``i``
    ``fold_in(fold_in(key, 0), i)``, step ``s`` ``fold_in(key, s)``; each build key is its draw
    key folded with 1. Judges (``auto``'s model judge): the original model's logits on up to
    ``judge_images`` training images outside the step's capture images (:func:`judge_indices`).
    """

    first_step_reuses_plan = False
    plan_sequence = None  # each stage draws its own images, with its own keys: a step captures its own tokens

    def __init__(self, images: np.ndarray, config: "CompressionConfig", key: jax.Array, *, eval_batch_size: int):
        self.images, self.config, self.key = images, config, key
        self.n_capture = min(config.capture_images, images.shape[0])
        self.eval_batch_size = eval_batch_size
        self.original: dict[int, jax.Array] = {}

    def step_images(self, stage: int) -> jax.Array:
        # Per-stage streams, so a resumed run draws exactly what an uninterrupted one would.
        return jnp.asarray(self.images[capture_indices(self.images.shape[0], self.n_capture, self.config.seed, stage)])

    def keep_original(self, model, order: Sequence[int]) -> None:
        """``capture="original"``: every step's tokens from the original network, before any replacement."""
        for step, block in enumerate(order, start=1):
            tokens = mlp_inputs(model, self.step_images(step), block)
            self.original[block] = tokens.reshape(-1, tokens.shape[-1])

    def capture(self, model, paths, stage):
        tokens = {}
        for path in paths:
            block = _block(path)
            if stage != PLAN and block in self.original:
                X = self.original[block]
            else:
                X = mlp_inputs(model, self.step_images(stage), block)
                X = X.reshape(-1, X.shape[-1])
            tokens[path] = (X, model.blocks[block].mlp(X))
        return tokens, list(paths)

    def keys(self, path, stage):
        key = jax.random.fold_in(jax.random.fold_in(self.key, 0), _block(path)) if stage == PLAN \
            else jax.random.fold_in(self.key, stage)
        return key, jax.random.fold_in(key, 1)

    def num_samples(self, path, rank, stage):
        return self.config.num_samples if rank is None else self.config.samples_for(rank)

    def reference(self, model, path, stage):
        block = _block(path)
        X = self.original.get(block)
        if X is None:
            X = mlp_inputs(model, self.step_images(stage), block)
            X = X.reshape(-1, X.shape[-1])
        return model.blocks[block].mlp(X)

    def judge(self, model, stage):
        held_out = self.images[judge_indices(self.images.shape[0], self.n_capture, self.config.judge_images,
                                             self.config.seed, stage)]
        # predict() runs the images in padded batches (one compiled shape).
        logits = lambda m, images=held_out: jnp.asarray(predict(m, images, self.eval_batch_size))  # noqa: E731
        return logits, model_outputs(model, logits)


def _plan(model, indices: Sequence[int], config: "CompressionConfig") -> Plan:
    paths = tuple(_path(i) for i in indices)
    if config.reduction is None:  # r = m, the paper's choice, unless a rank is given
        ranks = {_path(i): config.rank or mlp_width(model.blocks[i].mlp) for i in indices}
    else:
        ranks = None
    return Plan(paths=paths, method=config.method_object(), reduction=config.reduction, ranks=ranks,
                allocation=config.allocation, order=paths, structured=config.structured, refine=config.refine)


def compress_block(model, block_index: int, images, config: "CompressionConfig", key: jax.Array, *,
                   judge: Callable[[nnx.Module], float] | None = None):
    """Build the replacement of ``model.blocks[block_index].mlp`` at ``config.rank`` (the model is
    not changed), from the block's tokens on ``images`` drawn with ``key`` (as step ``s`` of
    :func:`compress` does with ``key = fold_in(key, s)``). ``judge``: for ``"auto"``, how a
    candidate is scored (None: the block's output error).

    Returns:
      ``(module, info)``: the new MLP module and a dict with ``error_J``, ``error_F``,
      ``output_error``, ``jacobian``, ``num_samples`` (S), ``status``, ``iterations``
      (decoupling only) and ``seconds``.
    """
    start = time.perf_counter()
    plan = _plan(model, [block_index], config)
    path = _path(block_index)
    source = _FixedImages(images, config, key)
    given = plan.ranks[path]
    site = site_at(model, plan, source, path, 1, source.num_samples(path, given, 1))
    plan.method.check_site(site)
    rank = plan.method.check_rank(site, given)
    built = plan.method.build(site, rank, source.keys(path, 1)[1], judge=judge)
    return built.module, {**built.report(), "num_samples": site.X.shape[0], "seconds": time.perf_counter() - start}


class _FixedImages(BlockCalibration):
    """One step's source on given images and key (for :func:`compress_block`)."""

    def __init__(self, images, config, key):
        super().__init__(np.asarray(images), config, key, eval_batch_size=512)
        self.fixed = jnp.asarray(images)

    def step_images(self, stage):
        return self.fixed

    def keys(self, path, stage):
        return self.key, jax.random.fold_in(self.key, 1)


def _run_id(config: "CompressionConfig", order: tuple[int, ...], params_before: int) -> str:
    text = json.dumps({"config": config.to_dict(), "order": order, "params": params_before}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_state(
    state_dir: str | os.PathLike,
    model,
    *,
    order: str | Sequence[int] = "back-to-front",
    config: "CompressionConfig" = None,
) -> int:
    """How many finished steps of this run ``state_dir`` holds (0: none), reading no weights.

    :func:`compress` makes the same check when it resumes; calling this first lets a caller
    refuse another run's state before doing any work (``jaxbsd compress`` does, before it
    trains or writes anything).

    Args:
      state_dir: the ``state_dir`` that would be passed to :func:`compress`.
      model: the model that would be compressed (its parameter count is part of the run).
      order, config: as for :func:`compress`.

    Raises:
      ValueError: ``state_dir`` holds a checkpoint that is not a state of :func:`compress`, is
        corrupt, or belongs to a different run (config, order or model differ).
    """
    config = CompressionConfig() if config is None else config
    indices = block_order(order, len(model.blocks))
    return len(RunState(state_dir, _run_id(config, indices, count_params(model))).records())


def _finetune_step(model, dataset, fit, val, config: "CompressionConfig", *, teacher, progress: bool,
                   eval_batch_size: int) -> Callable[[nnx.Module, str, int], dict]:
    """The step after each replacement: evaluate, fine-tune, and keep the fine-tuned weights only
    if validation accuracy did not fall (test accuracy is only reported)."""

    def after_step(model, path, step):
        acc_cmtf = evaluate(model, dataset.test_images, dataset.test_labels, eval_batch_size)
        val_cmtf = evaluate(model, *val, eval_batch_size) if val is not None else None
        start = time.perf_counter()
        history, val_ft, kept = [], None, True
        if config.finetune_epochs:
            before = jax.tree.map(jnp.copy, nnx.state(model, nnx.Param))
            history = train(model, fit, epochs=config.finetune_epochs, lr=config.lr, batch_size=config.batch_size,
                            seed=config.seed + step, teacher=teacher, schedule=config.schedule, progress=progress,
                            on_epoch=lambda r: None, eval_batch_size=eval_batch_size)
            if val is not None:
                # train() evaluates on fit's "test" split, which is the validation hold-out.
                # Per-epoch test accuracy is not measured (selection must not see it): None.
                history = [{**r, "val_acc": r["test_acc"], "test_acc": None} for r in history]
                val_ft = history[-1]["val_acc"]
                kept = val_ft >= val_cmtf
                if not kept:  # fine-tuning made validation worse: back to the weights before it
                    nnx.update(model, before)
        acc_ft = (evaluate(model, dataset.test_images, dataset.test_labels, eval_batch_size)
                  if config.finetune_epochs else acc_cmtf)
        return dict(acc_cmtf=acc_cmtf, val_cmtf=val_cmtf, acc_ft=acc_ft, val_ft=val_ft, finetune_kept=kept,
                    finetune=history, seconds_finetune=time.perf_counter() - start)

    return after_step


def _recorder(model, config: CompressionConfig, acc_original: float, original_params: int) -> Callable[[Step], dict]:
    """Turns a finished step into the block-by-block run's record (accuracies, parameters, savings)."""

    def record(step: Step) -> dict:
        old, module, after, info = step.site.module, step.module, dict(step.after), step.built.report()
        params = count_params(model)
        info.pop("seconds", None)
        info["num_samples"] = int(step.site.X.shape[0])
        return {
            "step": step.step,
            "block": _block(step.path),
            "method": config.method.name,
            "basis": config.basis.to_dict(),
            "rank": step.rank if isinstance(step.rank, int) else info.get("rank"),
            "in_features": int(old.fc1.kernel[...].shape[0]) if isinstance(old, MLP) else None,
            "out_features": int(old.fc2.kernel[...].shape[1]) if isinstance(old, MLP) else None,
            "acc_original": acc_original,
            "acc_cmtf": after["acc_cmtf"],
            "acc_ft": after["acc_ft"],
            "val_cmtf": after["val_cmtf"],
            "val_ft": after["val_ft"],
            "finetune_kept": after["finetune_kept"],
            "accuracy_drop": 100 * metrics.accuracy_drop(acc_original, after["acc_ft"]),
            "params_model": params,
            "params_original": original_params,
            "params_mlp_old": mlp_params(old),
            "params_mlp_new": mlp_params(module),
            "savings_model": metrics.savings_percentage(params, original_params),
            "savings_mlp": metrics.savings_percentage(mlp_params(module), mlp_params(old)),
            "seconds_compress": step.seconds,
            "seconds_finetune": after["seconds_finetune"],
            "finetune": after["finetune"],
            "capture": config.capture,
            **info,
        }


    return record


def _reporter(config: CompressionConfig, progress: bool, on_step) -> Callable[[dict], None]:
    """Prints a line per saved step (with ``progress``) and passes the record to ``on_step``."""

    def report(record: dict) -> None:
        if progress:
            err = f"  Error(J) {record['error_J']:.2e}" if record.get("error_J") is not None else ""
            note = "" if record["finetune_kept"] else "  (FT discarded: validation fell)"
            print(f"step {record['step']}: block {record['block']}  acc after {config.method.name} "
                  f"{record['acc_cmtf']:.4f}  after FT {record['acc_ft']:.4f}{note}  params {record['params_model']}"
                  f"  savings {record['savings_model']:.2f} %{err}", file=sys.stderr, flush=True)
        if on_step is not None:
            on_step(record)

    return report


def compress(
    model,
    dataset,
    *,
    order: str | Sequence[int] = "back-to-front",
    config: "CompressionConfig" = None,
    state_dir: str | os.PathLike | None = None,
    teacher=None,
    progress: bool = True,
    on_step: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Compress ``model`` in place, block by block, fine-tuning after every replacement.

    Args:
      model: a ViT, Swin or DeiT (``model.blocks[i].mlp``); changed in place.
      dataset: a :class:`jaxbsd.data.Dataset`: capture images and fine-tuning data come from
        its training split less a held-out validation part (``config.val_fraction``), which
        decides whether fine-tuned weights are kept; test accuracies are only reported.
      order: ``"front-to-back"``, ``"back-to-front"`` or explicit block indices.
      config: a :class:`CompressionConfig` (default ``CompressionConfig()``).
      state_dir: if given, the step log (``steps.json``) and the model after the last finished
        step (``model``, a checkpoint) are kept there, written atomically; calling again with the same
        arguments resumes after the last finished step.
      teacher: passed to fine-tuning (hard distillation for DeiT).
      progress: print a line per step (and show training progress bars).
      on_step: called with each step's record once it is saved.

    Returns:
      One record per step (``step`` 1-based, ``block``, ``acc_cmtf``, ``acc_ft`` (test, of the
      kept weights), ``val_cmtf``, ``val_ft`` (validation before and after fine-tuning; None
      without hold-out), ``finetune_kept``, parameter counts, ``savings_model``/``savings_mlp``
      in percent, ``accuracy_drop`` in points, errors, wall times), including resumed ones.
    """
    config = CompressionConfig() if config is None else config
    indices = block_order(order, len(model.blocks))
    model.eval()
    original_params = count_params(model)
    fit, val = validation_split(dataset, config.val_fraction, config.seed)
    # One evaluation batch shape for test and validation: each model structure compiles once.
    eval_bs = min(512, val[0].shape[0]) if val is not None else 512
    acc_original = evaluate(model, dataset.test_images, dataset.test_labels, eval_bs)
    source = BlockCalibration(fit.train_images, config, jax.random.key(config.seed), eval_batch_size=eval_bs)
    if config.capture == "original":
        source.keep_original(model, indices)
    run_state = None if state_dir is None else RunState(state_dir, _run_id(config, indices, original_params))
    if run_state is not None and progress and (done := len(run_state.records())):
        print(f"resuming after step {done} of {len(indices)} from {state_dir}", file=sys.stderr)

    record = _recorder(model, config, acc_original, original_params)
    report = _reporter(config, progress, on_step)

    after_step = _finetune_step(model, dataset, fit, val, config, teacher=teacher, progress=progress,
                                eval_batch_size=eval_bs)
    distill = config.distill
    if distill is not None:  # the original model's logits on unlabeled training images, before any replacement
        start = time.perf_counter()
        images = jnp.asarray(fit.train_images[distill_indices(fit.train_images.shape[0], config.distill_images,
                                                              config.seed)])
        targets = teacher_outputs(model, images, distill.forward)
        seconds_targets = time.perf_counter() - start
    plan = _plan(model, indices, config)
    records = run(model, plan, source, record=record, after_step=after_step,
                  state=None if run_state is None else (lambda identity: run_state), on_record=report).records
    if distill is not None and records:
        info = distill_model(model, images, targets, plan.paths, distill,
                             jax.random.fold_in(jax.random.key(config.seed), DISTILL_STREAM))
        acc = evaluate(model, dataset.test_images, dataset.test_labels, eval_bs)
        info.update(acc_before=records[-1]["acc_ft"], acc_after=acc, images=int(images.shape[0]),
                    seconds_targets=seconds_targets)
        records[-1] = {**records[-1], "distill": info}
        if progress:
            print(f"distillation: held-out loss {info['loss_before']:.4g} -> {info['loss_after']:.4g} "
                  f"(step {info['steps_kept']} of {info['steps']}), accuracy {info['acc_before']:.4f} -> {acc:.4f}",
                  file=sys.stderr, flush=True)
    return records
