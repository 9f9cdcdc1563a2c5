"""Training of the models (Optax + Flax NNX): image classifiers and the character language model.

* :mod:`~jaxbsd.training.recipes`: :class:`TrainConfig`, every setting in one frozen dataclass
  (the ``jaxbsd train`` flags are generated from its fields), and :data:`RECIPES`, the recipe
  this project trained each (model, data set) with (:meth:`TrainConfig.recipe` picks it);
* :mod:`~jaxbsd.training.vision`: :func:`train` for any model with ``model(images) -> logits``
  (hard distillation for DeiT with a teacher) and the :func:`random_shift` augmentation;
* :mod:`~jaxbsd.training.lm`: :func:`train_lm`, next-character cross-entropy on a
  :class:`jaxbsd.data.TextDataset` (``train`` hands text data sets to it);
* :mod:`~jaxbsd.training.optim`: :func:`make_optimizer`, Adam(W) with a constant or cosine schedule;
* :mod:`~jaxbsd.training.loop`: the steps both loops share (per-epoch seeds, the step budget,
  progress, checkpoints after each epoch).

Evaluation (accuracy, bits per character) lives in :mod:`jaxbsd.evaluation`, checkpoints in
:mod:`jaxbsd.checkpoint`. ``TrainConfig.steps`` stops any training after that many steps.
Reproducibility: batches come from :func:`jaxbsd.data.batches` seeded per epoch from ``seed``,
stochastic-depth streams are reseeded from ``seed``, and every step is one jitted XLA computation,
so the same seed gives bit-identical parameters on CPU.
"""

from jaxbsd.training.lm import train_lm
from jaxbsd.training.optim import make_optimizer
from jaxbsd.training.recipes import RECIPES, TrainConfig
from jaxbsd.training.vision import random_shift, train

__all__ = ["TrainConfig", "RECIPES", "train", "train_lm", "make_optimizer", "random_shift"]
