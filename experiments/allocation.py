"""Greedy against uniform rank allocation at the same parameter budget (beyond the paper).

The paper gives every MLP the same rank fraction (``allocation="uniform"``). jaxbsd's
``allocation="greedy"`` shares the same budget unevenly, giving parameters to the blocks where
the decoupling error on the calibration tokens falls fastest (see :func:`jb.compress_model`).
This script compares the two on the ViT on Fashion-MNIST: back to front, cubic B-splines ν = 4,
the whole model reduced by ρ (default 0.5: at most half of its parameters), the same seeds for
both (a seed sets the capture images, the tokens, the solver and the fine-tuning), accuracy on
the full test split after each decoupling and after each fine-tuning. A fine-tuning is kept only
if validation accuracy (10 % of the training subset) does not fall.

Usage::

    python experiments/allocation.py             # 3 seeds, ρ = 0.5, 1 epoch on 10,000 images per step
    python experiments/allocation.py --quick     # CI: 1 seed, weak quick model, no fine-tuning

Writes ``<out>/allocation.json`` (every step of every run, per-allocation mean ± std, the
paired differences and a verdict). Each (seed, allocation) run resumes from
``<out>/state/allocation/`` after its last finished step.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys

import numpy as np
from flax import nnx

from jaxbsd.compression import blockwise as compress
from jaxbsd.data import load_dataset
from jaxbsd.models import count_params
from jaxbsd.evaluation import evaluate

from checkout import RESULTS
from output import Timer, command_line, write_json
from trained import load_or_train, subset
from verdicts import mean_std, paired_verdict

ALLOCATIONS = ("uniform", "greedy")


def verdict(greedy: np.ndarray, uniform: np.ndarray, alpha: float = 0.05) -> dict:
    """Paired comparison over seeds (:func:`paired_verdict`): mean difference
    (greedy − uniform), paired t-test, and "greedy better" / "uniform better" / "within noise"."""
    v = paired_verdict(greedy, uniform, better="greedy better", worse="uniform better", alpha=alpha)
    spread = len(v["diffs"]) >= 2 and np.std(v["diffs"]) > 0
    return {"mean_difference": v["mean_diff"], "differences": v["diffs"],
            "p_value_paired_t": v["p_ttest"] if spread else None, "verdict": v["verdict"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI size: 1 seed, quick model, no fine-tuning")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--reduction", type=float, default=0.5)
    parser.add_argument("--epochs", type=int, default=1, help="fine-tuning epochs per step")
    parser.add_argument("--train-subset", type=int, default=10000)
    parser.add_argument("--max-iter", type=int, default=100)
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.epochs, args.train_subset, args.max_iter = 1, 0, 2000, 20
    command = command_line("allocation.py", argv)
    timer = Timer()
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    dataset = load_dataset("fashion-mnist")
    data = subset(dataset, train=args.train_subset, seed=0)
    if args.quick:
        data = subset(dataset, train=args.train_subset, test=1000, seed=0)
    prefix = "allocation_quick" if args.quick else "allocation"
    # One trained model, loaded and evaluated once; each run compresses its own copy.
    original, source = load_or_train(
        "vit", "fashion-mnist", quick_dir=args.out / "checkpoints" if args.quick else None, log=log)
    params_original = count_params(original)
    acc_original = evaluate(original, data.test_images, data.test_labels)
    runs = []
    for seed in range(args.seeds):
        for allocation in ALLOCATIONS:
            model = nnx.clone(original)
            solver = dataclasses.replace(compress.PAPER_BSD.config, max_iter=args.max_iter)
            config = compress.CompressionConfig(method=dataclasses.replace(compress.PAPER_BSD, config=solver),
                                                reduction=args.reduction, allocation=allocation,
                                                finetune_epochs=args.epochs, seed=seed)
            state = args.out / "state" / prefix / f"seed{seed}-{allocation}"
            t = Timer()
            steps = compress.compress(model, data, order="back-to-front", config=config, state_dir=state,
                                      progress=False)
            last = steps[-1]
            run = {"seed": seed, "allocation": allocation, "ranks": {s["block"]: s["rank"] for s in steps},
                   "params_original": params_original, "params": count_params(model),
                   "acc_original": 100 * acc_original, "acc_cmtf": 100 * last["acc_cmtf"],
                   "acc_ft": 100 * last["acc_ft"], "steps": steps, "seconds": t()}
            runs.append(run)
            log(f"seed {seed} {allocation:8s} ranks {run['ranks']} params {run['params']}/{params_original}: "
                f"after decoupling {run['acc_cmtf']:.2f} %, after fine-tuning {run['acc_ft']:.2f} %")
    summary = {}
    for allocation in ALLOCATIONS:
        sel = [r for r in runs if r["allocation"] == allocation]
        summary[allocation] = {k: mean_std([r[k] for r in sel]) for k in ("acc_cmtf", "acc_ft", "params")}
    paired = {k: verdict([r[k] for r in runs if r["allocation"] == "greedy"],
                         [r[k] for r in runs if r["allocation"] == "uniform"]) for k in ("acc_cmtf", "acc_ft")}
    payload = {"command": command, "mode": "quick" if args.quick else "full", "model": source,
               "protocol": {"reduction": args.reduction, "order": "back-to-front", "basis": "BSD nu=4 d=3",
                            "seeds": args.seeds, "finetune_epochs": args.epochs, "train_subset": args.train_subset,
                            "max_iter": args.max_iter, "test_images": int(data.test_images.shape[0])},
               "runs": runs, "summary": summary, "paired": paired, "wall_seconds": timer()}
    path = write_json(args.out / f"{prefix}.json", payload)
    for k, v in paired.items():
        print(f"{k}: greedy − uniform = {v['mean_difference']:+.2f} points (p = {v['p_value_paired_t']}): {v['verdict']}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
