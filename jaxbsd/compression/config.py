"""The paper's block-by-block run's settings: :class:`CompressionConfig` (``jb.compress``, ``jaxbsd compress``).

A configuration is composed of the objects :func:`jaxbsd.compress_model` takes: the method (``jb.BSD(...)``,
``jb.Prune()``, …, its solver settings on it), the refinement (``jb.Refine``) and the distillation
(``jb.Distill``), beside the block run's own settings (capture, fine-tuning, seed). Its JSON form
(:meth:`CompressionConfig.to_dict`, every saved run's identity) is the flat one runs were saved with;
:meth:`CompressionConfig.from_dict` reads it back, and a flat dict written before a field existed loads
with :data:`LATER_FIELDS`' defaults, which reproduce the behaviour of that time.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxbsd.solver.bases import Basis, BSpline
from jaxbsd.solver.cmtf import CMTFConfig
from jaxbsd.compression.distill import Distill
from jaxbsd.compression.budget import ALLOCATIONS
from jaxbsd.compression.methods import BSD, Auto, Method, get_method, method_names
from jaxbsd.compression.methods.auto import DEFAULT_JUDGE
from jaxbsd.compression.refine import Refine

__all__ = ["CompressionConfig", "PAPER_BSD", "METHODS", "ORDERS", "CAPTURES", "LATER_FIELDS", "DISTILL_FIELDS"]

#: The methods a block can be compressed with.
METHODS = method_names()
ORDERS = {"front-to-back": "fb", "back-to-front": "bf"}
#: Where each block's sampling points come from (see :class:`CompressionConfig`).
CAPTURES = ("current", "original")

#: The paper's decoupling, the block run's default method: the solver at the paper's settings (cubic
#: B-splines with ν = 4, λ = 0.25, the robust updates, 300 sweeps), random starts, the restart with the
#: lowest training objective. (``compress_model``'s ``"bsd"`` warm-starts and selects by output error.)
PAPER_BSD = BSD(config=CMTFConfig(rank=1, basis=BSpline(3, 4), lam=0.25, robust=True, max_iter=300, tol=1e-8),
                restarts=1, warm_start=False, selection="objective")


def _named(name: str) -> Method:
    """What a method name means in a block run (``CompressionConfig(method="bsd")``): the paper's
    settings; ``auto`` of that decoupling is made on use (it is deprecated, and warns when made)."""
    if name == "bsd":
        return PAPER_BSD
    if name == "auto":
        return Auto(bsd=dataclasses.replace(PAPER_BSD, warm_start=None, selection="output"))
    return get_method(name)


@dataclasses.dataclass(frozen=True)
class CompressionConfig:
    """How each block is compressed and fine-tuned.

    Attributes:
      method: a method object (``jb.BSD(config=jb.CMTFConfig(...), restarts=..., warm_start=...,
        selection=...)``, ``jb.SVD()``, ``jb.DRONE()``, ``jb.Prune()``, ``jb.Auto(...)``), or its name:
        ``"bsd"`` is :data:`PAPER_BSD` (the paper's solver settings, random starts, selection by
        objective), ``"auto"`` an :class:`~jaxbsd.compression.methods.Auto` of that decoupling
        warm-started and selected by output error, judged by the whole model's outputs (the
        record's ``method`` is the candidate kept and ``auto`` says why). The decoupling's rank is
        set per block (``rank``); the rank of the method's ``CMTFConfig`` is not used.
      rank: decoupling rank, the low-rank baselines' rank, or the hidden units pruning keeps; ``None`` =
        the block's width (the paper's choice, ``r = m``) for a decoupling; required for the
        baselines unless ``reduction`` is given.
      reduction: instead of ``rank``, ``ρ``: the compressed model keeps at most ``(1 − ρ)·P``
        of the original's ``P`` parameters (paper §6.5); the ranks are planned up front.
      allocation: how ``reduction`` is shared by the blocks: ``"uniform"`` or ``"greedy"``
        (see :func:`~jaxbsd.compression.api.compress_model`).
      num_samples: ``S``, sampling points (token vectors) per block (with ``samples_per_rank``,
        the smallest S).
      samples_per_rank: if > 0, ``S = max(num_samples, samples_per_rank · r)`` for a block
        compressed at rank ``r`` (S grows with the rank; 0: ``S = num_samples`` always).
      capture: where the sampling points of every block come from. ``"current"`` (default):
        captured at each step from the current, partly compressed and fine-tuned network.
        ``"original"``: captured once from the original network, for every block, before any
        replacement (the same images per step as ``"current"``); the function decoupled is still
        the block's current MLP, evaluated at those points.
      capture_images: training images whose tokens the samples are drawn from.
      structured: use the structured Jacobian for standard MLP blocks.
      finetune_epochs: epochs of fine-tuning after every replacement (0 = none).
      lr, batch_size, schedule: fine-tuning optimizer settings.
      val_fraction: held-out share of the training split for selecting fine-tuned weights
        (0: no hold-out, fine-tuned weights always kept).
      seed: seeds the image subset, the token draw, the solver and the fine-tuning.
      judge_images: for ``Auto(judge="model")``: how many training images the candidates are judged
        on (drawn apart from the block's calibration images; fewer if the split has fewer). Two
        candidates often differ by a few tenths of a point, which 256 images do not resolve.
      refine: the label-free refinement of each replacement before its fine-tuning
        (:class:`~jaxbsd.compression.refine.Refine`), or None (the default: none).
      distill: label-free distillation of the whole model after the last step
        (:class:`~jaxbsd.compression.distill.Distill`: the compressed model trained to reproduce the
        original's logits on ``distill_images`` training images, their labels never read, the best
        step on held-out images kept), or None (the default: none).
      distill_images: how many training images (outside the validation hold-out) it uses, fewer
        if the split has fewer.
    """

    method: Method | str = PAPER_BSD
    rank: int | None = None
    reduction: float | None = None
    allocation: str = "uniform"
    num_samples: int = 128
    samples_per_rank: int = 0
    capture: str = "current"
    capture_images: int = 256
    structured: bool = True
    finetune_epochs: int = 5
    lr: float = 1e-4
    batch_size: int = 128
    schedule: str = "constant"
    val_fraction: float = 0.1
    seed: int = 0
    judge_images: int = 2048
    refine: Refine | None = None
    distill: Distill | None = None
    distill_images: int = 16384

    def __post_init__(self):
        if isinstance(self.method, str):
            if self.method not in METHODS:
                raise ValueError(f"method must be one of {METHODS} or a method object, got {self.method!r}")
            object.__setattr__(self, "method", _named(self.method))
        elif not isinstance(self.method, Method):
            raise ValueError(f"method must be one of {METHODS} or a method object (jb.BSD(...), jb.Prune(), ...), "
                             f"got {type(self.method).__name__}")
        name = self.method.name
        if not self.method.uneven and self.allocation != "uniform":
            raise ValueError(f"allocation={self.allocation!r}: method {name!r} shares the budget uniformly")
        if self._decoupling() is None and self.rank is None and self.reduction is None:
            raise ValueError(f"rank (or reduction) must be given for method {name!r}")
        if self.reduction is not None and self.rank is not None:
            raise ValueError("give at most one of rank and reduction")
        if self.reduction is not None and not (isinstance(self.reduction, (int, float)) and 0 <= self.reduction < 1):
            raise ValueError(f"reduction must be a number in [0, 1), got {self.reduction!r}")
        if self.allocation not in ALLOCATIONS:
            raise ValueError(f"allocation must be one of {ALLOCATIONS}, got {self.allocation!r}")
        if not (isinstance(self.val_fraction, (int, float)) and 0 <= self.val_fraction < 1):
            raise ValueError(f"val_fraction must be a number in [0, 1), got {self.val_fraction!r}")
        for field in ("num_samples", "capture_images", "judge_images", "batch_size"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field} must be a positive int, got {value!r}")
        if isinstance(self.finetune_epochs, bool) or not isinstance(self.finetune_epochs, int) or self.finetune_epochs < 0:
            raise ValueError(f"finetune_epochs must be an int >= 0, got {self.finetune_epochs!r}")
        if isinstance(self.samples_per_rank, bool) or not isinstance(self.samples_per_rank, int) or self.samples_per_rank < 0:
            raise ValueError(f"samples_per_rank must be an int >= 0, got {self.samples_per_rank!r}")
        if self.capture not in CAPTURES:
            raise ValueError(f"capture must be one of {CAPTURES}, got {self.capture!r}")
        if self.refine is not None and not isinstance(self.refine, Refine):
            raise ValueError(f"refine must be a jaxbsd.Refine or None, got {type(self.refine).__name__}")
        if self.distill is not None and not isinstance(self.distill, Distill):
            raise ValueError(f"distill must be a jaxbsd.Distill or None, got {type(self.distill).__name__}")
        if isinstance(self.distill_images, bool) or not isinstance(self.distill_images, int) or self.distill_images < 2:
            raise ValueError(f"distill_images must be an int >= 2, got {self.distill_images!r}")
        # A stage of no steps is no stage.
        if self.refine is not None and self.refine.steps == 0:
            object.__setattr__(self, "refine", None)
        if self.distill is not None and self.distill.steps == 0:
            object.__setattr__(self, "distill", None)

    def _decoupling(self) -> BSD | None:
        """The decoupling the method runs (its own, or ``auto``'s candidate), or None."""
        return self.method if isinstance(self.method, BSD) else getattr(self.method, "bsd", None)

    @property
    def basis(self):
        """The decoupling's basis (the paper's cubic B-splines for a method without one: records name it)."""
        return (self._decoupling() or PAPER_BSD).config.basis

    def samples_for(self, rank: int) -> int:
        """``S`` for a block compressed at ``rank``: ``max(num_samples, samples_per_rank · rank)``."""
        return max(self.num_samples, self.samples_per_rank * int(rank))

    def method_object(self) -> Method:
        """The method the run builds with: ``method``, its decoupling's ``CMTFConfig`` at rank
        ``rank`` (or 1; each block sets its own)."""
        bsd = self._decoupling()
        if bsd is None:
            return self.method
        sized = dataclasses.replace(bsd, config=dataclasses.replace(bsd.config, rank=self.rank or 1))
        return sized if bsd is self.method else dataclasses.replace(self.method, bsd=sized)

    def _flat(self) -> dict[str, Any]:
        """Every setting under its flat name (the method's, the refinement's and the distillation's
        included), nothing left out."""
        bsd = self._decoupling() or PAPER_BSD
        solver = bsd.config
        # Auto warm-starts and selects by output error whatever these say: the flat fields keep their defaults.
        own = isinstance(self.method, BSD)
        return {"method": self.method.name, "basis": solver.basis.to_dict(), "robust": solver.robust,
                "lam": solver.lam, "max_iter": solver.max_iter, "restarts": bsd.restarts, "tol": solver.tol,
                "patience": solver.patience, "best_iterate": bsd.best_iterate, "contain": bsd.contain,
                # None (the warm start where one can be built) is kept as None: False would read back as
                # no warm start, which restarts=0 refuses.
                "warm_start": bsd.warm_start if own else False,
                "selection": bsd.selection if own else "objective",
                "auto_judge": self.method.judge if isinstance(self.method, Auto) else DEFAULT_JUDGE,
                **{name: getattr(self, name) for name in _RUN_FIELDS},
                **_refine_fields(self.refine), **_distill_fields(self.distill, self.distill_images)}

    def to_dict(self) -> dict[str, Any]:
        """The flat JSON form runs are saved and resumed by (the fields of the method, the refinement
        and the distillation under their flat names; settings that mean nothing for this run, and
        fields added later at their defaults, left out, so identities of older runs stay valid)."""
        d = self._flat()
        if not isinstance(self.method, Auto):
            del d["auto_judge"]  # only "auto" has candidates to judge
        for name, default in LATER_FIELDS.items():
            if name in d and d[name] == default:
                del d[name]
        if not isinstance(self.method, Auto) or self.method.judge != "model":
            d.pop("judge_images", None)  # only the model judge looks at images
        if self.distill is None:  # no distillation: its images mean nothing
            d.pop("distill_images")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CompressionConfig":
        """The configuration a saved flat dict describes (:meth:`to_dict`'s form): a field it lacks was
        left out at its :data:`LATER_FIELDS` default (or did not exist yet), so it takes that one.
        ``ValueError`` naming an unknown key."""
        return cls._from_flat({**DEFAULTS, **LATER_FIELDS, **d})

    @classmethod
    def from_flat(cls, **fields) -> "CompressionConfig":
        """The configuration of flat keywords (``lam=``, ``refine_steps=``, … as the CLI's flags and
        the studies' settings name them), today's defaults for the others (:data:`DEFAULTS`)."""
        return cls._from_flat({**DEFAULTS, **fields})

    @classmethod
    def _from_flat(cls, d: dict[str, Any]) -> "CompressionConfig":
        unknown = sorted(set(d) - set(DEFAULTS) - set(LATER_FIELDS))
        if unknown:
            raise ValueError(f"config: unknown field(s) {unknown}")
        for field in ("refine_steps", "distill_steps"):  # named as the flat form names them
            if isinstance(d[field], bool) or not isinstance(d[field], int) or d[field] < 0:
                raise ValueError(f"{field} must be an int >= 0, got {d[field]!r}")
        name = d["method"]
        basis = Basis.from_dict(d["basis"]) if isinstance(d["basis"], dict) else d["basis"]
        solver = CMTFConfig(rank=1, basis=basis, lam=d["lam"], robust=d["robust"], max_iter=d["max_iter"], tol=d["tol"],
                            patience=d["patience"])
        if name == "bsd":
            method = BSD(config=solver, restarts=d["restarts"], warm_start=d["warm_start"], selection=d["selection"],
                         best_iterate=d["best_iterate"], contain=d["contain"])
        elif name == "auto":
            method = Auto(bsd=BSD(config=solver, restarts=d["restarts"], warm_start=None, selection="output",
                                  best_iterate=d["best_iterate"], contain=d["contain"]), judge=d["auto_judge"])
        else:
            method = name
        refine = (Refine(steps=d["refine_steps"], learning_rate=d["refine_lr"], target=d["refine_target"],
                         batch_size=d["refine_batch"]) if d["refine_steps"] else None)
        distill = (Distill(steps=d["distill_steps"], learning_rate=d["distill_lr"], batch_size=d["distill_batch"],
                           loss=d["distill_loss"], temperature=d["distill_temperature"],
                           trainable=d["distill_trainable"], schedule=d["distill_schedule"],
                           warmup=d["distill_warmup"]) if d["distill_steps"] else None)
        return cls(method=method, refine=refine, distill=distill, distill_images=d["distill_images"],
                   **{f: d[f] for f in _RUN_FIELDS})


def _refine_fields(refine: Refine | None) -> dict[str, Any]:
    if refine is None:
        return {"refine_steps": 0}
    out = {"refine_steps": refine.steps, "refine_lr": refine.learning_rate, "refine_target": refine.target,
           "refine_batch": refine.batch_size}
    # The refinement's other settings, only where not Refine's defaults (runs before had the defaults).
    out.update({f"refine_{f.name}": getattr(refine, f.name) for f in dataclasses.fields(Refine)
                if f.name in ("holdout", "max_tokens", "eval_every") and getattr(refine, f.name) != f.default})
    return out


def _distill_fields(distill: Distill | None, images: int) -> dict[str, Any]:
    if distill is None:
        return {"distill_steps": 0, "distill_images": images}
    if callable(distill.loss) or distill.forward is not None:
        raise ValueError("distill: a block run's distillation takes a loss by name and the model's own forward")
    out = {"distill_steps": distill.steps, "distill_lr": distill.learning_rate, "distill_batch": distill.batch_size,
           "distill_images": images, "distill_loss": distill.loss, "distill_temperature": distill.temperature,
           "distill_trainable": distill.trainable, "distill_schedule": distill.schedule,
           "distill_warmup": distill.warmup}
    out.update({f"distill_{f.name}": getattr(distill, f.name) for f in dataclasses.fields(Distill)
                if f.name in ("holdout", "eval_every") and getattr(distill, f.name) != f.default})
    return out


#: The block run's own fields (not the method's, refinement's or distillation's).
_RUN_FIELDS = tuple(f.name for f in dataclasses.fields(CompressionConfig)
                    if f.name not in ("method", "refine", "distill", "distill_images"))
#: The distillation a flat form's ``distill_steps`` turns on, but for the fields it gives (the block run's
#: defaults: the KL divergence of the logits at temperature 2).
_BLOCK_DISTILL = Distill(loss="kl", temperature=2.0)
#: The flat form's fields at today's defaults (what :meth:`CompressionConfig.from_flat` fills in).
DEFAULTS = {**CompressionConfig()._flat(), **_refine_fields(Refine()),
            **_distill_fields(_BLOCK_DISTILL, CompressionConfig.distill_images), "refine_steps": 0, "distill_steps": 0}
#: Fields added after runs were already saved, with the defaults that reproduce the old behaviour.
LATER_FIELDS = {"samples_per_rank": 0, "capture": "current", "warm_start": False, "selection": "objective",
                 "auto_judge": "block", "judge_images": 256, "refine_steps": 0, "refine_lr": 1e-3,
                 "refine_target": "local", "refine_batch": None, "distill_steps": 0,
                 "distill_schedule": "constant", "distill_warmup": 0, "patience": None, "best_iterate": False,
                 "contain": False}
#: The distillation's settings, left out of a run's identity without distillation.
DISTILL_FIELDS = ("distill_lr", "distill_batch", "distill_images", "distill_loss", "distill_temperature",
                   "distill_trainable", "distill_schedule", "distill_warmup")
