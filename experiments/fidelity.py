"""Is the more accurate compressed model the more faithful one? Training-free, on the test inputs.

``method="auto"`` keeps, per block, the candidate whose whole model is closer to the original
model's outputs on held-out training images (``auto_judge="model"``). Can that rule miss the more
accurate model? This study rebuilds training-free units exactly as
``experiments/training_free.py`` configures them (:func:`compression_study.unit_config`: same methods,
budgets, seeds, calibration draws and solver keys) and measures, for each compressed model, its
distance to the original model:

* on the **test inputs** (labels unused for the distances): what an ideal fidelity judge —
  one that saw the very inputs it will be scored on — would minimise;
* on the **held-out training images**: the training images outside every calibration draw of
  the seed (the pool ``auto``'s judge draws from, so ``auto`` was selected on part of it),

beside its test accuracy. Distances between the compressed model's logits ``z`` and the
original's ``z₀`` (``N × classes``): the relative squared error ``‖z − z₀‖² / ‖z₀‖²``; the mean KL
divergence ``KL(softmax z₀ ‖ softmax z)``; the top-1 agreement (% of inputs on which both models
predict the same class). Accuracy is top-1 against the labels.

If a method is more accurate on test but further from the original on the test inputs
themselves, no judge of fidelity to the original can choose it, however many unlabeled inputs
it sees; only labels from the test distribution could.

Usage::

    python experiments/fidelity.py                     # DeiT/USPS, ρ 0.35 and 0.5, prune / bsd-warm / auto, 3 seeds
    python experiments/fidelity.py --model vit --dataset fashion-mnist --budgets 0.5
    python experiments/fidelity.py --quick             # CI: 2 blocks, 1 seed, ~1 min on 2 cores

Writes ``<out>/fidelity_<model>_<dataset>.json`` (every run, the summary rows, the command,
provenance, wall time), ``.csv`` and ``.png`` (test accuracy against the relative logit error
on the test inputs, one point per run); ``fidelity_quick`` in quick mode. Resume: every
(method, ρ, seed) run is one unit under ``<out>/state/<prefix>/<protocol key>/`` (``unit.json``
once finished; an unfinished one resumes after its last finished block).
"""

from __future__ import annotations

import argparse
import csv
import pathlib
import sys

import numpy as np
from scipy.special import log_softmax

from jaxbsd.compression.blockwise import block_order, capture_indices, compress
from jaxbsd.data import load_dataset
from jaxbsd.models import count_params
from jaxbsd.evaluation import predict

import compression_study
import training_free
from checkout import ROOT, enable_compilation_cache
from output import Timer, command_line, machine, write_json
from refinement import Setting
from trained import checkpoint_key, load_or_train, subset
from units import protocol_key, resume_unit, save_infeasible, save_unit
from verdicts import mean_std

METHODS = tuple(map(Setting, ("prune", "bsd-warm", "auto")))
#: The training-free study's DeiT/USPS protocol at the two budgets where the decoupling beats
#: pruning on test.
FULL = dict(training_free.FULL, budgets=(0.35, 0.5), methods=METHODS, heldout_images=None)
FULL_VIT = dict(FULL, model="vit", dataset="fashion-mnist")
#: CI: the training-free quick protocol (2 blocks, 64 calibration images, 300 test images, 10
#: sweeps), one seed, 256 held-out training images.
QUICK = dict(training_free.QUICK, methods=(Setting("bsd"), Setting("prune")), seeds=1, heldout_images=256)
#: Evaluation batch: one compiled shape per model structure.
EVAL_BATCH = 512


