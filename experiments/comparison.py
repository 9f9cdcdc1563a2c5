"""Claim (1) of the paper (§6.5, Table deit-usps): at equal parameters, B-spline decoupling beats
SVD and DRONE — accuracy against parameters, with seeds and a computed verdict.

The trained DeiT (``checkpoints/deit-usps``: embedding 96, depth 6, 3 heads, MLP 384; trained
with hard distillation from the ViT/USPS teacher) is compressed at several target reductions ρ
of the *whole model's* parameters (P = all ``nnx.Param`` leaves; the compressed model keeps at
most ``(1 − ρ)·P``: the budget rule of ``jaxbsd.compress`` / ``jb.compress_model``, which plans
the ranks up front), by four methods:

* ``svd`` (Hajimolahoseini et al.): truncated SVD of both dense layers of every MLP;
* ``drone`` (Chen et al.): data-aware low rank of both layers from the layers' real inputs;
* ``bsd``: R-CMTF-BSD decoupling (cubic B-splines, ν = 4, λ = 0.25), the same rank per block
  (``allocation="uniform"``);
* ``bsd-greedy``: the same with ``allocation="greedy"`` (ranks go where the output error falls
  fastest per parameter; same budget);
* ``prune`` (ViT/Fashion-MNIST by default; ``--methods`` adds it elsewhere): structured pruning
  of the hidden units, keeping the ``k`` largest ``‖V1[:, j]‖ · RMS(h_j)`` on the calibration
  tokens, with the output layer refitted by least squares (``jaxbsd.compression.baselines.prune_weights``).

Each (method, ρ, seed) is one run: all blocks back to front (BF), the whole model fine-tuned
after every block with the *same* budget for every method (``--epochs`` epochs of Adam, lr 1e-4,
batch 128, on ``--train-subset`` training images; the ViT teacher for DeiT's distillation head).
A seed sets the sampling points, the solver key, the validation hold-out and the fine-tuning
order (``CompressionConfig.seed``); the data subsets are the same for every seed, so runs with
one seed are paired across methods. S grows with the rank: ``S = max(128, 2r)`` per block
(``--samples N`` fixes S instead); the S used is recorded per step.

Reported: mean ± std (over seeds) of the top-1 test accuracy per (method, ρ), the parameters,
and per ρ a paired comparison of every method against ``bsd`` (paired t-test and sign test over
the seeds, :func:`verdicts.paired_verdict`): "holds" (bsd better, p < 0.05), "does not hold" (bsd worse,
p < 0.05) or "within noise". A ρ the MLPs alone cannot reach (DeiT's MLPs hold 66 % of its
parameters, so ρ = 0.7 cannot be met by compressing MLPs) is recorded as infeasible.

``--model vit --dataset fashion-mnist`` runs the same curve on the ViT/Fashion-MNIST model (no
teacher), by default with a lighter fine-tuning budget (1 epoch on 10,000 images per block), and
with ``prune`` as a fifth method. Adding a method adds units: the protocol key and every other
unit's tag are unchanged, so a study resumed with more methods keeps its finished units.

The units, their identities, the summary and the writers are :mod:`compression_study`'s, shared
with ``experiments/training_free.py`` (the same units without any fine-tuning); this script holds
the study's presets and command line.

Usage::

    python experiments/comparison.py                 # DeiT/USPS: 5 ρ × 4 methods × 3 seeds
    python experiments/comparison.py --model vit --dataset fashion-mnist
    python experiments/comparison.py --quick         # CI: ViT/Fashion-MNIST quick model, 2 ρ, 2 seeds
    python experiments/comparison.py --smoke         # tests: DeiT quick model, 2 blocks, 1 ρ, 2 seeds

Writes ``<out>/<prefix>.json`` (every run's record, the summary, the verdicts, the command,
provenance, wall time), ``.csv`` and ``.png`` (accuracy against parameters, error bars = std over
seeds, the original model as a horizontal line); prefix ``comparison`` (DeiT/USPS),
``comparison_<model>_<dataset>`` otherwise, ``comparison_quick`` / ``comparison_smoke``.
Resume: every (method, ρ, seed) run is one unit of state under
``<out>/state/<prefix>/<protocol key>/``: a finished unit is saved as ``unit.json`` and not
recomputed; an unfinished one resumes after its last finished block (``compress(state_dir=...)``).
"""

