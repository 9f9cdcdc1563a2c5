"""Training settings: :class:`TrainConfig` (names, defaults, validation) and :data:`RECIPES`.

The ``jaxbsd train`` flags are generated from :class:`TrainConfig`'s fields. Its defaults are the
paper's (Adam, learning rate 1e-4, batch 128, no augmentation); :data:`RECIPES` holds the recipe
this project trained each (model, data set) with, and :meth:`TrainConfig.recipe` picks it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxbsd.evaluation.checks import is_int, is_number

__all__ = ["TrainConfig", "RECIPES", "SCHEDULES", "resolve_config"]

#: The learning-rate schedules :class:`TrainConfig` and :func:`~jaxbsd.training.make_optimizer` accept.
SCHEDULES = ("constant", "cosine")


def _field(default, help: str, **extra):
    return dataclasses.field(default=default, metadata={"help": help, **extra})


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
    schedule: str = _field("constant", "learning-rate schedule", choices=SCHEDULES)
    warmup_epochs: float = _field(0.0, "linear warm-up length of the cosine schedule, in epochs")
    weight_decay: float = _field(0.0, "AdamW decay on weight matrices (0: plain Adam, the paper's)")
    label_smoothing: float = _field(0.0, "smoothing of the one-hot targets, in [0, 1)")
    shift: int = _field(0, "augment with random translations of up to this many pixels (0: none)")
    drop_path: float | None = _field(None, "stochastic-depth rate of the model (default: the preset's)")
    eval_batch_size: int = _field(512, "images per forward pass when evaluating")

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "eval_batch_size"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.steps is not None and (not is_int(self.steps) or self.steps < 1):
            raise ValueError(f"steps must be None or a positive int, got {self.steps!r}")
        for name in ("seed", "shift"):
            value = getattr(self, name)
            if not is_int(value) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        if not (is_number(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive finite number, got {self.lr!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        for name in ("warmup_epochs", "weight_decay"):
            value = getattr(self, name)
            if not (is_number(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if not (is_number(self.label_smoothing) and 0.0 <= self.label_smoothing < 1.0):
            raise ValueError(f"label_smoothing must lie in [0, 1), got {self.label_smoothing!r}")
        if self.drop_path is not None and not (is_number(self.drop_path) and 0.0 <= self.drop_path < 1.0):
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


def resolve_config(config: TrainConfig | None, settings: dict[str, Any]) -> TrainConfig:
    """``config`` (None: ``TrainConfig()``) with the field overrides ``settings`` applied; ``ValueError``
    for a ``config`` that is not a :class:`TrainConfig` or an unknown field."""
    if config is None:
        config = TrainConfig()
    elif not isinstance(config, TrainConfig):
        raise ValueError(f"config must be a TrainConfig, got {type(config).__name__}")
    if settings:
        config = config.replace(**settings)
    return config