def fidelity(logits, reference, labels) -> dict:
    """Distances of ``logits`` (``N × C``) to the original model's ``reference`` (``N × C``), and
    top-1 accuracy (%) against ``labels`` (``N``).

    Returns:
      ``{"relative_error": ‖z − z₀‖²/‖z₀‖², "kl": mean_n KL(softmax z₀ ‖ softmax z),
      "agreement": % same top-1 class, "accuracy": % top-1 correct}``.
    """
    z, z0 = np.asarray(logits, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    if z.shape != z0.shape or z.ndim != 2 or np.shape(labels) != z.shape[:1]:
        raise ValueError(f"logits and reference must be (N, C) and labels (N,), got {z.shape}, {z0.shape}, "
                         f"{np.shape(labels)}")
    # log-softmax by log-sum-exp: a probability that underflows to 0 keeps a finite logarithm.
    log_p, log_q = log_softmax(z0, axis=1), log_softmax(z, axis=1)
    return {"relative_error": float(np.sum((z - z0) ** 2) / np.sum(z0 ** 2)),
            "kl": float(np.mean(np.sum(np.exp(log_p) * (log_p - log_q), axis=1))),
            "agreement": float(100 * np.mean(z.argmax(1) == z0.argmax(1))),
            "accuracy": float(100 * np.mean(z.argmax(1) == np.asarray(labels)))}


def heldout_indices(num_images: int, n_capture: int, seed: int, steps: int, limit: int | None = None) -> np.ndarray:
    """Training images (sorted indices) outside every calibration draw of ``seed``: the planning
    draw (step 0) and those of steps ``1..steps`` (:func:`jaxbsd.compress.capture_indices`).
    ``limit``: at most that many, drawn with ``seed``."""
    drawn = np.concatenate([capture_indices(num_images, n_capture, seed, s) for s in range(steps + 1)])
    rest = np.setdiff1d(np.arange(num_images), drawn)
    if limit is not None and rest.size > limit:
        rest = np.sort(np.random.default_rng([seed, 2]).choice(rest, limit, replace=False))
    return rest


def run_unit(setting: Setting, reduction: float, seed: int, *, model_path, data, order, plan, args, references: dict,
             protocol_dir: pathlib.Path, log) -> dict:
    """One (setting, ρ, seed) model, compressed as the training-free study's unit of that name
    and measured against the original on the test inputs and the seed's held-out training images
    (``references[seed]``: ``(held-out indices, the original's logits on them)``; ``references["test"]``:
    the original's test logits). Its saved record if it finished before under the same tag."""
    config, name, state, tag = compression_study.unit_identity(setting, reduction, seed, plan, args, order,
                                                               protocol_dir, heldout=plan["heldout_images"])
    if (done := resume_unit(state, tag, name, log)) is not None:
        return done
    t0, model, record = compression_study.begin_unit(model_path, setting, reduction, seed, config, state)
    try:
        steps = compress(model, data, order=order, config=config, state_dir=state, progress=False)
    except ValueError as err:
        return save_infeasible(err, record, state / "unit.json", tag, name, t0(), log)
    heldout, heldout_reference = references[seed]
    test = fidelity(predict(model, data.test_images, EVAL_BATCH), references["test"], data.test_labels)
    train = fidelity(predict(model, data.train_images[heldout], EVAL_BATCH), heldout_reference,
                     data.train_labels[heldout])
    params = count_params(model)
    record.update(status="ok", accuracy=test["accuracy"], params=params, reduction_achieved=1 - params / record["params_original"],
                  kept={str(s["block"]): s.get("method", setting.name) for s in steps}, test=test, heldout_train=train,
                  heldout_images=int(heldout.size), machine=machine(), seconds=t0())
    save_unit(state / "unit.json", tag, record)
    log(f"  {name}: {test['accuracy']:.2f} %; on the test inputs relative error {test['relative_error']:.4f}, "
        f"agreement {test['agreement']:.2f} %; held out {train['relative_error']:.4f} ({t0():.0f} s)")
    return record


#: Summary columns: (record part, metric).
COLUMNS = tuple((part, metric) for part in ("test", "heldout_train")
                for metric in ("accuracy", "relative_error", "kl", "agreement"))


def summarize(units: list[dict], plan: dict) -> list[dict]:
    """One row per (ρ, method): mean and std over seeds of every column, and the blocks' kept
    candidates per seed (``auto``: ``"b"``/``"p"`` per block, in the order of compression)."""
    rows = []
    for reduction in plan["budgets"]:
        for method in (m.name for m in plan["methods"]):
            ok = [u for u in units if u["method"] == method and u["reduction"] == reduction and u["status"] == "ok"]
            row = {"method": method, "name": compression_study.method_name(method), "reduction": reduction, "seeds": len(ok),
                   "kept": ["".join(m[0] for m in u["kept"].values()) for u in ok]}
            for part, metric in COLUMNS:
                row[f"{part}_{metric}_mean"], row[f"{part}_{metric}_std"] = mean_std(
                    [u[part][metric] for u in ok])
            rows.append(row)
    return rows


def format_table(rows: list[dict]) -> str:
    lines = [f"{'method':<12}{'ρ':>6}{'test %':>9}{'rel. err (test)':>17}{'KL (test)':>11}{'agree (test)':>14}"
             f"{'rel. err (held out)':>21}"]
    lines += [f"{r['method']:<12}{r['reduction']:>6.2f}{r['test_accuracy_mean']:>9.2f}"
              f"{r['test_relative_error_mean']:>17.4f}{r['test_kl_mean']:>11.4f}{r['test_agreement_mean']:>13.2f}%"
              f"{r['heldout_train_relative_error_mean']:>21.4f}" for r in rows if r["seeds"]]
    return "\n".join(lines)


def write_csv(rows: list[dict], path: pathlib.Path) -> None:
    """The summary rows as CSV: one line per (method, ρ), means over seeds."""
    names = [f"{part}_{metric}_mean" for part, metric in COLUMNS]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method", "reduction_target", "seeds", *names])
        for r in rows:
            w.writerow([r["method"], r["reduction"], r["seeds"], *(f"{r[n]:.5g}" for n in names)])


def plot(units: list[dict], path: pathlib.Path, acc_original: float, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [u for u in units if u["status"] == "ok"]
    budgets = sorted({u["reduction"] for u in ok})
    fig, axes = plt.subplots(1, len(budgets), figsize=(4.2 * len(budgets), 3.8), squeeze=False)
    colors = dict(zip(dict.fromkeys(u["method"] for u in ok), ["tab:red", "tab:green", "tab:purple", "tab:blue",
                                                                "tab:orange", "tab:brown", "tab:gray"]))
    for ax, reduction in zip(axes[0], budgets):
        for method, color in colors.items():
            us = [u for u in ok if u["method"] == method and u["reduction"] == reduction]
            ax.scatter([u["test"]["relative_error"] for u in us], [u["accuracy"] for u in us], color=color,
                       label=compression_study.method_name(method), s=22)
        ax.axhline(acc_original, color="k", lw=0.8, ls="--", label="original")
        ax.set_title(f"ρ = {reduction}", fontsize=9)
        ax.set_xlabel("relative logit error on the test inputs")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("top-1 test accuracy (%)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI size (DeiT/USPS, 2 blocks, 1 ρ, 1 seed, 2 methods)")
    compression_study.add_arguments(parser, training_free.METHODS, quick="deit/usps", budgets="0.35 0.5")
    args = parser.parse_args(argv)
    plan = dict(QUICK if args.quick else FULL_VIT if args.model == "vit" else FULL)
    plan = compression_study.apply_overrides(plan, args, ("model", "dataset", "budgets", "methods", "seeds", "max_iter",
                                                   "test_subset"))
    kind, name = plan["model"], plan["dataset"]
    prefix = "fidelity_quick" if args.quick else f"fidelity_{kind}_{name}"
    args.out.mkdir(parents=True, exist_ok=True)
    command = command_line("fidelity.py", argv)
    enable_compilation_cache()
    timer = Timer()

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    quick_dir = args.out / "checkpoints" if args.quick else None
    model, model_info = load_or_train(kind, name, checkpoint=args.checkpoint, quick_dir=quick_dir, log=log)
    data = subset(load_dataset(name), train=plan["train_subset"], test=plan["test_subset"], seed=args.seed)
    model_path = pathlib.Path(model_info["checkpoint"])
    model_path = model_path if model_path.is_absolute() else ROOT / model_path
    order = list(block_order("back-to-front", len(model.blocks)))[: plan["blocks"] or None]
    capture = plan.get("capture_images", 256)
    seeds = range(args.seed, args.seed + plan["seeds"])
    references = {"test": predict(model, data.test_images, EVAL_BATCH)}
    acc_original = fidelity(references["test"], references["test"], data.test_labels)["accuracy"]
    for seed in seeds:
        heldout = heldout_indices(data.train_images.shape[0], capture, seed, len(order), plan["heldout_images"])
        references[seed] = (heldout, predict(model, data.train_images[heldout], EVAL_BATCH))
    protocol = {"model": kind, "dataset": name, "checkpoint": checkpoint_key(model_info["checkpoint"]),
                "test": plan["test_subset"], "data_seed": args.seed, "order": order}
    key = protocol_key(protocol)
    protocol_dir = args.out / "state" / prefix / f"protocol-{key}"
    log(f"{kind}/{name}: original {acc_original:.2f} % on {data.test_images.shape[0]} test images; blocks {order}; "
        f"{references[args.seed][0].size} held-out training images for seed {args.seed}")
    units = [run_unit(method, reduction, seed, model_path=model_path, data=data, order=order, plan=plan, args=args,
                      references=references, protocol_dir=protocol_dir, log=log)
             for reduction in plan["budgets"] for method in plan["methods"] for seed in seeds]
    rows = summarize(units, plan)
    table = format_table(rows)
    print(table)
    write_json(args.out / f"{prefix}.json", {
        "command": command, "mode": "quick" if args.quick else "full",
        "plan": {k: list(v) if isinstance(v, tuple) else v for k, v in plan.items()},
        "protocol": (f"{kind}/{name}; each unit is the training-free study's unit of the same method, ρ and seed "
                     f"(experiments/training_free.py: blocks {order} back to front, {capture} calibration images "
                     "per block, no fine-tuning), rebuilt; distances to the original model's logits on the "
                     f"{data.test_images.shape[0]} test inputs and on the training images outside every "
                     "calibration draw of the seed"),
        "metrics": {"relative_error": "sum (z - z0)^2 / sum z0^2 over the logits",
                    "kl": "mean over inputs of KL(softmax z0 || softmax z)",
                    "agreement": "% of inputs with the same top-1 class as the original",
                    "accuracy": "% top-1 correct against the labels"},
        "model": model_info, "accuracy_original": acc_original, "test_images": int(data.test_images.shape[0]),
        "rows": rows, "runs": units, "table": table, "machines": sorted({u["machine"] for u in units if u.get("machine")}),
        "wall_seconds": timer()})
    write_csv(rows, args.out / f"{prefix}.csv")
    plot(units, args.out / f"{prefix}.png", acc_original,
         f"{kind} on {name}, training-free: accuracy against distance to the original (one point per seed)")
    print(f"wrote {args.out / (prefix + '.json')}, .csv and .png ({timer():.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
