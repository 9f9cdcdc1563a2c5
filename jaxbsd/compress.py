"""Compressing a transformer block by block (paper §5.3): decouple, replace, fine-tune, repeat.

One step for block ``i``:

1. draw ``S`` of the MLP's input tokens on a random subset of training images;
2. build the MLP's Jacobian there — structured ``[[V1, V0ᵀ, h'(X V0ᵀ + b0)]]`` for a standard
   :class:`~jaxbsd.models.layers.MLP` (never materialized), dense through ``jax.jacfwd``
   otherwise — and decouple it (any basis, robust or not, vmapped restarts); or, for the
   baselines, factor the dense layers by truncated SVD or DRONE;
3. ``model.blocks[i].mlp = new_module`` and evaluate;
4. fine-tune the whole model for ``finetune_epochs`` with Optax and evaluate again.

Steps 2 and 3 are the per-path machinery of :func:`jaxbsd.compress_model` (sites, structured or
dense Jacobians, replacements, budgets) applied to ``"blocks.{i}.mlp"``; only the token capture
is this module's own (batched and jitted through ``model.block_input``, for whole data sets).
With ``reduction`` the ranks come from a parameter budget (uniform or greedy), as there.

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
import pathlib
import sys
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxbsd import baselines, metrics
from jaxbsd.bases import Basis, BSpline
from jaxbsd.cmtf import CMTFConfig
from jaxbsd.compress_model import (
    ALLOCATIONS,
    AUTO_JUDGES,
    _check_auto_budget,
    auto_prune_rank,
    auto_ranks,
    build_auto,
    check_budget,
    model_outputs,
    output_judge,
    make_site,
    build_replacement,
    greedy_candidates,
    greedy_ranks,
    spec_for,
    uniform_ranks,
)
from jaxbsd.data import Dataset, split_train_test
from jaxbsd.io import write_json_atomic
from jaxbsd.models import count_params
from jaxbsd.models.capture import mlp_inputs
from jaxbsd.models.decoupled_mlp import DecoupledMLP
from jaxbsd.models.layers import MLP
from jaxbsd.train import evaluate, load_checkpoint, predict, read_checkpoint_header, save_checkpoint, train
from jaxbsd.warm_start import SELECTIONS

__all__ = [
    "METHODS",
    "ORDERS",
    "CompressionConfig",
    "block_order",
    "sample_tokens",
    "compress_block",
    "compress",
    "check_state",
    "mlp_params",
    "plan_ranks",
    "validation_split",
    "capture_indices",
]

METHODS = ("bsd", "svd", "drone", "prune", "auto")
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
        within the same parameters; see :func:`jaxbsd.compress_model.build_auto`; the record's
        ``method`` is the kept one and ``auto`` says why).
      basis: basis of the internal functions (``"bsd"`` only).
      rank: decoupling rank, the low-rank baselines' rank, or the hidden units pruning keeps; ``None`` = the block's width
        (the paper's choice, ``r = m``) for ``"bsd"``; required for the baselines unless
        ``reduction`` is given.
      reduction: instead of ``rank``, ``ρ``: the compressed model keeps at most ``(1 − ρ)·P``
        of the original's ``P`` parameters (paper §6.5); the ranks are planned up front.
      allocation: how ``reduction`` is shared by the blocks: ``"uniform"`` or ``"greedy"``
        (see :func:`jaxbsd.compress_model`).
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
        ``rank − 1`` units plus a constant unit (:func:`jaxbsd.compress_model.warm_init`); ``"auto"``
        always warm-starts.
      selection: ``"bsd"`` only: which restart is kept, ``"objective"`` (the solver's) or
        ``"output"`` (the output error on held-out calibration tokens); ``"auto"`` uses ``"output"``.
      auto_judge: ``"auto"`` only: how each block's two candidates are compared. ``"model"``
        (default): the whole model's outputs (logits) with the candidate in place, on
        ``judge_images`` held-out training images (drawn apart from the block's calibration
        images), against the original model's outputs on them
        (:func:`jaxbsd.compress_model.output_judge`). ``"block"``: the MLP's output error on its
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
        if self.auto_judge not in AUTO_JUDGES:
            raise ValueError(f"auto_judge must be one of {AUTO_JUDGES}, got {self.auto_judge!r}")

    def samples_for(self, rank: int) -> int:
        """``S`` for a block compressed at ``rank``: ``max(num_samples, samples_per_rank · rank)``."""
        return max(self.num_samples, self.samples_per_rank * int(rank))

    def solver_config(self, width: int) -> CMTFConfig:
        return CMTFConfig(
            rank=self.rank or width, basis=self.basis, lam=self.lam, robust=self.robust,
            max_iter=self.max_iter, tol=self.tol,
        )

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
        return d


#: Fields added after runs were already saved, with the defaults that reproduce the old behaviour.
_LATER_FIELDS = {"samples_per_rank": 0, "capture": "current", "warm_start": False, "selection": "objective",
                 "auto_judge": "block", "judge_images": 256}


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


def _block_site(model, block_index: int, images, config: CompressionConfig, key: jax.Array, *,
                num_samples: int | None = None, tokens: jax.Array | None = None):
    """The :class:`~jaxbsd.compress_model.Site` of ``model.blocks[block_index].mlp``.

    ``tokens``: the block's ``(N, m)`` input tokens if already captured (``capture="original"``),
    else they are captured from ``model`` on ``images``. ``num_samples``: S (default
    ``config.num_samples``).
    """
    mlp = model.blocks[block_index].mlp
    if tokens is None:
        tokens = mlp_inputs(model, images, block_index)
    X_all = tokens.reshape(-1, tokens.shape[-1])
    S = config.num_samples if num_samples is None else num_samples
    if S > X_all.shape[0]:
        raise ValueError(f"num_samples ({S}) exceeds the {X_all.shape[0]} available tokens")
    path = f"blocks.{block_index}.mlp"
    spec = spec_for(mlp, path, None) if (config.structured or config.method != "bsd") else None
    return make_site(path, mlp, spec, X_all, mlp(X_all), S, key, validate=False)


def compress_block(model, block_index: int, images, config: CompressionConfig, key: jax.Array, *,
                   tokens: jax.Array | None = None, prune_rank: int | None = None,
                   judge: Callable[[nnx.Module], float] | None = None):
    """Build the replacement of ``model.blocks[block_index].mlp`` (the model is not changed).

    ``tokens``: the block's input tokens captured beforehand (``capture="original"``); by
    default they are captured from ``model`` on ``images``. ``prune_rank``: for ``"auto"``, the
    pruned candidate's units (default :func:`~jaxbsd.compress_model.auto_prune_rank` of the
    decoupling's rank ``config.rank``). ``judge``: for ``"auto"``, how a candidate is scored
    (:func:`~jaxbsd.compress_model.build_auto`; None: the block's output error).

    Returns:
      ``(module, info)``: the new MLP module and a dict with ``error_J``, ``error_F``,
      ``output_error``, ``jacobian``, ``num_samples`` (S), ``status``, ``iterations``
      (decoupling only) and ``seconds``.
    """
    start = time.perf_counter()
    mlp = model.blocks[block_index].mlp
    if config.method != "bsd" and not isinstance(mlp, MLP):
        raise ValueError(f"block {block_index}'s MLP is already compressed ({type(mlp).__name__})")
    rank = config.rank or mlp_width(mlp)
    S = config.samples_for(rank)
    site = _block_site(model, block_index, images, config, key, num_samples=S, tokens=tokens)
    if config.method == "auto":
        k = auto_prune_rank(site, rank, config.basis.num_coef) if prune_rank is None else int(prune_rank)
        module, info = build_auto(site, rank, k, config.solver_config(site.m), jax.random.fold_in(key, 1),
                                  restarts=config.restarts, judge=judge)
    else:
        module, info = build_replacement(site, config.method, rank, config.solver_config(site.m),
                                         jax.random.fold_in(key, 1), restarts=config.restarts,
                                         warm_start=config.warm_start, selection=config.selection)
    info["num_samples"] = S
    info["seconds"] = time.perf_counter() - start
    return module, info


def capture_indices(num_images: int, n: int, seed: int, step: int) -> np.ndarray:
    """``(n,)``: the training images (indices into the ``num_images`` of the training split
    :func:`compress` draws from) whose tokens step ``step`` of a run with ``seed`` is compressed
    from (step 0: the ones the ranks are planned on). The images outside every step's draw are
    held out from calibration (e.g. to evaluate a compressed model on images no step
    was calibrated on; the model may still have been trained on them)."""
    return np.random.default_rng([seed, step]).choice(num_images, n, replace=False)


def _judge_indices(num_images: int, n_capture: int, n_judge: int, seed: int, step: int) -> np.ndarray:
    """Up to ``n_judge`` training images (indices) outside step ``step``'s ``n_capture``
    capture images, on which ``auto_judge="model"`` compares the candidates (the capture images
    themselves when every image is one of them)."""
    capture = capture_indices(num_images, n_capture, seed, step)
    rest = np.setdiff1d(np.arange(num_images), capture)
    if rest.size == 0:
        return capture
    return np.random.default_rng([seed, step, 1]).choice(rest, min(n_judge, rest.size), replace=False)


def mlp_width(module: nnx.Module) -> int:
    """Input width ``m`` of a block's MLP (original or already compressed)."""
    if isinstance(module, MLP):
        return int(module.dim)
    if isinstance(module, DecoupledMLP):
        return int(module.W0[...].shape[1])
    return int(getattr(module, "in_features"))


def plan_ranks(model, indices: Sequence[int], images, config: CompressionConfig, key: jax.Array) -> dict[int, int]:
    """Per-block ranks meeting ``config.reduction`` on the whole model (uniform or greedy).

    For ``"auto"``: ``{block: (decoupling rank, pruned units)}``
    (:func:`~jaxbsd.compress_model.auto_ranks`).

    Raises:
      ValueError: naming ``reduction`` if the MLPs alone cannot shrink enough.
    """
    sites = [_block_site(model, i, images, config, jax.random.fold_in(key, i)) for i in indices]
    dof = config.basis.num_coef
    total = count_params(model)
    budget = int(np.floor((1 - config.reduction) * total)) - (total - sum(s.params for s in sites))
    if config.method == "auto":
        _check_auto_budget(sites, dof, budget, config.reduction)
        return {i: tuple(int(r) for r in pair) for i, pair in zip(indices, auto_ranks(sites, dof, budget))}
    check_budget(sites, config.method, dof, budget, config.reduction)
    ranks = uniform_ranks(sites, config.method, dof, budget)
    if config.allocation == "greedy":
        floor = sum(s.params_at(config.method, 1, dof) for s in sites)
        errors = []
        for i, s, u in zip(indices, sites, ranks):
            alone = budget - floor + s.params_at(config.method, 1, dof)
            candidates = greedy_candidates(s, config.method, dof, u, alone)
            if config.samples_per_rank:
                # S grows with the rank: draw the most any candidate needs, use a prefix of it per
                # candidate (a prefix of a draw without replacement is itself such a draw).
                big = _block_site(model, i, images, config, jax.random.fold_in(key, i),
                                  num_samples=config.samples_for(max(candidates)))
            errs = {}
            for r in candidates:
                site = s
                if config.samples_per_rank:
                    S = config.samples_for(r)
                    site = dataclasses.replace(big, X=big.X[:S], F=big.F[:S])
                errs[r] = build_replacement(site, config.method, r, config.solver_config(s.m),
                                            jax.random.fold_in(jax.random.fold_in(key, i), 1),
                                            restarts=config.restarts, warm_start=config.warm_start,
                                            selection=config.selection)[1]["output_error"]
            errors.append(errs)
        ranks = greedy_ranks(sites, config.method, dof, budget, errors, ranks)
    return {i: int(r) for i, r in zip(indices, ranks)}


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


def _placeholder(record: dict, old: nnx.Module) -> nnx.Module:
    """A module with the structure of a finished step's replacement (weights loaded later)."""
    if record["method"] == "bsd":
        basis = Basis.from_dict(record["basis"])
        r, m, n = record["rank"], record["in_features"], record["out_features"]
        z = lambda *s: jnp.zeros(s, jnp.float32)  # noqa: E731
        return DecoupledMLP(z(r, m), z(n, r), z(r, basis.num_coef), z(r, basis.num_knots), basis)
    (K1, b1), (K2, b2) = baselines.kernels(old)
    k = record["rank"]
    z = lambda a, b: jnp.zeros((a, b), K1.dtype)  # noqa: E731
    if record["method"] == "prune":
        return baselines.PrunedMLP(z(K1.shape[0], k), jnp.zeros((k,), K1.dtype), z(k, K2.shape[1]), b2,
                                   old.activation)
    return baselines.LowRankMLP(
        baselines.LowRankLinear(z(K1.shape[0], k), z(k, K1.shape[1]), b1),
        baselines.LowRankLinear(z(K2.shape[0], k), z(k, K2.shape[1]), b2),
        old.activation,
    )


def _run_id(config: CompressionConfig, order: tuple[int, ...], params_before: int) -> str:
    text = json.dumps({"config": config.to_dict(), "order": order, "params": params_before}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


#: The state checkpoint in ``state_dir`` (model and step log after the last finished step).
_STATE_CHECKPOINT = "model"


def _state_steps(path: pathlib.Path, run_id: str) -> list[dict]:
    """The step log of the state checkpoint ``path`` (none if it does not exist), read from its
    header only; ``ValueError`` if it is not a state of :func:`compress` or of another run."""
    if not path.exists():
        return []
    meta = read_checkpoint_header(path).get("metadata", {})
    if not isinstance(meta, dict) or "steps" not in meta or "run_id" not in meta:
        raise ValueError(f"{path}: expected a checkpoint written by jaxbsd.compress (with its step log)")
    if meta["run_id"] != run_id:
        raise ValueError(
            f"{path} belongs to a different run (config, order or model differ); "
            "use another state_dir or delete it to start over"
        )
    return meta["steps"]


def check_state(
    state_dir: str | os.PathLike,
    model,
    *,
    order: str | Sequence[int] = "back-to-front",
    config: CompressionConfig = CompressionConfig(),
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
    indices = block_order(order, len(model.blocks))
    run_id = _run_id(config, indices, count_params(model))
    return len(_state_steps(pathlib.Path(state_dir) / _STATE_CHECKPOINT, run_id))


def _load_state(state_dir: pathlib.Path, run_id: str, model) -> list[dict]:
    """Finished steps and the model after the last one, from ``state_dir/model``.

    The step log travels inside the checkpoint's metadata, so model and log are written by
    one checkpoint save (atomic) and can never disagree (``steps.json`` is a readable copy).
    """
    path = state_dir / _STATE_CHECKPOINT
    if not path.exists():
        return []
    steps = _state_steps(path, run_id)
    for record in steps:
        block = model.blocks[record["block"]]
        block.mlp = _placeholder(record, block.mlp)
    load_checkpoint(path, model)
    return steps


def compress(
    model,
    dataset,
    *,
    order: str | Sequence[int] = "back-to-front",
    config: CompressionConfig = CompressionConfig(),
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
      config: a :class:`CompressionConfig`.
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
    indices = block_order(order, len(model.blocks))
    model.eval()
    original_params = count_params(model)
    fit, val = validation_split(dataset, config.val_fraction, config.seed)
    # One evaluation batch shape for test and validation: each model structure compiles once.
    eval_bs = min(512, val[0].shape[0]) if val is not None else 512
    acc_original = evaluate(model, dataset.test_images, dataset.test_labels, eval_bs)
    run_id = _run_id(config, indices, original_params)
    key = jax.random.key(config.seed)
    n_capture = min(config.capture_images, fit.train_images.shape[0])

    def step_images(step: int) -> jax.Array:
        # Per-step streams, so a resumed run draws exactly what an uninterrupted one would.
        return jnp.asarray(fit.train_images[capture_indices(fit.train_images.shape[0], n_capture, config.seed, step)])

    planned = None
    if config.reduction is not None:
        # Planned on the original model, before any resumed state is loaded: a resumed run
        # plans exactly what the uninterrupted one did.
        planned = plan_ranks(model, indices, step_images(0), config, jax.random.fold_in(key, 0))
    original_tokens: dict[int, jax.Array] = {}
    if config.capture == "original":
        # Every block's sampling points from the original network, before any replacement (and
        # before a resumed state is loaded), on the images each step would use.
        for step, block in enumerate(indices, start=1):
            tokens = mlp_inputs(model, step_images(step), block)
            original_tokens[block] = tokens.reshape(-1, tokens.shape[-1])
    judged: dict[int, tuple[Callable[[nnx.Module], jax.Array], jax.Array]] = {}
    if config.method == "auto" and config.auto_judge == "model":
        # Per step, images held out from that step's calibration images and the original
        # model's outputs on them (before a resumed state is loaded).
        for step in range(1, len(indices) + 1):
            held_out = fit.train_images[_judge_indices(fit.train_images.shape[0], n_capture,
                                                       config.judge_images, config.seed, step)]
            # predict() runs the images in padded batches of eval_bs (one compiled shape).
            logits = lambda m, images=held_out: jnp.asarray(predict(m, images, eval_bs))  # noqa: E731
            judged[step] = (logits, model_outputs(model, logits))
    steps: list[dict] = []
    if state_dir is not None:
        state_dir = pathlib.Path(state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        steps = _load_state(state_dir, run_id, model)
        if steps and progress:
            print(f"resuming after step {len(steps)} of {len(indices)} from {state_dir}", file=sys.stderr)
    for step, block in enumerate(indices, start=1):
        if step <= len(steps):
            continue
        images = step_images(step)
        old = model.blocks[block].mlp
        old_params = mlp_params(old)
        plan = None if planned is None else planned[block]
        given = {"tokens": original_tokens[block]} if block in original_tokens else {}
        if isinstance(plan, tuple):  # method "auto": (decoupling rank, pruned units)
            plan, given["prune_rank"] = plan
        if step in judged:
            given["judge"] = output_judge(model, f"blocks.{block}.mlp", *judged[step])
        step_config = config if plan is None else dataclasses.replace(config, rank=plan, reduction=None)
        module, info = compress_block(model, block, images, step_config, jax.random.fold_in(key, step), **given)
        model.blocks[block].mlp = module
        acc_cmtf = evaluate(model, dataset.test_images, dataset.test_labels, eval_bs)
        val_cmtf = evaluate(model, *val, eval_bs) if val is not None else None
        start = time.perf_counter()
        ft_history, val_ft, kept = [], None, True
        if config.finetune_epochs:
            before = jax.tree.map(jnp.copy, nnx.state(model, nnx.Param))
            ft_history = train(model, fit, epochs=config.finetune_epochs, lr=config.lr,
                               batch_size=config.batch_size, seed=config.seed + step, teacher=teacher,
                               schedule=config.schedule, progress=progress, on_epoch=lambda r: None,
                               eval_batch_size=eval_bs)
            if val is not None:
                # train() evaluates on fit's "test" split, which is the validation hold-out.
                # Per-epoch test accuracy is not measured (selection must not see it): None.
                ft_history = [{**r, "val_acc": r["test_acc"], "test_acc": None} for r in ft_history]
                val_ft = ft_history[-1]["val_acc"]
                kept = val_ft >= val_cmtf
                if not kept:  # fine-tuning made validation worse: back to the weights before it
                    nnx.update(model, before)
        acc_ft = evaluate(model, dataset.test_images, dataset.test_labels, eval_bs) if config.finetune_epochs else acc_cmtf
        params = count_params(model)
        record = {
            "step": step,
            "block": block,
            "method": config.method,
            "basis": config.basis.to_dict(),
            "rank": int(module.W0[...].shape[0]) if isinstance(module, DecoupledMLP) else int(module.rank),
            "in_features": int(old.fc1.kernel[...].shape[0]) if isinstance(old, MLP) else None,
            "out_features": int(old.fc2.kernel[...].shape[1]) if isinstance(old, MLP) else None,
            "acc_original": acc_original,
            "acc_cmtf": acc_cmtf,
            "acc_ft": acc_ft,
            "val_cmtf": val_cmtf,
            "val_ft": val_ft,
            "finetune_kept": kept,
            "accuracy_drop": 100 * metrics.accuracy_drop(acc_original, acc_ft),
            "params_model": params,
            "params_original": original_params,
            "params_mlp_old": old_params,
            "params_mlp_new": mlp_params(module),
            "savings_model": metrics.savings_percentage(params, original_params),
            "savings_mlp": metrics.savings_percentage(mlp_params(module), old_params),
            "seconds_compress": info.pop("seconds"),
            "seconds_finetune": time.perf_counter() - start,
            "finetune": ft_history,
            "capture": config.capture,
            **info,
        }
        steps.append(record)
        if state_dir is not None:
            save_checkpoint(state_dir / _STATE_CHECKPOINT, model, {"run_id": run_id, "steps": steps})
            write_json_atomic(state_dir / "steps.json", {"run_id": run_id, "steps": steps})
        if progress:
            err = f"  Error(J) {record['error_J']:.2e}" if "error_J" in record else ""
            note = "" if kept else "  (FT discarded: validation fell)"
            print(
                f"step {step}: block {block}  acc after {config.method} {acc_cmtf:.4f}  after FT {acc_ft:.4f}{note}"
                f"  params {params}  savings {record['savings_model']:.2f} %{err}",
                file=sys.stderr, flush=True,
            )
        if on_step is not None:
            on_step(record)
    return steps
