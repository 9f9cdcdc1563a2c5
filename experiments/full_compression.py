"""Full compression procedure, front-to-back vs back-to-front (paper §6.4, Figures Compression_ViT/
compression_Swin, appendix tables).

Every MLP of a trained ViT or Swin (three blocks each, embedding 64, MLP 256) is replaced one
block at a time, in front-to-back (FB) or back-to-front (BF) order, by

* R-CMTF-PD with polynomials of degree 3, or
* R-CMTF-BSD with ν = 4 and B-spline degree d = 1, 2, 3,

at rank r = 64 (the embedding width, so inputs = outputs = neurons), λ = 0.25, S = 128 tokens
per block drawn from 256 random training images, and the whole model is fine-tuned after every
replacement (Adam, lr 1e-4, batch 128). Each (order, basis) is run 3 times (seeds 0, 1, 2);
tables give mean ± std of the test accuracy after every decoupling step ("CMTF (k)") and every
fine-tuning step ("FT (k)"), like the paper's appendix tables.

Data sets: CIFAR-10 (the JPEG re-encoded copy) and Fashion-MNIST (standing in for the paper's
SVHN, which has no copy here). Models come from ``checkpoints/<model>-<dataset>`` or are
trained first with the recorded recipe (``experiments/results/training.json``). Swin has no
preset for 28×28 images (its patch is image_size // 8); on Fashion-MNIST it uses patch 7.

Differences from the paper, to fit two shared CPU cores (every one recorded in the JSON):

* fine-tuning uses ``--epochs`` epochs (paper: 5) on a fixed random ``--train-subset`` of the
  training split (paper: all of it); the defaults of the full mode, 2 epochs on 10,000 images,
  are 1/15 of the paper's fine-tuning compute per step;
* each run draws its own S = 128 sampling points (the paper reuses one draw for its 3 runs):
  ``jaxbsd.compress`` seeds the token draw, the solver and the fine-tuning from one seed.

Claim (2), BF beats FB, is tested under two capture protocols (``--capture``, default both):

* ``current``: each block's sampling points are re-captured at its step from the current, partly
  compressed and fine-tuned network (the procedure as implemented so far);
* ``original``: every block's sampling points are captured once from the original network,
  before any replacement (``CompressionConfig(capture="original")``); the block's current MLP is
  decoupled at those points.

Per protocol and basis the final test accuracy of BF and FB is compared paired over seeds
(``paired_verdict``: "BF better" / "FB better" / "within noise", paired t-test p < 0.05,
sign test beside it). The full mode's default is the protocol study: cubic B-splines (ν = 4),
both protocols, 2 orders × 3 seeds × 3 steps = 36 steps. ``--basis`` (repeatable) selects the
paper's other bases, ``--paper-budget`` the paper's fine-tuning (5 epochs on the full split).

``--model vit --dataset cifar10`` runs ViT on CIFAR-10 (trained first with
``jaxbsd.training.RECIPES[("vit", "cifar10")]`` if ``checkpoints/vit-cifar10`` does not exist;
data from ``$JAXBSD_DATA/cifar10-jpg.zip``); its JSON holds the paper's appendix table
(``paper``) beside ours. ``--budget-study`` runs ViT/Fashion-MNIST, BF, cubic, current capture at
our budget (2 epochs on 10,000 images per step) and at the paper's (5 epochs on the full split),
same seeds, and reports the difference (``full_compression_budget_study.json``).

Each run keeps its state in ``<out>/state/full_compression/...`` (``compress(state_dir=...)``):
rerunning the same command resumes an interrupted run after its last finished step.

Usage::

    python experiments/full_compression.py                                # protocol study, ViT / Fashion-MNIST
    python experiments/full_compression.py --paper-budget                 # the same at the paper's budget
    python experiments/full_compression.py --model vit --dataset cifar10 --capture current \\
        --basis "R-CMTF-PD d=3" --basis "R-CMTF-BSD nu=4 d=1" --basis "R-CMTF-BSD nu=4 d=2" \\
        --basis "R-CMTF-BSD nu=4 d=3"                                     # the paper's ViT/CIFAR-10 table
    python experiments/full_compression.py --budget-study
    python experiments/full_compression.py --quick                        # CI size

Writes, per model and data set, ``<out>/full_compression_<model>_<dataset>.json`` (all step
records, the tables per capture protocol, the verdicts, the command, provenance, wall time),
``.csv`` (the table) and ``.png`` (accuracy per step: one panel per basis and protocol, FB and BF
with ±1 std bands); ``full_compression_quick_*`` / ``_smoke_*`` in the small modes.
"""

