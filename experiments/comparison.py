"""Comparison with SVD and DRONE on DeiT/USPS (paper §6.5, Table deit-usps).

The trained DeiT (``checkpoints/deit-usps.npz``: embedding 96, depth 6, 3 heads, MLP 384; trained
with hard distillation from the ViT/USPS teacher) is compressed three ways at two parameter
budgets, about 20 % and 50 % fewer parameters than the whole model:

* **SVD** (Hajimolahoseini et al.): truncated SVD of both dense layers of every MLP;
* **DRONE** (Chen et al.): data-aware low rank of both layers from the layers' real inputs;
* **B-spline**: R-CMTF-BSD decoupling (cubic B-splines, ν = 4, λ = 0.25, S = 128).

Budgets: the low-rank rank k is the largest whose whole model has at most ``(1 − ρ) · P``
parameters (``jaxbsd.baselines.lowrank_rank_for_budget`` per MLP, ρ = 0.2, 0.5); SVD and DRONE
then have the same count, and the B-spline rank is the largest whose decoupled MLP has at most the
low-rank MLP's parameters (``bsd_rank_for_budget``), so the B-spline model never has more
parameters than the baseline it is compared with.

Every method gets the same fine-tuning: all blocks, back to front (BF), ``--epochs`` epochs of
Adam (lr 1e-4, batch 128) on the whole training split after every block, with the ViT/USPS
teacher for the distillation head (DeiT's hard distillation). The paper does not state its
fine-tuning budget; the full mode uses 3 epochs per step (18 epochs per method; 5 per step, the
§5.3 value, would take about 80 min on 2 shared cores). Accuracy is top-1 on the 2007 USPS test
images.

Usage::

    python experiments/comparison.py             # full: 2 budgets × 3 methods, 3 FT epochs per step
    python experiments/comparison.py --quick     # CI: 1 FT epoch on 1000 images, 500 test images
    python experiments/comparison.py --smoke     # tests: last 2 blocks only, 10 % budget

Writes ``<out>/comparison.json`` (``comparison_quick``/``comparison_smoke`` in the small modes)
with the table, every step record and the command, ``comparison.csv`` and a bar chart
``comparison.png``. Interrupted runs resume from ``<out>/state/comparison/`` (one compress state
directory per method and budget).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import common  # noqa: E402  (sets BLAS threads before numpy/JAX are imported)

import numpy as np  # noqa: E402

import jaxbsd as jb  # noqa: E402
from jaxbsd import baselines  # noqa: E402
from jaxbsd.compress import CompressionConfig, block_order, compress  # noqa: E402
from jaxbsd.data import load_dataset  # noqa: E402
from jaxbsd.models import count_params  # noqa: E402
from jaxbsd.train import evaluate, load_checkpoint  # noqa: E402

PAPER = {  # Table deit-usps: method -> (top-1 %, parameters, reduction %)
    "DeiT": (94.77, 668650, 0.0),
    "SVD": (94.68, 537322, 19.64),
    "B-spline (20 %)": (94.75, 524650, 21.54),
    "DRONE": (94.39, 318442, 52.38),
    "B-spline (50 %)": (94.41, 300010, 55.13),
}

FULL = dict(budgets=(0.2, 0.5), methods=("svd", "drone", "bsd"), epochs=3, train_subset=None, test_subset=None,
            blocks=None, max_iter=300)
QUICK = dict(budgets=(0.2, 0.5), methods=("svd", "drone", "bsd"), epochs=1, train_subset=1000, test_subset=500,
             blocks=None, max_iter=30)
SMOKE = dict(budgets=(0.1,), methods=("svd", "drone", "bsd"), epochs=1, train_subset=300, test_subset=200,
             blocks=2, max_iter=10)
NAMES = {"svd": "SVD", "drone": "DRONE", "bsd": "B-spline"}


def budget_plan(model, reduction: float, dof: int, blocks: list[int]) -> dict:
    """Ranks and parameter counts for a target ``reduction`` of the whole model's parameters,
    compressing the MLPs of ``blocks``."""
    total = count_params(model)
    mlps = [model.blocks[i].mlp for i in blocks]
    m, hidden = mlps[0].dim, mlps[0].hidden
    mlp_params = count_params(mlps[0])
    rest = total - mlp_params * len(blocks)
    target = int(np.floor((1 - reduction) * total))
    per_block = (target - rest) // len(blocks)
    k = baselines.lowrank_rank_for_budget(m, hidden, per_block)
    low = baselines.lowrank_mlp_params(m, hidden, k)
    r = baselines.bsd_rank_for_budget(m, m, dof, low)
    bsd = jb.metrics.params_bsd(m, m, r, dof)
    return {
        "reduction_target": reduction, "params_original": total, "params_target": target,
        "mlp_params_original": mlp_params, "mlp_budget": per_block, "lowrank_rank": k,
        "lowrank_mlp_params": low, "lowrank_total": rest + low * len(blocks), "bsd_rank": r,
        "bsd_mlp_params": bsd, "bsd_total": rest + bsd * len(blocks), "m": m, "hidden": hidden,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="CI size")
    mode.add_argument("--smoke", action="store_true", help="smallest run (tests)")
    parser.add_argument("--checkpoint", default=None, help="trained DeiT (default checkpoints/deit-usps.npz)")
    parser.add_argument("--teacher", default=None, help="teacher (default checkpoints/vit-usps.npz)")
    parser.add_argument("--epochs", type=int, default=None, help="fine-tuning epochs after every block (full: 3)")
    parser.add_argument("--budgets", type=float, nargs="+", default=None, help="target reductions (full: 0.2 0.5)")
    parser.add_argument("--methods", nargs="+", choices=tuple(NAMES), default=None)
    parser.add_argument("--dof", type=int, default=4, help="ν of the B-splines")
    parser.add_argument("--degree", type=int, default=3, help="degree of the B-splines")
    parser.add_argument("--samples", type=int, default=128, help="S per block")
    parser.add_argument("--max-iter", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=pathlib.Path, default=common.RESULTS)
    args = parser.parse_args(argv)
    plan = dict(SMOKE if args.smoke else QUICK if args.quick else FULL)
    for name in ("epochs", "budgets", "methods", "max_iter"):
        if getattr(args, name) is not None:
            plan[name] = tuple(getattr(args, name)) if isinstance(getattr(args, name), list) else getattr(args, name)
    prefix = "comparison_smoke" if args.smoke else "comparison_quick" if args.quick else "comparison"
    args.out.mkdir(parents=True, exist_ok=True)
    command = common.command_line("comparison.py", argv)
    timer = common.Timer()

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    small = args.quick or args.smoke
    quick_dir = args.out / "checkpoints" if small else None
    dataset = load_dataset("usps")
    teacher, teacher_info = common.load_or_train("vit", "usps", checkpoint=args.teacher, quick_dir=quick_dir, log=log)
    model, deit_info = common.load_or_train("deit", "usps", checkpoint=args.checkpoint, quick_dir=quick_dir, log=log)
    data = common.subset(dataset, train=plan["train_subset"], test=plan["test_subset"], seed=args.seed)

    deit_path = pathlib.Path(deit_info["checkpoint"])
    deit_path = deit_path if deit_path.is_absolute() else common.ROOT / deit_path

    def fresh():
        return load_checkpoint(deit_path)[0]

    depth = len(model.blocks)
    order = list(block_order("back-to-front", depth))
    if plan["blocks"]:
        order = order[: plan["blocks"]]
    acc_original = evaluate(model, data.test_images, data.test_labels)
    acc_teacher = evaluate(teacher, data.test_images, data.test_labels)
    params_original = count_params(model)
    log(f"DeiT: {params_original} parameters, test accuracy {100 * acc_original:.2f} % "
        f"(teacher ViT {100 * acc_teacher:.2f} %) on {data.test_images.shape[0]} images; blocks {order}")

    rows = [{"method": "DeiT", "budget": None, "accuracy": 100 * acc_original, "params": params_original,
             "reduction": 0.0, "rank": None}]
    runs = []
    for reduction in plan["budgets"]:
        budget = budget_plan(model, reduction, args.dof, order)
        log(f"budget {100 * reduction:.0f} %: low-rank k = {budget['lowrank_rank']} "
            f"({budget['lowrank_total']} params), B-spline r = {budget['bsd_rank']} ({budget['bsd_total']} params)")
        for method in plan["methods"]:
            rank = budget["bsd_rank"] if method == "bsd" else budget["lowrank_rank"]
            config = CompressionConfig(
                method=method, basis=jb.BSpline(args.degree, args.dof), rank=rank, lam=0.25,
                max_iter=plan["max_iter"], num_samples=args.samples, finetune_epochs=plan["epochs"],
                seed=args.seed,
            )
            tag = json.dumps({"config": config.to_dict(), "order": order, "train": plan["train_subset"],
                              "test": plan["test_subset"], "ckpt": deit_info["checkpoint"]}, sort_keys=True)
            state = args.out / "state" / prefix / f"{method}-{int(100 * reduction)}-{hashlib.sha256(tag.encode()).hexdigest()[:8]}"
            if done := common.finished_steps(state):
                log(f"  {NAMES[method]} {100 * reduction:.0f} %: resuming after step {done} from {common._rel(state)}")
            t0 = common.Timer()
            m = fresh()
            steps = compress(m, data, order=order, config=config, state_dir=state, teacher=teacher, progress=False,
                             on_step=lambda s: log(f"  {NAMES[method]} {100 * reduction:.0f} % step {s['step']} "
                                                   f"(block {s['block']}): after compression "
                                                   f"{100 * s['acc_cmtf']:.2f} %, after FT {100 * s['acc_ft']:.2f} %"))
            params = count_params(m)
            acc = steps[-1]["acc_ft"]
            name = f"{NAMES[method]} ({100 * reduction:.0f} %)"
            rows.append({"method": name, "budget": reduction, "accuracy": 100 * acc, "params": params,
                         "reduction": jb.metrics.savings_percentage(params, params_original), "rank": rank})
            runs.append({"method": method, "budget": budget, "config": config.to_dict(), "order": order,
                         "state_dir": common._rel(state), "steps": steps, "seconds": t0()})
            log(f"{name}: {100 * acc:.2f} %, {params} parameters ({rows[-1]['reduction']:.2f} % fewer), {t0():.0f} s")

    table = format_table(rows)
    print(table)
    payload = {
        "command": command,
        "mode": "smoke" if args.smoke else "quick" if args.quick else "full",
        "plan": {k: list(v) if isinstance(v, tuple) else v for k, v in plan.items()},
        "protocol": ("DeiT/USPS; every method compresses the MLPs of the listed blocks back to front and "
                     f"fine-tunes the whole model for {plan['epochs']} epoch(s) after every block (Adam, lr 1e-4, "
                     "batch 128, hard distillation from the ViT teacher); ranks from the budget helpers so "
                     "that B-spline params <= low-rank params <= (1 - target) * original"),
        "model": deit_info, "teacher": teacher_info, "teacher_accuracy": 100 * acc_teacher,
        "test_images": int(data.test_images.shape[0]), "train_images": int(data.train_images.shape[0]),
        "blocks": order, "rows": rows, "paper": {k: dict(zip(("accuracy", "params", "reduction"), v))
                                                 for k, v in PAPER.items()},
        "table": table, "runs": runs, "wall_seconds": timer(),
    }
    common.write_json(args.out / f"{prefix}.json", payload)
    with open(args.out / f"{prefix}.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method", "top1_accuracy", "params", "reduction_percent", "rank"])
        for r in rows:
            w.writerow([r["method"], f"{r['accuracy']:.2f}", r["params"], f"{r['reduction']:.2f}", r["rank"]])
    plot(rows, args.out / f"{prefix}.png", acc_original)
    print(f"wrote {args.out / (prefix + '.json')}, .csv and .png ({timer():.0f} s)")
    return 0


def format_table(rows: list[dict]) -> str:
    """Our rows next to the paper's (Table deit-usps)."""
    paper_for = {"DeiT": "DeiT", "SVD (20 %)": "SVD", "DRONE (50 %)": "DRONE",
                 "B-spline (20 %)": "B-spline (20 %)", "B-spline (50 %)": "B-spline (50 %)"}
    lines = [f"{'method':<18}{'top-1 %':>9}{'params':>10}{'reduction':>11}{'rank':>6}   |"
             f" paper: {'top-1 %':>8}{'params':>9}{'reduction':>11}"]
    for r in rows:
        p = PAPER.get(paper_for.get(r["method"], ""), None)
        paper = f" {'':7}{p[0]:>8.2f}{p[1]:>9}{p[2]:>10.2f} %" if p else ""
        lines.append(f"{r['method']:<18}{r['accuracy']:>9.2f}{r['params']:>10}{r['reduction']:>9.2f} %"
                     f"{'' if r['rank'] is None else r['rank']:>6}   |{paper}")
    return "\n".join(lines)


def plot(rows: list[dict], path: pathlib.Path, acc_original: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"SVD": "tab:blue", "DRONE": "tab:orange", "B-spline": "tab:green", "DeiT": "tab:gray"}
    fig, ax = plt.subplots(figsize=(1.3 * len(rows) + 2, 4))
    xs = np.arange(len(rows))
    accs = [r["accuracy"] for r in rows]
    bars = ax.bar(xs, accs, color=[colors[r["method"].split(" (")[0]] for r in rows])
    for b, r in zip(bars, rows):
        ax.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{r['accuracy']:.2f}\n{r['params']:,}\n"
                f"-{r['reduction']:.1f} %", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(xs, [r["method"] for r in rows], rotation=20, ha="right", fontsize=8)
    low = min(accs)
    ax.set_ylim(max(0.0, low - 10), max(accs) + 4)
    ax.axhline(100 * acc_original, color="k", lw=0.8, ls="--")
    ax.set_ylabel("top-1 accuracy (%)")
    targets = sorted({r["budget"] for r in rows if r["budget"] is not None})
    ax.set_title("DeiT on USPS: compression at " + " and ".join(f"~{100 * t:.0f} %" for t in targets)
                 + " fewer parameters\n(labels: accuracy, parameters, reduction)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
