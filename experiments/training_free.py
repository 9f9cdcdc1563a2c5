"""Compression without fine-tuning: B-spline decoupling against SVD, DRONE and pruning at equal budgets.

Every method gets the same whole-model parameter budget, a calibration batch and nothing else.

Many users compress a pretrained model with a calibration batch and no training pipeline
(SVD-LLM, ASVD and FLAP are training-free). This study measures that setting directly: every
MLP of the trained model is replaced back to front at a target reduction ρ of the *whole
model's* parameters (the compressed model keeps at most ``(1 − ρ)·P``, the budget rule of
``jaxbsd.compress`` / ``jb.compress_model``, ranks planned up front), and nothing is trained at
any step. Methods:

* ``bsd``: R-CMTF-BSD decoupling (cubic B-splines, ν = 4, λ = 0.25), the same rank per block;
* ``bsd-greedy``: the same with ``allocation="greedy"``;
* ``svd``: truncated SVD of both dense layers of every MLP;
* ``drone``: data-aware low rank of both layers from the layers' real inputs;
* ``prune``: keep the ``k`` hidden units with the largest ``‖V1[:, j]‖ · RMS(h_j)`` on the
  calibration tokens and refit the output layer (weights and bias) by least squares
  (``jaxbsd.compression.baselines.prune_weights``): an ordinary narrower MLP with the original activation;
* ``auto``: per block, the better of a warm-started decoupling and a pruned MLP in the block's
  share of the budget, judged by the whole model's outputs (against the original model's) on
  2048 training images held out from the block's calibration images (``auto_judge="model"``,
  ``judge_images=2048``; units run with 256 judge images before keep their own run ids);
* ``auto-block``: the same, judged by the block's output error on held-out calibration tokens
  (``auto_judge="block"``, the rule before);
* ``bsd-warm``: ``bsd`` plus one restart warm-started from the pruned MLP, the restart kept by
  its output error on held-out calibration tokens; other B-spline variants can be named on the
  command line (``--methods bsd-nu8 bsd-warm-it100 …``, see :func:`compression_study.bsd_variant`).

A seed sets the calibration sample (256 training images per block, drawn per step) and the
solver key; runs with one seed are paired across methods. S (the solver's sampling points)
grows with the rank, ``S = max(128, 2r)``, as in ``comparison.py``. Each run records the method,
ρ, seed, top-1 test accuracy after the last replacement, parameters, and per block the rank
and the relative output error on up to 8192 calibration tokens.

The units, resume, summary, paired verdicts against ``bsd``, CSV and plot are those of
``experiments/comparison.py`` (:func:`compression_study.run_study`) with 0 fine-tuning epochs and no
validation hold-out (nothing is selected on it).

Usage::

    python experiments/training_free.py                                  # DeiT/USPS
    python experiments/training_free.py --model vit --dataset fashion-mnist
    python experiments/training_free.py --quick                          # CI: ~2 min on 2 cores

Writes ``<out>/training_free_<model>_<dataset>.json`` (every run's record, the summary, the
verdicts, the command, provenance, wall time), ``.csv`` and ``.png`` (accuracy against
parameters, error bars = std over seeds); ``training_free_quick`` in quick mode. Resume: every
(method, ρ, seed) run is one unit under ``<out>/state/<prefix>/<protocol key>/`` (``unit.json``
once finished; an unfinished one resumes after its last finished block).
"""

from __future__ import annotations

import argparse
import sys

import compression_study
from refinement import Setting

METHODS = tuple(map(Setting, ("bsd", "svd", "drone", "prune", "bsd-greedy", "auto", "bsd-warm", "auto-block")))

#: Training-free presets: no fine-tuning (``epochs`` 0), no hold-out, no teacher; the whole
#: training split is the pool the calibration images are drawn from.
FULL = dict(model="deit", dataset="usps", budgets=(0.1, 0.2, 0.35, 0.5), methods=METHODS, seeds=3, epochs=0,
            train_subset=None, test_subset=None, blocks=None, max_iter=300, val_fraction=0.0, teacher=False)
FULL_VIT = dict(FULL, model="vit", dataset="fashion-mnist")
#: CI: the committed DeiT/USPS model (data under $JAXBSD_DATA), its last two blocks, 64
#: calibration images, 300 test images, one ρ, two seeds, B-spline (10 sweeps) against pruning.
QUICK = dict(FULL, budgets=(0.2,), methods=(Setting("bsd"), Setting("prune")), seeds=2, test_subset=300, blocks=2, max_iter=10,
             capture_images=64)


def main(argv=None, *, presets: dict | None = None, stem: str = "training_free", doc: str | None = None,
         script: str | None = None, plotter=None) -> int:
    """Run the study. ``presets`` (``{"deit"|"vit"|"quick"|"default": plan}``) and ``stem``
    (the output name ``<stem>_<model>_<dataset>``) let another study reuse it (``knobs.py``,
    ``refine_ablation.py``); ``plotter``: its plot (:func:`compression_study.run_study`)."""
    presets = presets or {"deit": FULL, "vit": FULL_VIT, "quick": QUICK, "default": FULL}
    parser = argparse.ArgumentParser(description=(doc or __doc__).split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI size (DeiT/USPS, 2 blocks, 1 ρ, 2 seeds, 2 methods)")
    compression_study.add_arguments(parser, METHODS, quick="deit/usps", budgets="0.1 0.2 0.35 0.5")
    args = parser.parse_args(argv)
    plan = dict(presets["quick"] if args.quick else presets[args.model or "default"])
    plan = compression_study.apply_overrides(plan, args, ("model", "dataset", "budgets", "methods", "seeds", "max_iter",
                                                   "test_subset"))
    kind, name = plan["model"], plan["dataset"]
    prefix = f"{stem}_quick" if args.quick else f"{stem}_{kind}_{name}"
    capture = plan.get("capture_images", 256)

    def describe(plan, data, teacher, order):
        direction = plan.get("order", "back-to-front").replace("-", " ")
        return (f"{kind}/{name}; training-free: every method compresses the MLPs of blocks {order} {direction} "
                "under the budget rule params <= (1 - rho) * P (P = all nnx.Param scalars of the model; ranks "
                "planned by jaxbsd.compress on the original model), with no fine-tuning at any step; each block "
                f"is compressed from {capture} calibration images of the {data.train_images.shape[0]} training "
                "images, drawn per block and seed, on the current (partly compressed) model; "
                + (f"S = {args.samples} per block" if args.samples else "S = max(128, 2r) per block")
                + "; a seed sets the calibration images and the solver key")

    return compression_study.run_study(args, plan, prefix, script=script or f"{stem}.py", argv=argv,
                                       mode="quick" if args.quick else "full", describe=describe,
                                       title=f"{kind} on {name}, training-free", plotter=plotter)


if __name__ == "__main__":
    sys.exit(main())