from __future__ import annotations

import argparse
import dataclasses
import csv
import hashlib
import json
import pathlib
import sys

import numpy as np

import jaxbsd as jb
from jaxbsd.compression.blockwise import PAPER_BSD, CompressionConfig, compress
from jaxbsd.data import load_dataset
from jaxbsd.models import count_params
from jaxbsd.evaluation import evaluate
from jaxbsd.checkpoint import load_checkpoint

from checkout import RESULTS, ROOT, enable_compilation_cache, rel_path
from output import Timer, command_line, machine, write_json
from trained import checkpoint_key, load_or_train, subset
from units import resume_unit, save_unit
from verdicts import mean_std, paired_verdict

MODELS = ("vit", "swin")
DATASETS = ("fashion-mnist", "cifar10")
ORDERS = {"FB": "front-to-back", "BF": "back-to-front"}
BASES = {
    "R-CMTF-PD d=3": jb.Polynomial(3),
    "R-CMTF-BSD nu=4 d=1": jb.BSpline(1, 4),
    "R-CMTF-BSD nu=4 d=2": jb.BSpline(2, 4),
    "R-CMTF-BSD nu=4 d=3": jb.BSpline(3, 4),
}

CAPTURES = ("current", "original")
CUBIC = "R-CMTF-BSD nu=4 d=3"

#: Plans per mode. ``capture``: the sampling-point protocols compared (see the module docstring).
FULL = dict(models=("vit",), datasets=("fashion-mnist",), bases=(CUBIC,), capture=CAPTURES, runs=3, epochs=2,
            train_subset=10000, test_subset=None, max_iter=300, capture_images=256)
QUICK = dict(models=("vit",), datasets=("fashion-mnist",), bases=(CUBIC,), capture=CAPTURES, runs=2, epochs=1,
             train_subset=300, test_subset=300, max_iter=10, capture_images=32)
SMOKE = dict(models=("vit",), datasets=("fashion-mnist",), bases=(CUBIC,), capture=CAPTURES, runs=2, epochs=1,
             train_subset=256, test_subset=256, max_iter=10, capture_images=32)
#: The paper's fine-tuning budget (§5.3): 5 epochs on the whole training split after every step.
PAPER_BUDGET = dict(epochs=5, train_subset=None)
#: ``--budget-study``: ViT/Fashion-MNIST, BF, cubic, current capture, at our budget and the paper's.
BUDGET_STUDY = dict(model="vit", dataset="fashion-mnist", basis=CUBIC, order="BF", capture="current",
                    budgets={"ours": dict(epochs=FULL["epochs"], train_subset=FULL["train_subset"]),
                             "paper": PAPER_BUDGET})
BUDGET_STUDY_SMALL = {"ours": dict(epochs=1, train_subset=128), "paper": dict(epochs=2, train_subset=256)}

# The paper's appendix tables for CIFAR-10 (SVHN has no copy here), typed from the paper into
# paper_cifar10.json: per model the original accuracy and, per order, one row per step of
# [mean, std] per basis, in the order of BASES.
_STEPS = ("CMTF (1)", "FT (1)", "CMTF (2)", "FT (2)", "CMTF (3)", "FT (3)")


def _paper_tables() -> dict:
    """``{(model, "cifar10"): {"FB": {step: {basis: (mean, std)}}, "BF": {...}, "original": accuracy}}``."""
    tables = json.loads(pathlib.Path(__file__).with_name("paper_cifar10.json").read_text())
    def steps(rows: list) -> dict:
        return {s: {b: tuple(cell) for b, cell in zip(BASES, row, strict=True)} for s, row in zip(_STEPS, rows, strict=True)}

    return {(model, "cifar10"): {"FB": steps(t["FB"]), "BF": steps(t["BF"]), "original": t["original"]}
            for model, t in tables.items()}


