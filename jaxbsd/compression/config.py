"""The paper's block-by-block run's settings: :class:`CompressionConfig` (``jb.compress``, ``jaxbsd compress``).

Its fields keep their names in saved runs and configuration files: a run directory or a config
written before a field existed loads with :data:`LATER_FIELDS`' defaults, which reproduce the
behaviour of that time.
"""

from __future__ import annotations

import dataclasses
from typing import Any


from jaxbsd.solver.bases import Basis, BSpline
from jaxbsd.solver.cmtf import CMTFConfig
from jaxbsd.compression.distill import Distill
from jaxbsd.compression.budget import ALLOCATIONS
from jaxbsd.compression.methods import JUDGES, Method, get_method, method_names
from jaxbsd.compression.refine import Refine
from jaxbsd.compression.methods.warm_start import SELECTIONS

__all__ = ["CompressionConfig", "METHODS", "ORDERS", "CAPTURES", "LATER_FIELDS", "DISTILL_FIELDS"]

#: The methods a block can be compressed with.
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
        for name, default in LATER_FIELDS.items():
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
            for name in DISTILL_FIELDS:
                d.pop(name, None)
        return d


#: Fields added after runs were already saved, with the defaults that reproduce the old behaviour.
LATER_FIELDS = {"samples_per_rank": 0, "capture": "current", "warm_start": False, "selection": "objective",
                 "auto_judge": "block", "judge_images": 256, "refine_steps": 0, "refine_lr": 1e-3,
                 "refine_target": "local", "refine_batch": None, "distill_steps": 0,
                 "distill_schedule": "constant", "distill_warmup": 0}
#: The distillation's settings, left out of a run's identity without distillation.
DISTILL_FIELDS = ("distill_lr", "distill_batch", "distill_images", "distill_loss", "distill_temperature",
                   "distill_trainable", "distill_schedule", "distill_warmup")