from __future__ import annotations

import argparse
import sys

from compression_study import add_arguments, apply_overrides, run_study
from refinement import Setting

PAPER = {  # Table deit-usps: method -> (top-1 %, parameters, reduction %)
    "DeiT": (94.77, 668650, 0.0),
    "SVD": (94.68, 537322, 19.64),
    "B-spline (20 %)": (94.75, 524650, 21.54),
    "DRONE": (94.39, 318442, 52.38),
    "B-spline (50 %)": (94.41, 300010, 55.13),
}

METHODS = tuple(map(Setting, ("bsd", "svd", "drone", "bsd-greedy", "prune")))

#: Per mode: model, data set, budgets and sizes. ``epochs``/``train_subset``: the fine-tuning
#: budget after every block, the same for every method (DeiT's full default: 3 epochs on the
#: whole training split). The DeiT study's committed result and command cover the first four methods.
FULL = dict(model="deit", dataset="usps", budgets=(0.1, 0.2, 0.35, 0.5, 0.7), methods=METHODS[:4], seeds=3,
            epochs=3, train_subset=None, test_subset=None, blocks=None, max_iter=300)
FULL_VIT = dict(FULL, model="vit", dataset="fashion-mnist", epochs=1, train_subset=10000, methods=METHODS)
QUICK = dict(model="vit", dataset="fashion-mnist", budgets=(0.05, 0.15), methods=METHODS, seeds=2, epochs=1,
             train_subset=300, test_subset=300, blocks=1, max_iter=10)
SMOKE = dict(model="deit", dataset="usps", budgets=(0.2,), methods=METHODS, seeds=2, epochs=1, train_subset=200,
             test_subset=200, blocks=2, max_iter=5)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="CI size (ViT/Fashion-MNIST quick model)")
    mode.add_argument("--smoke", action="store_true", help="smallest run (tests)")
    add_arguments(parser, METHODS)
    parser.add_argument("--teacher", default=None, help="DeiT's teacher (default checkpoints/vit-usps)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="fine-tuning epochs after every block, every method (DeiT: 3; ViT: 1)")
    parser.add_argument("--train-subset", type=int, default=None,
                        help="training images for fine-tuning and sampling (0 = all; DeiT: all; ViT: 10000)")
    args = parser.parse_args(argv)
    if args.smoke:
        plan = dict(SMOKE)
    elif args.quick:
        plan = dict(QUICK)
    else:
        plan = dict(FULL_VIT if (args.model or "deit") == "vit" else FULL)
    plan = apply_overrides(plan, args, ("model", "dataset", "epochs", "budgets", "methods", "seeds", "max_iter",
                                        "train_subset", "test_subset"))
    kind, name = plan["model"], plan["dataset"]
    if args.smoke or args.quick:
        prefix = "comparison_smoke" if args.smoke else "comparison_quick"
    else:
        prefix = "comparison" if (kind, name) == ("deit", "usps") else f"comparison_{kind}_{name}"

    def describe(plan, data, teacher, order):
        return (f"{kind}/{name}; every method compresses the MLPs of blocks {order} back to front under "
                "the budget rule params <= (1 - rho) * P (P = all nnx.Param scalars of the model; ranks "
                "planned by jaxbsd.compress); the whole model is fine-tuned for "
                f"{plan['epochs']} epoch(s) on {data.train_images.shape[0]} training images after every "
                "block (Adam, lr 1e-4, batch 128, 10 % validation hold-out decides whether fine-tuned "
                "weights are kept" + (", hard distillation from the ViT teacher" if teacher else "") + "); "
                + (f"S = {args.samples} per block" if args.samples else "S = max(128, 2r) per block")
                + "; a seed sets the sampling points, the solver key, the hold-out and the fine-tuning order")

    mode_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    return run_study(args, plan, prefix, script="comparison.py", argv=argv, mode=mode_name, describe=describe,
                     title=f"{kind} on {name}", paper=PAPER if kind == "deit" else None)


if __name__ == "__main__":
    sys.exit(main())