PAPER = _paper_tables()


def _ckpt(info: dict) -> pathlib.Path:
    path = pathlib.Path(info["checkpoint"])
    return path if path.is_absolute() else ROOT / path


def run_one(kind: str, name: str, info: dict, data, *, order_name: str, basis_name: str, capture: str, seed: int,
            epochs: int, plan: dict, args, state_root: pathlib.Path, log) -> dict:
    """One compression run (all blocks in one order), resumed after its last finished step."""
    order = ORDERS[order_name]
    solver = dataclasses.replace(PAPER_BSD.config, basis=BASES[basis_name], max_iter=plan["max_iter"])
    config = CompressionConfig(method=dataclasses.replace(PAPER_BSD, config=solver), rank=None,
                               num_samples=args.samples, capture_images=plan["capture_images"],
                               finetune_epochs=epochs, seed=seed, capture=capture)
    tag = json.dumps({"config": config.to_dict(), "order": order, "ckpt": checkpoint_key(info["checkpoint"]),
                      "train": int(data.train_images.shape[0]), "test": int(data.test_images.shape[0])},
                     sort_keys=True)
    digest = hashlib.sha256(tag.encode()).hexdigest()[:8]
    basis_tag = basis_name.split()[-2:] if "BSD" in basis_name else ["pd", "d=3"]
    state = state_root / f"{capture}-{order_name}-{'-'.join(basis_tag).replace('=', '')}-seed{seed}-{digest}"
    label = f"{kind}/{name} {capture} {order_name} {basis_name} seed {seed}"
    # A finished run is kept as unit.json (tracked in git, unlike the step checkpoints), so a
    # study that spans sessions or machines resumes from its finished runs.
    if (kept := resume_unit(state, tag, label, log)) is not None:
        return kept
    t0 = Timer()
    model = load_checkpoint(_ckpt(info))[0]
    steps = compress(model, data, order=order, config=config, state_dir=state, progress=False)
    accs = "  ".join(f"{100 * s['acc_cmtf']:.2f}/{100 * s['acc_ft']:.2f}" for s in steps)
    log(f"  {label}: CMTF/FT per step {accs}  ({t0():.0f} s)")
    record = {"order": order_name, "basis": basis_name, "capture": capture, "seed": seed, "epochs": epochs,
              "train_images": int(data.train_images.shape[0]), "config": config.to_dict(),
              "state_dir": rel_path(state), "seconds": t0(), "machine": machine(),
              # compress() keeps validation accuracies per fine-tuning epoch (test accuracy is only
              # measured once per step, as acc_ft, so it never steers anything).
              "steps": [{k: v for k, v in s.items() if k != "finetune"}
                        | {"finetune_val_acc": [h.get("val_acc", h.get("test_acc")) for h in s.get("finetune", [])]}
                        for s in steps]}
    save_unit(state / "unit.json", tag, record)
    return record


