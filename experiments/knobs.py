"""The knobs of a training-free B-spline decoupling: basis size ν, samples S, sweeps, warm start.

Which settings of ``method="bsd"`` pay for themselves when a pretrained model is compressed with
a calibration batch and no fine-tuning? This study runs the protocol of
``training_free.py`` (every MLP replaced back to front at a whole-model reduction ρ, nothing
trained, 256 calibration images per block and seed) for B-spline variants that each change one
knob of the current defaults (cubic B-splines with ν = 4, ``S = max(128, 2r)``, 300 sweeps,
λ = 0.25, one random restart chosen by the solver's objective), next to pruning, the baseline to beat:

* ``bsd``: the defaults;
* ``bsd-nu8``, ``bsd-nu12``: ν = 8 or 12 coefficients per internal function (each costs ``r·ν``
  parameters, so the rank drops to keep the budget);
* ``bsd-s4``: ``S = max(128, 4r)`` sampling points;
* ``bsd-it100``: 100 sweeps instead of 300;
* ``bsd-warm``: one more restart, warm-started from the pruned MLP written as a decoupling, and
  the restart kept by its output error on held-out calibration tokens;
* ``bsd-warm-nu8``, ``bsd-warm-s4``: the warm start with ν = 8, or with ``S = max(128, 4r)``;
* ``bsd-warm-lam4``: the warm start with λ = 4, the outputs weighted 16 times more against the
  Jacobians (a training-free user measures outputs);
* ``prune``: the pruned MLP with its output layer refitted by least squares.

Paired verdicts are against ``bsd`` (the defaults), seed by seed.

Usage::

    python experiments/knobs.py                                       # ViT/Fashion-MNIST, ρ ∈ {0.2, 0.5}
    python experiments/knobs.py --model deit --dataset usps
    python experiments/knobs.py --quick                               # CI: ~2 min on 2 cores

Writes ``<out>/knobs_<model>_<dataset>.json`` (+ ``.csv``, ``.png``), resuming unit by unit under
``<out>/state/knobs_<model>_<dataset>/`` like ``training_free.py``.
"""

from __future__ import annotations

import sys

import training_free
from refinement import Setting

VARIANTS = tuple(map(Setting, ("bsd", "bsd-nu8", "bsd-nu12", "bsd-s4", "bsd-it100", "bsd-warm", "bsd-warm-nu8",
                               "bsd-warm-s4", "bsd-warm-lam4", "prune")))

FULL_VIT = dict(training_free.FULL_VIT, budgets=(0.2, 0.5), methods=VARIANTS)
FULL_DEIT = dict(training_free.FULL, budgets=(0.2, 0.5), methods=VARIANTS)
#: CI: the committed DeiT/USPS model, its last two blocks, 64 calibration images, ρ = 0.1, one seed,
#: the defaults against one variant of each kind (10 sweeps).
QUICK = dict(training_free.QUICK, budgets=(0.1,), seeds=1, methods=tuple(map(Setting, ("bsd", "bsd-warm-nu8", "bsd-s4-it5"))))


def main(argv=None) -> int:
    return training_free.main(argv, presets={"deit": FULL_DEIT, "vit": FULL_VIT, "quick": QUICK, "default": FULL_VIT},
                              stem="knobs", doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
