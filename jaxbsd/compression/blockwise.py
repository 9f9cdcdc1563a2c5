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

import dataclasses
import hashlib
import json
import os
import sys
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxbsd.solver import metrics
from jaxbsd.solver.bases import Basis, BSpline
from jaxbsd.solver.cmtf import CMTFConfig
from jaxbsd.compression.distill import DISTILL_STREAM, Distill, distill_model, teacher_outputs
from jaxbsd.compression.engine import ALLOCATIONS, PLAN, Plan, Step, run, site_at
from jaxbsd.compression.methods import JUDGES, Method, get_method, method_names
from jaxbsd.compression.refine import Refine
from jaxbsd.compression.state import RunState
from jaxbsd.compression.surgery import model_outputs
from jaxbsd.data import Dataset, split_train_test
from jaxbsd.models import count_params
from jaxbsd.models.capture import mlp_inputs
from jaxbsd.models.decoupled_mlp import DecoupledMLP
from jaxbsd.models.layers import MLP
from jaxbsd.evaluation import evaluate, predict
from jaxbsd.training import train
from jaxbsd.warm_start import SELECTIONS

__all__ = [
    "METHODS",
    "ORDERS",
    "CAPTURES",
    "CompressionConfig",
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

METHODS = method_names()
ORDERS = {"front-to-back": "fb", "back-to-front": "bf"}
#: Where each block's sampling points come from (see :class:`CompressionConfig`).
CAPTURES = ("current", "original")



@dataclasses.dataclass(frozen=True)
class CompressionConfig:
    """How each block is compressed and fine-tuned.

    Attributes:
      method: ``"bsd"`` (decoupling), ``"svd"`` or ``"drone"`` (low-rank baselines), ``"prune"``
        (structured pruning of hidden units with a least-squares refit of the output layer) or
        ``"auto"`` (per block, the better on held-out calibration tokens of a decoupling
        warm-started from the pruned MLP, its restart chosen by output error, and the pruned MLP
        within the same parameters; see :class:`jaxbsd.compression.methods.Auto`; the record's
        ``method`` is the kept one and ``auto`` says why).
      basis: basis of the internal functions (``"bsd"`` only).
      rank: decoupling rank, the low-rank baselines' rank, or the hidden units pruning keeps; ``None`` = the block's width
        (the paper's choice, ``r = m``) for ``"bsd"``; required for the baselines unless
        ``reduction`` is given.
      reduction: instead of ``rank``, ``ρ``: the compressed model keeps at most ``(1 − ρ)·P``
        of the original's ``P`` parameters (paper §6.5); the ranks are planned up front.
      allocation: how ``reduction`` is shared by the blocks: ``"uniform"`` or ``"greedy"``
        (see :func:`~jaxbsd.compression.engine.compress_model`).
      robust, lam, max_iter, restarts, tol: solver settings (``"bsd"`` only).
      num_samples: ``S``, sampling points (token vectors) per block (with
        ``samples_per_rank``, the smallest S).
      samples_per_rank: if > 0, ``S = max(num_samples, samples_per_rank · r)`` for a block
        compressed at rank ``r`` (S grows with the rank; 0: ``S = num_samples`` always).
      capture: where the sampling points of every block come from. ``"current"`` (default):
        captured at each step from the current, partly compressed and fine-tuned network.
        ``"original"``: captured once from the original network, for every block, before any
        replacement (the same images per step as ``"current"``); the function decoupled is still
        the block's current MLP, evaluated at those points.
      capture_images: training images whose tokens the samples are drawn from.
      warm_start: ``"bsd"`` only: add one restart started from the block's MLP pruned to
        ``rank − 1`` units plus a constant unit (:func:`jaxbsd.compression.methods.warm_init`); ``"auto"``
        always warm-starts.
      selection: ``"bsd"`` only: which restart is kept, ``"objective"`` (the solver's) or
        ``"output"`` (the output error on held-out calibration tokens); ``"auto"`` uses ``"output"``.
      auto_judge: ``"auto"`` only: how each block's two candidates are compared. ``"model"``
        (default): the whole model's outputs (logits) with the candidate in place, on
        ``judge_images`` held-out training images (drawn apart from the block's calibration
        images), against the original model's outputs on them
        (:func:`jaxbsd.compression.surgery.output_judge`). ``"block"``: the MLP's output error on its
        held-out check tokens (the rule before the end-to-end judge).
      judge_images: ``auto_judge="model"`` only: how many training images the candidates are
        judged on (fewer if the training split has fewer outside the calibration images). Two
        candidates often differ by a few tenths of a point of accuracy; on 256 images the judge's
        last choice was the worse one on 6,000 other held-out images (and on the test split) in
        4 of the 6 ViT/Fashion-MNIST runs at ρ ≥ 0.35, hence 2048 (forward passes only).
      structured: use the structured Jacobian for standard MLP blocks.
      finetune_epochs: epochs of fine-tuning after every replacement (0 = none).
      lr, batch_size, schedule: fine-tuning optimizer settings.
      val_fraction: held-out share of the training split for selecting fine-tuned weights
        (0: no hold-out, fine-tuned weights always kept).
      seed: seeds the image subset, the token draw, the solver and the fine-tuning.
      refine_steps: steps of the label-free refinement of each replacement
        (:class:`~jaxbsd.compression.refine.Refine`; 0: none), before fine-tuning.
      refine_lr, refine_target: its learning rate and target (``"consistent"``, the default: the
        original model's MLP outputs on the step's capture images; ``"local"``: the original MLP
        on the tokens the compressed model feeds it).
      refine_batch: its tokens per step (None: all of them, full batch).
      distill_steps: steps of label-free distillation of the whole model after the last step
        (:class:`~jaxbsd.compression.distill.Distill`; 0: none): the compressed model is trained to
        reproduce the original model's logits on ``distill_images`` training images
        (:func:`distill_indices`; their labels are never read), the best step on held-out images kept.
      distill_lr, distill_batch, distill_loss, distill_temperature, distill_trainable: its learning
        rate, images per step, loss (``"kl"`` on the logits by default), temperature and which
        parameters train (see :class:`~jaxbsd.compression.distill.Distill`).
      distill_schedule, distill_warmup: its learning-rate schedule (``"cosine"``, the default, or
        ``"constant"``) and the cosine's warm-up steps.
      distill_images: how many training images (outside the validation hold-out) it uses, fewer
        if the split has fewer.
    """

    method: str = "bsd"
    basis: Basis = BSpline(3, 4)
    rank: int | None = None
    robust: bool = True
    lam: float = 0.25
    max_iter: int = 300
    restarts: int = 1
    tol: float = 1e-8
    num_samples: int = 128
    capture_images: int = 256
    structured: bool = True
    finetune_epochs: int = 5
    lr: float = 1e-4
    batch_size: int = 128
    schedule: str = "constant"
    reduction: float | None = None
    allocation: str = "uniform"
    val_fraction: float = 0.1
    seed: int = 0
    samples_per_rank: int = 0
    capture: str = "current"
    warm_start: bool = False
    selection: str = "objective"
    auto_judge: str = "model"
    judge_images: int = 2048
    refine_steps: int = 0
    refine_lr: float = 1e-3
    refine_target: str = "consistent"
    refine_batch: int | None = Refine.batch_size
    distill_steps: int = 0
    distill_lr: float = Distill.learning_rate
    distill_batch: int | None = Distill.batch_size
    distill_images: int = 16384
    distill_loss: str = "kl"
    distill_temperature: float = 2.0
    distill_trainable: str = "replaced"
    distill_schedule: str = Distill.schedule
    distill_warmup: int = 0

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.method == "auto" and self.allocation != "uniform":
            raise ValueError(f"allocation={self.allocation!r}: method 'auto' shares the budget uniformly")
        if self.method not in ("bsd", "auto") and self.rank is None and self.reduction is None:
            raise ValueError(f"rank (or reduction) must be given for method {self.method!r}")
        if self.reduction is not None and self.rank is not None:
            raise ValueError("give at most one of rank and reduction")
        if self.reduction is not None and not (isinstance(self.reduction, (int, float)) and 0 <= self.reduction < 1):
            raise ValueError(f"reduction must be a number in [0, 1), got {self.reduction!r}")
        if self.allocation not in ALLOCATIONS:
            raise ValueError(f"allocation must be one of {ALLOCATIONS}, got {self.allocation!r}")
        if not (isinstance(self.val_fraction, (int, float)) and 0 <= self.val_fraction < 1):
            raise ValueError(f"val_fraction must be a number in [0, 1), got {self.val_fraction!r}")
        for name in ("num_samples", "capture_images", "judge_images", "restarts", "max_iter", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(self.finetune_epochs, int) or self.finetune_epochs < 0:
            raise ValueError(f"finetune_epochs must be an int >= 0, got {self.finetune_epochs!r}")
        if not isinstance(self.samples_per_rank, int) or self.samples_per_rank < 0:
            raise ValueError(f"samples_per_rank must be an int >= 0, got {self.samples_per_rank!r}")
        if self.capture not in CAPTURES:
            raise ValueError(f"capture must be one of {CAPTURES}, got {self.capture!r}")
        if not isinstance(self.warm_start, bool):
            raise ValueError(f"warm_start must be a bool, got {self.warm_start!r}")
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {self.selection!r}")
        self.refine  # validates the refinement settings
        self.distill  # and the distillation's
        if isinstance(self.distill_images, bool) or not isinstance(self.distill_images, int) or self.distill_images < 2:
            raise ValueError(f"distill_images must be an int >= 2, got {self.distill_images!r}")
        if self.auto_judge not in JUDGES:
            raise ValueError(f"auto_judge must be one of {JUDGES}, got {self.auto_judge!r}")

    def samples_for(self, rank: int) -> int:
        """``S`` for a block compressed at ``rank``: ``max(num_samples, samples_per_rank · rank)``."""
        return max(self.num_samples, self.samples_per_rank * int(rank))

    def solver_config(self, width: int) -> CMTFConfig:
        return CMTFConfig(
            rank=self.rank or width, basis=self.basis, lam=self.lam, robust=self.robust,
            max_iter=self.max_iter, tol=self.tol,
        )

    @property
    def refine(self) -> Refine | None:
        """The refinement stage these settings describe (None with ``refine_steps=0``)."""
        if isinstance(self.refine_steps, bool) or not isinstance(self.refine_steps, int) or self.refine_steps < 0:
            raise ValueError(f"refine_steps must be an int >= 0, got {self.refine_steps!r}")
        refine = Refine(steps=self.refine_steps, learning_rate=self.refine_lr, target=self.refine_target,
                        batch_size=self.refine_batch)
        return refine if self.refine_steps else None

    @property
    def distill(self) -> Distill | None:
        """The distillation stage these settings describe (None with ``distill_steps=0``)."""
        if isinstance(self.distill_steps, bool) or not isinstance(self.distill_steps, int) or self.distill_steps < 0:
            raise ValueError(f"distill_steps must be an int >= 0, got {self.distill_steps!r}")
        distill = Distill(steps=self.distill_steps, learning_rate=self.distill_lr, batch_size=self.distill_batch,
                          loss=self.distill_loss, temperature=self.distill_temperature,
                          trainable=self.distill_trainable, schedule=self.distill_schedule,
                          warmup=self.distill_warmup)
        return distill if self.distill_steps else None

    def method_object(self) -> Method:
        """The method object this configuration describes (its solver settings, restarts, warm
        start, selection and judge on it)."""
        solver = self.solver_config(1)
        if self.method == "bsd":
            return get_method("bsd", config=solver, restarts=self.restarts, warm_start=self.warm_start,
                              selection=self.selection)
        if self.method == "auto":
            return get_method("auto", config=solver, restarts=self.restarts, auto_judge=self.auto_judge)
        return get_method(self.method)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["basis"] = self.basis.to_dict()
        # Fields added later are left out at their defaults, so the run ids (and the resume
        # states) of runs configured before they existed stay valid.
        for name, default in _LATER_FIELDS.items():
            if d[name] == default:
                del d[name]
        if self.method != "auto":
            d.pop("auto_judge", None)  # only "auto" has candidates to judge
        if self.method != "auto" or self.auto_judge != "model":
            d.pop("judge_images", None)  # only the model judge looks at images
        if not self.refine_steps:  # no refinement: its settings mean nothing
            d.pop("refine_lr", None)
            d.pop("refine_target", None)
            d.pop("refine_batch", None)
        if not self.distill_steps:  # no distillation: its settings mean nothing
            for name in _DISTILL_FIELDS:
                d.pop(name, None)
        return d


#: Fields added after runs were already saved, with the defaults that reproduce the old behaviour.
_LATER_FIELDS = {"samples_per_rank": 0, "capture": "current", "warm_start": False, "selection": "objective",
                 "auto_judge": "block", "judge_images": 256, "refine_steps": 0, "refine_lr": 1e-3,
                 "refine_target": "local", "refine_batch": None, "distill_steps": 0,
                 "distill_schedule": "constant", "distill_warmup": 0}
#: The distillation's settings, left out of a run's identity without distillation.
_DISTILL_FIELDS = ("distill_lr", "distill_batch", "distill_images", "distill_loss", "distill_temperature",
                   "distill_trainable", "distill_schedule", "distill_warmup")


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
    module, info = plan.method.build(site, rank, source.keys(path, 1)[1], judge=judge)
    info["num_samples"] = site.X.shape[0]
    info["seconds"] = time.perf_counter() - start
    return module, info


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

    def record(step: Step) -> dict:
        old, module, after, info = step.site.module, step.module, dict(step.after), dict(step.info)
        params = count_params(model)
        info.pop("seconds", None)
        info["num_samples"] = int(step.site.X.shape[0])
        return {
            "step": step.step,
            "block": _block(step.path),
            "method": config.method,
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

    def report(record: dict) -> None:
        if progress:
            err = f"  Error(J) {record['error_J']:.2e}" if record.get("error_J") is not None else ""
            note = "" if record["finetune_kept"] else "  (FT discarded: validation fell)"
            print(f"step {record['step']}: block {record['block']}  acc after {config.method} "
                  f"{record['acc_cmtf']:.4f}  after FT {record['acc_ft']:.4f}{note}  params {record['params_model']}"
                  f"  savings {record['savings_model']:.2f} %{err}", file=sys.stderr, flush=True)
        if on_step is not None:
            on_step(record)

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
                  state=None if run_state is None else (lambda identity: run_state), on_record=report)
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