def run_pair(kind: str, name: str, plan: dict, args, log) -> dict:
    """All capture protocols × orders × bases × runs for one model and data set."""
    timer = Timer()
    small = args.quick or args.smoke
    dataset = load_dataset(name)
    model, info = load_or_train(kind, name, quick_dir=args.out / "checkpoints" if small else None, log=log)
    data = subset(dataset, train=plan["train_subset"], test=plan["test_subset"], seed=args.seed)
    acc_original = evaluate(model, data.test_images, data.test_labels)
    params_original = count_params(model)
    log(f"{kind}/{name}: {params_original} parameters, test accuracy {100 * acc_original:.2f} % on "
        f"{data.test_images.shape[0]} images; fine-tuning {plan['epochs']} epoch(s) on "
        f"{data.train_images.shape[0]} images after every step")
    runs = []
    for capture in plan["capture"]:
        for order_name in ORDERS:
            for basis_name in plan["bases"]:
                for seed in range(args.seed, args.seed + plan["runs"]):
                    runs.append(run_one(kind, name, info, data, order_name=order_name, basis_name=basis_name,
                                        capture=capture, seed=seed, epochs=plan["epochs"], plan=plan, args=args,
                                        state_root=args.out / "state" / args.prefix / f"{kind}-{name}", log=log))
    depth = len(model.blocks)
    tables = {c: summarize([r for r in runs if r["capture"] == c], plan, depth) for c in plan["capture"]}
    verdicts = {c: {b: order_verdict([r for r in runs if r["capture"] == c and r["basis"] == b])
                    for b in plan["bases"]} for c in plan["capture"]}
    # Over every basis at once (pairs share seeds, so this is a summary, not independent evidence).
    pooled = {c: order_verdict([r for r in runs if r["capture"] == c]) for c in plan["capture"]}
    return {"model": kind, "dataset": name, "checkpoint": info, "accuracy_original": 100 * acc_original,
            "params_original": params_original, "params_final": runs[-1]["steps"][-1]["params_model"],
            "savings_final": runs[-1]["steps"][-1]["savings_model"],
            "train_images": int(data.train_images.shape[0]), "test_images": int(data.test_images.shape[0]),
            "runs": runs, "tables": tables, "verdicts": verdicts, "pooled_verdicts": pooled,
            "wall_seconds": timer(),
            # Runs kept from unit.json may come from another machine: the compute they cost and where.
            "run_seconds_total": sum(r["seconds"] for r in runs),
            "machines": sorted({r.get("machine", "not recorded") for r in runs})}


def order_verdict(runs: list[dict]) -> dict:
    """BF against FB on the final test accuracy (after the last fine-tuning), paired by (basis, seed)."""
    final = {(r["order"], r["basis"], r["seed"]): 100 * r["steps"][-1]["acc_ft"] for r in runs}
    pairs = sorted((b, s) for (o, b, s) in final if o == "BF" and ("FB", b, s) in final)
    v = paired_verdict([final[("BF", *k)] for k in pairs], [final[("FB", *k)] for k in pairs],
                              better="BF better", worse="FB better")
    v["seeds"] = sorted({s for _, s in pairs})
    v["pairs"] = len(pairs)
    return v


def summarize(runs, plan, depth) -> dict:
    """``tables[order][step label][basis] = {"mean", "std", "values"}`` in percent."""
    out = {}
    for order in ORDERS:
        out[order] = {}
        for k in range(1, depth + 1):
            for what, key in (("CMTF", "acc_cmtf"), ("FT", "acc_ft")):
                label = f"{what} ({k})"
                out[order][label] = {}
                for basis in plan["bases"]:
                    vals = [100 * s[key] for r in runs if r["order"] == order and r["basis"] == basis
                            for s in r["steps"] if s["step"] == k]
                    mean, std = mean_std(vals)
                    out[order][label][basis] = {"mean": mean, "std": std, "values": vals}
    return out


def format_tables(result: dict, plan: dict) -> str:
    bases = list(plan["bases"])
    short = {b: b.replace("R-CMTF-", "").replace("nu=", "ν=") for b in bases}
    lines = []
    for capture, t in result["tables"].items():
        lines += [f"{result['model']} + {result['dataset']}, sampling points captured from the {capture} network: "
                  f"original {result['accuracy_original']:.2f} %, mean ± std over runs (* = best in the row)",
                  f"{'':<10}" + "".join(f"{short[b]:>20}" for b in bases)]
        for order, name in (("FB", "Front to back"), ("BF", "Back to front")):
            lines.append(name)
            for label, cells in t[order].items():
                means = [cells[b]["mean"] for b in bases]
                best = int(np.nanargmax(means)) if any(np.isfinite(means)) else -1
                row = []
                for i, b in enumerate(bases):
                    c = cells[b]
                    row.append(f"{c['mean']:.2f} ± {c['std']:.3f}{'*' if i == best else ' '}")
                lines.append(f"  {label:<8}" + "".join(f"{x:>20}" for x in row))
        for b, v in result["verdicts"][capture].items():
            lines.append(f"  final accuracy, BF − FB ({short[b]}): {v['mean_diff']:+.2f} points over seeds "
                         f"{v['seeds']} (paired t-test p = {_p(v['p_ttest'])}, sign test p = {_p(v['p_sign'])}): "
                         f"{v['verdict']}")
        if len(bases) > 1 and (v := result.get("pooled_verdicts", {}).get(capture)):
            lines.append(f"  final accuracy, BF − FB over all bases ({v['pairs']} pairs): {v['mean_diff']:+.2f} points "
                         f"(paired t-test p = {_p(v['p_ttest'])}, sign test p = {_p(v['p_sign'])}): {v['verdict']}")
    paper = PAPER.get((result["model"], result["dataset"]))
    if paper:
        lines.append(f"paper ({result['model']} + {result['dataset']}, original {paper['original']:.2f} %):")
        for order in ("FB", "BF"):
            lines.append("  " + order)
            for label, cells in paper[order].items():
                lines.append(f"  {label:<8}" + "".join(
                    f"{cells[b][0]:>13.2f} ± {cells[b][1]:.3f}" if b in cells else f"{'':>20}" for b in bases))
    return "\n".join(lines)


def _p(p) -> str:
    return "n/a" if p is None else f"{p:.3g}"


def write_csv(result: dict, plan: dict, path: pathlib.Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["capture", "order", "step", *[f"{b} mean" for b in plan["bases"]],
                    *[f"{b} std" for b in plan["bases"]]])
        for capture, t in result["tables"].items():
            for order in ORDERS:
                for label, cells in t[order].items():
                    w.writerow([capture, order, label, *[f"{cells[b]['mean']:.3f}" for b in plan["bases"]],
                                *[f"{cells[b]['std']:.3f}" for b in plan["bases"]]])


def plot(result: dict, plan: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bases = list(plan["bases"])
    captures = list(result["tables"])
    fig, axes = plt.subplots(len(captures), len(bases), figsize=(max(3.6 * len(bases) + 0.5, 6.0),
                                                                  3.6 * len(captures) + 0.4),
                             sharey=True, squeeze=False)
    colors = {"FB": "tab:red", "BF": "tab:blue"}
    for row, capture in enumerate(captures):
        tables = result["tables"][capture]
        labels = ["original", *tables["FB"]]
        for ax, basis in zip(axes[row], bases):
            for order in ORDERS:
                cells = tables[order]
                mean = np.array([result["accuracy_original"], *[cells[s][basis]["mean"] for s in labels[1:]]])
                std = np.array([0.0, *[cells[s][basis]["std"] for s in labels[1:]]])
                x = np.arange(len(labels))
                ax.plot(x, mean, "o-", ms=3, color=colors[order], label=order)
                ax.fill_between(x, mean - std, mean + std, color=colors[order], alpha=0.25)
            ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=7)
            v = result["verdicts"][capture][basis]
            ax.set_title(f"{basis.replace('nu=', 'ν=')}, {capture} capture\n{v['verdict']} "
                         f"(BF − FB {v['mean_diff']:+.2f}, p = {_p(v['p_ttest'])})", fontsize=8)
            ax.grid(alpha=0.3)
        axes[row, 0].set_ylabel("test accuracy (%)")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"{result['model']} on {result['dataset']}: test accuracy, mean ± std over {plan['runs']} runs "
                 f"(fine-tuning {plan['epochs']} epoch(s) on {result['train_images']} images after every step)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def budget_study(plan: dict, args, command: str, log) -> pathlib.Path:
    """ViT/Fashion-MNIST, BF, cubic: the final accuracy at our fine-tuning budget and at the paper's."""
    timer = Timer()
    study = dict(BUDGET_STUDY)
    budgets = BUDGET_STUDY_SMALL if (args.quick or args.smoke) else study["budgets"]
    budgets = {k: dict(v) for k, v in budgets.items()}
    if args.epochs is not None:
        budgets["ours"]["epochs"] = args.epochs
    if args.train_subset is not None:
        budgets["ours"]["train_subset"] = args.train_subset or None
    kind, name = study["model"], study["dataset"]
    dataset = load_dataset(name)
    small = args.quick or args.smoke
    model, info = load_or_train(kind, name, quick_dir=args.out / "checkpoints" if small else None, log=log)
    results = {}
    for label, budget in budgets.items():
        data = subset(dataset, train=budget["train_subset"], test=plan["test_subset"], seed=args.seed)
        log(f"budget {label}: {budget['epochs']} epoch(s) on {data.train_images.shape[0]} images per step")
        runs = [run_one(kind, name, info, data, order_name=study["order"], basis_name=study["basis"],
                        capture=study["capture"], seed=seed, epochs=budget["epochs"], plan=plan, args=args,
                        state_root=args.out / "state" / args.prefix / f"budget-{label}", log=log)
                for seed in range(args.seed, args.seed + plan["runs"])]
        finals = [100 * r["steps"][-1]["acc_ft"] for r in runs]
        mean, std = mean_std(finals)
        results[label] = {"epochs": budget["epochs"], "train_subset": budget["train_subset"],
                          "train_images": int(data.train_images.shape[0]),
                          "image_epochs_per_step": budget["epochs"] * int(data.train_images.shape[0]),
                          "final_accuracy": finals, "mean": mean, "std": std, "runs": runs,
                          "seconds": sum(r["seconds"] for r in runs)}
    seeds = list(range(args.seed, args.seed + plan["runs"]))
    verdict = paired_verdict(results["paper"]["final_accuracy"], results["ours"]["final_accuracy"],
                                    better="paper budget better", worse="our budget better")
    verdict["seeds"] = seeds
    acc_original = evaluate(model, *(lambda d: (d.test_images, d.test_labels))(
        subset(dataset, test=plan["test_subset"], seed=args.seed)))
    text = "\n".join([f"{kind}/{name}, BF, {study['basis']}, {study['capture']} capture; original "
                      f"{100 * acc_original:.2f} %"] + [
        f"  {label:<6} {r['epochs']} epoch(s) x {r['train_images']} images per step: final "
        f"{r['mean']:.2f} ± {r['std']:.2f} %  {['%.2f' % a for a in r['final_accuracy']]}"
        for label, r in results.items()] + [
        f"  paper − ours: {verdict['mean_diff']:+.2f} points (paired t-test p = {_p(verdict['p_ttest'])}, "
        f"sign test p = {_p(verdict['p_sign'])}): {verdict['verdict']}"])
    print(text)
    stem = args.prefix.replace("full_compression", "full_compression_budget_study")
    path = args.out / f"{stem}.json"
    write_json(path, {
        "command": command, "mode": "smoke" if args.smoke else "quick" if args.quick else "full",
        "study": {k: v for k, v in study.items() if k != "budgets"}, "budgets": budgets,
        "plan": {k: list(v) if isinstance(v, tuple) else v for k, v in plan.items()},
        "checkpoint": info, "accuracy_original": 100 * acc_original, "seeds": seeds, "results": results,
        "difference": verdict, "table": text, "wall_seconds": timer()})
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="CI size: ViT on Fashion-MNIST, cubic, 2 runs")
    mode.add_argument("--smoke", action="store_true", help="smallest run (tests)")
    parser.add_argument("--budget-study", action="store_true",
                        help="ViT/Fashion-MNIST, BF, cubic: our fine-tuning budget against the paper's")
    parser.add_argument("--model", action="append", choices=MODELS, help="repeatable (full default: vit)")
    parser.add_argument("--dataset", action="append", choices=DATASETS, help="repeatable (full default: fashion-mnist)")
    parser.add_argument("--basis", action="append", choices=tuple(BASES),
                        help=f"repeatable (default: {CUBIC}; the paper's tables: all four)")
    parser.add_argument("--capture", choices=(*CAPTURES, "both"), default=None,
                        help="sampling points from the current (partly compressed) network at each step, from "
                             "the original network for every block, or both (default: both)")
    parser.add_argument("--epochs", type=int, default=None, help="fine-tuning epochs per step (full: 2; paper: 5)")
    parser.add_argument("--train-subset", type=int, default=None,
                        help="training images used for fine-tuning and sampling (full: 10000; 0 = all)")
    parser.add_argument("--paper-budget", action="store_true",
                        help="the paper's fine-tuning budget: 5 epochs on the whole training split")
    parser.add_argument("--test-subset", type=int, default=None, help="test images (default: all)")
    parser.add_argument("--runs", "--seeds", dest="runs", type=int, default=None,
                        help="runs (seeds) per capture, order and basis (full: 3)")
    parser.add_argument("--max-iter", type=int, default=None, help="R-CMTF sweeps per block (full: 300)")
    parser.add_argument("--samples", type=int, default=128, help="S per block")
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.paper_budget and (args.epochs is not None or args.train_subset is not None):
        parser.error("--paper-budget sets --epochs and --train-subset; give one or the other")
    if args.paper_budget and args.budget_study:
        parser.error("--budget-study runs both budgets already")
    plan = dict(SMOKE if args.smoke else QUICK if args.quick else FULL)
    for opt, key in (("model", "models"), ("dataset", "datasets"), ("basis", "bases")):
        if getattr(args, opt):
            plan[key] = tuple(dict.fromkeys(getattr(args, opt)))
    if args.capture:
        plan["capture"] = CAPTURES if args.capture == "both" else (args.capture,)
    if args.paper_budget:
        plan.update(PAPER_BUDGET)
    for key in ("epochs", "train_subset", "test_subset", "runs", "max_iter"):
        if getattr(args, key) is not None:
            plan[key] = (getattr(args, key) or None) if key.endswith("subset") else getattr(args, key)
    args.prefix = ("full_compression_smoke" if args.smoke else "full_compression_quick" if args.quick else
                   "full_compression_paper_budget" if args.paper_budget else "full_compression")
    args.out.mkdir(parents=True, exist_ok=True)
    command = command_line("full_compression.py", argv)
    enable_compilation_cache()

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    if args.budget_study:
        path = budget_study(plan, args, command, log)
        print(f"wrote {path}")
        return 0
    written = []
    for kind in plan["models"]:
        for name in plan["datasets"]:
            result = run_pair(kind, name, plan, args, log)
            text = format_tables(result, plan)
            print(text)
            stem = f"{args.prefix}_{kind}_{name}"
            full_split = plan["train_subset"] is None
            payload = {
                "command": command,
                "mode": "smoke" if args.smoke else "quick" if args.quick else "full",
                "plan": {k: list(v) if isinstance(v, tuple) else v for k, v in plan.items()},
                "capture_protocols": {
                    "current": "sampling points re-captured at each step from the current, partly compressed "
                               "and fine-tuned network",
                    "original": "sampling points captured once from the original network for every block, "
                                "before any replacement (same images per step); the block's current MLP is "
                                "decoupled at those points"},
                "verdict_rule": ("per capture protocol and basis, final test accuracy (after the last "
                                 "fine-tuning) paired over seeds: 'BF better' if BF's mean is higher and the "
                                 "paired t-test gives p < 0.05, 'FB better' if lower with p < 0.05, else "
                                 "'within noise'; the sign test is reported beside it"),
                "deviations_from_paper": [
                    *([] if plan["epochs"] == 5 and full_split else [
                        f"fine-tuning: {plan['epochs']} epoch(s) per step on {result['train_images']} training "
                        "images (paper: 5 epochs on the whole training split)"]),
                    f"each run draws its own S = {args.samples} sampling points (paper: one draw shared by the "
                    "3 runs)",
                    "Fashion-MNIST stands in for SVHN (no SVHN copy here)" if name == "fashion-mnist" else
                    "CIFAR-10 read from the JPEG re-encoded copy",
                    *(["Swin on 28x28 images uses patch 7 (no preset)"] if kind == "swin" and name != "cifar10" else []),
                ],
                "paper": PAPER.get((kind, name)),
                "table": text,
                **result,
            }
            write_json(args.out / f"{stem}.json", payload)
            write_csv(result, plan, args.out / f"{stem}.csv")
            plot(result, plan, args.out / f"{stem}.png")
            written += [args.out / f"{stem}.{ext}" for ext in ("json", "csv", "png")]
            log(f"{kind}/{name}: {result['wall_seconds']:.0f} s")
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
