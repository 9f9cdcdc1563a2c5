"""The (method, ρ, seed) compression study: the unit framework that ``comparison.py``,
``training_free.py`` (and through it ``knobs.py``, ``refine_ablation.py``), ``fidelity.py`` and
``distill.py`` share.

A study compresses a trained model's blocks at several target reductions ρ of the whole model's
parameters (the budget rule of ``jaxbsd.compress``: the compressed model keeps at most
``(1 − ρ)·P``), once per method :class:`refinement.Setting` and seed. Each (setting, ρ, seed) is one
resumable unit (:mod:`units`): :func:`unit_config` is its ``CompressionConfig``, :func:`unit_identity`
its name ``<setting name>-rho<ρ·1000>-seed<seed>``, state folder and tag (the configuration, the
block order and the study's further protocol entries). :func:`run_study` runs every unit of a plan
under ``<out>/state/<prefix>/protocol-<key>/`` (the key hashes the model, data and block order,
never the methods, so adding a method adds units and keeps the others) and writes
``<out>/<prefix>.json`` (runs, summary rows, verdicts paired over seeds against ``bsd`` and, where
pruning ran, against ``prune``), ``.csv`` and ``.png``.

A B-spline variant is a base named ``bsd-<option>-<option>…`` (:func:`bsd_variant`).
"""

from __future__ import annotations

import argparse
import csv
import json
import pathlib
import sys

import numpy as np
from flax import nnx

import jaxbsd as jb
from jaxbsd.compression.blockwise import CompressionConfig, block_order, compress
from jaxbsd.compression.config import DEFAULTS
from jaxbsd.compression.methods.bsd import augmented
from jaxbsd.data import load_dataset
from jaxbsd.models import count_params
from jaxbsd.evaluation import evaluate
from jaxbsd.checkpoint import load_checkpoint

from checkout import ROOT, RESULTS, enable_compilation_cache, rel_path
from output import Timer, command_line, machine, write_json
from refinement import Setting
from units import protocol_key, resume_unit, save_infeasible, save_unit
from trained import checkpoint_key, load_or_train, subset
from verdicts import mean_std, paired_verdict

#: The methods as built that a setting's ``base`` may name besides B-spline variants ``bsd-…``.
BASES = ("bsd", "svd", "drone", "bsd-greedy", "prune", "auto", "auto-block", "auto-aug")
REFERENCE = "bsd"
#: The teacher each (model, data set) fine-tunes with, unless the plan says ``teacher=False``.
TEACHERS = {("deit", "usps"): ("vit", "usps")}

#: B-spline variants are named ``bsd-<option>-<option>…`` (see :func:`bsd_variant`).
_VARIANT_WORDS = {"greedy": "greedy", "warm": "warm start, held-out selection", "nu": "ν = {}", "s": "S = max(128, {}r)",
                  "it": "{} sweeps", "lam": "λ = {}", "aug": "augmented: contains the pruned MLP"}
#: The activation of ``-aug``'s basis: every study model's MLPs (ViT, DeiT, Swin) use exact GELU. Another
#: activation would still run, warm-started from ``rank − 1`` pruned units (``methods.bsd.warm_init``).
AUG_ACTIVATION = "gelu"


def _options(method: str):
    """``(word, name, number)`` for each ``-``-separated option of ``bsd-…``: ``"nu8"`` → ``("nu8", "nu", "8")``."""
    for word in method.split("-")[1:]:
        head = word.rstrip("0123456789")
        yield word, head, word[len(head):]


def bsd_variant(method: str) -> dict:
    """The ``CompressionConfig`` fields of a B-spline variant that differ from ``"bsd"``.

    ``method`` is ``"bsd"`` (or ``"auto"``, for ``-aug`` alone) followed by any of ``-greedy`` (greedy
    allocation), ``-warm`` (a warm-started restart from the pruned MLP, restart chosen by the output
    error on held-out calibration tokens), ``-aug`` (the decoupling that contains the pruned MLP:
    :func:`jaxbsd.compression.methods.bsd.augmented`'s basis, warm start alone, best iterate and
    patience), ``-nu<ν>`` (cubic B-splines with ν coefficients), ``-s<k>``
    (``S = max(128, k·r)``), ``-it<n>`` (``n`` sweeps) and ``-lam<λ>`` (the weight λ of the
    outputs in the objective, an integer), e.g. ``"bsd-warm-nu8"``. A dict with the keys
    ``allocation``, ``warm_start``/``selection``, ``dof``, ``samples_per_rank``, ``max_iter``,
    ``lam`` and (``-aug``) ``basis``/``restarts``/``best_iterate``/``patience`` where given.

    Raises:
      ValueError: naming ``method`` for an unknown option.
    """
    fields: dict = {}
    for word, head, number in _options(method):
        if word == "greedy":
            fields["allocation"] = "greedy"
        elif word == "warm":
            fields.update(warm_start=True, selection="output")
        elif word == "aug":
            recipe = augmented(AUG_ACTIVATION)
            # The flat form's warm_start is a bool: True (every study MLP has a two-layer spec).
            fields.update(basis=recipe.config.basis, restarts=recipe.restarts, warm_start=True, selection="output",
                          best_iterate=recipe.best_iterate, patience=recipe.config.patience)
        elif head in ("nu", "s", "it") and number:
            fields[{"nu": "dof", "s": "samples_per_rank", "it": "max_iter"}[head]] = int(number)
        elif head == "lam" and number:
            fields["lam"] = float(number)
        else:
            raise ValueError(f"method {method!r}: unknown B-spline option {word!r}")
    return fields


def method_name(method: Setting | str) -> str:
    """Display name of a setting (or of a record's method name, read by :meth:`Setting.parse`):
    ``"B-spline (greedy)"``, ``"B-spline (warm start, held-out selection; ν = 8)"``,
    ``"Pruning + refined (300 steps)"``…"""
    setting = Setting.parse(method) if isinstance(method, str) else method
    r, method = setting.refine, setting.base
    if r.steps:
        return (f"{method_name(method)} + refined ({r.steps} steps{f' of {r.batch} tokens' if r.batch else ''}"
                f"{f', learning rate {r.learning_rate:g}' if r.learning_rate else ''}"
                f"{', consistent target' if r.target == 'consistent' else ''})")
    fixed = {"svd": "SVD", "drone": "DRONE", "bsd": "B-spline", "prune": "Pruning", "auto": "Auto (B-spline or pruning)",
             "auto-block": "Auto, judged by the block's output error",
             "auto-aug": "Auto (B-spline augmented: contains the pruned MLP, or pruning)"}
    if method in fixed:
        return fixed[method]
    words = [_VARIANT_WORDS[head].format(number) if head in _VARIANT_WORDS else word
             for word, head, number in _options(method)]
    return f"B-spline ({'; '.join(words)})"


def unit_config(setting: Setting, reduction: float, seed: int, plan: dict, args) -> CompressionConfig:
    """The ``jaxbsd.compress`` configuration of one (setting, ρ, seed) unit.

    ``plan["epochs"]`` fine-tuning epochs after every block (0: training-free); optional
    ``plan["val_fraction"]`` and ``plan["capture_images"]`` (default: ``CompressionConfig``'s,
    which keeps the tags, hence the saved units, of runs configured before they existed).
    """
    method, refine = setting.base, setting.refine
    variant = bsd_variant(method) if method.startswith("bsd") or method == "auto-aug" else {}
    # "auto" judges its candidates by the model's outputs (the default), "auto-block" by the
    # block's output error on held-out tokens (the rule before; its units' tags are the old ones).
    judge = {"auto-block": "block"}.get(method, "model")
    return CompressionConfig.from_flat(**dict(  # the study's settings are the configuration's flat form
        method="bsd" if method.startswith("bsd") else "auto" if method.startswith("auto") else method,
        basis=variant.get("basis", jb.BSpline(args.degree, variant.get("dof", args.dof))),
        restarts=variant.get("restarts", DEFAULTS["restarts"]), best_iterate=variant.get("best_iterate", False),
        patience=variant.get("patience"),
        reduction=reduction, allocation=variant.get("allocation", "uniform"), lam=variant.get("lam", 0.25),
        max_iter=variant.get("max_iter", plan["max_iter"]), num_samples=args.samples or 128,
        samples_per_rank=0 if args.samples else variant.get("samples_per_rank", 2),
        warm_start=variant.get("warm_start", False), selection=variant.get("selection", "objective"),
        finetune_epochs=plan["epochs"], seed=seed, auto_judge=judge,
        val_fraction=plan.get("val_fraction", CompressionConfig.val_fraction),
        capture_images=plan.get("capture_images", CompressionConfig.capture_images),
        refine_steps=refine.steps, refine_target=refine.target, refine_batch=refine.batch,
        refine_lr=refine.learning_rate or DEFAULTS["refine_lr"],
    ))


def unit_identity(setting: Setting, reduction: float, seed: int, plan: dict, args, order, protocol_dir: pathlib.Path,
                  **protocol) -> tuple[CompressionConfig, str, pathlib.Path, str]:
    """``(config, name, state folder, tag)`` of one (setting, ρ, seed) unit: its configuration
    (:func:`unit_config`), its name ``<setting name>-rho<ρ·1000>-seed<seed>``, its folder under
    ``protocol_dir`` and the tag it is saved and resumed under (the configuration, the block
    order and any further ``protocol`` entries of the study)."""
    config = unit_config(setting, reduction, seed, plan, args)
    name = f"{setting.name}-rho{int(round(1000 * reduction)):04d}-seed{seed}"
    tag = json.dumps({"config": config.to_dict(), "order": list(order), **protocol}, sort_keys=True)
    return config, name, protocol_dir / name, tag


def begin_unit(model_path, setting: Setting, reduction: float, seed: int, config: CompressionConfig,
               state: pathlib.Path) -> tuple[Timer, nnx.Module, dict]:
    """``(timer, model, record)`` at the start of a unit's run: a timer, a fresh copy of the
    trained model from ``model_path`` and the record every unit starts from (method name, ρ, seed,
    configuration, the original's parameters, the state folder)."""
    t0 = Timer()
    model = load_checkpoint(model_path)[0]
    record = {"method": setting.name, "reduction": reduction, "seed": seed, "config": config.to_dict(),
              "params_original": count_params(model), "state_dir": rel_path(state)}
    return t0, model, record


def run_unit(setting: Setting, reduction: float, seed: int, *, model_path, data, order, plan, args, teacher,
             protocol_dir: pathlib.Path, log) -> dict:
    """One (setting, ρ, seed) run (configured by :func:`unit_config`), or its saved record if it
    finished before under the same tag (configuration and block order)."""
    config, name, state, tag = unit_identity(setting, reduction, seed, plan, args, order, protocol_dir)
    if (done := resume_unit(state, tag, name, log)) is not None:
        return {**done, "method": setting.name}  # the tag fixes the configuration; the plan names it
    t0, model, record = begin_unit(model_path, setting, reduction, seed, config, state)
    params_original = record["params_original"]
    try:
        steps = compress(model, data, order=order, config=config, state_dir=state, teacher=teacher, progress=False,
                         on_step=lambda s: log(f"  {name} step {s['step']} (block {s['block']}, rank {s['rank']}, "
                                               f"S {s['num_samples']}): {100 * s['acc_cmtf']:.2f} % after "
                                               f"compression" + (f", {100 * s['acc_ft']:.2f} % after FT"
                                                                 if plan["epochs"] else "")))
    except ValueError as err:
        return save_infeasible(err, record, state / "unit.json", tag, name, t0(), log)
    params = count_params(model)
    record.update(
        status="ok", accuracy=100 * steps[-1]["acc_ft"], accuracy_compressed=100 * steps[-1]["acc_cmtf"],
        params=params, reduction_achieved=1 - params / params_original,
        ranks={str(s["block"]): s["rank"] for s in steps},
        output_errors={str(s["block"]): s.get("output_error") for s in steps},
        machine=machine(),
        num_samples={str(s["block"]): s.get("num_samples") for s in steps},
        finetune_kept=[s["finetune_kept"] for s in steps],
        steps=[{k: v for k, v in s.items() if k != "finetune"}
               | {"finetune_val_acc": [h.get("val_acc", h.get("test_acc")) for h in s.get("finetune", [])]}
               for s in steps],
        seconds=t0(),
    )
    save_unit(state / "unit.json", tag, record)
    log(f"  {name}: {record['accuracy']:.2f} %, {params} parameters "
        f"({100 * record['reduction_achieved']:.2f} % fewer), {t0():.0f} s")
    return record


def _paired_verdicts(by_method: dict, methods, reference: str, reduction: float) -> dict:
    """``{method: paired verdict of "reference beats method"}`` at one ρ over the seeds both ran."""
    ref = by_method.get(reference, {})
    out = {}
    for method in methods:
        if method == reference:
            continue
        seeds = sorted(s for s in ref if s in by_method[method] and ref[s]["status"] == "ok"
                       and by_method[method][s]["status"] == "ok")
        v = paired_verdict([ref[s]["accuracy"] for s in seeds],
                                  [by_method[method][s]["accuracy"] for s in seeds],
                                  better="holds", worse="does not hold")
        v["seeds"] = seeds
        who = "B-spline (uniform)" if reference == "bsd" else method_name(reference)
        v["claim"] = f"{who} beats {method_name(method)} at ρ = {reduction}"
        out[method] = v
    return out


def summarize(units: list[dict], plan: dict) -> tuple[list[dict], dict, dict]:
    """Rows per (method, ρ) (mean ± std over seeds), the paired verdicts against bsd per ρ and,
    where pruning ran, those of pruning against every B-spline variant and ``auto`` per ρ; rows,
    verdicts and ``units`` (the records) name a setting by its :attr:`Setting.name`."""
    rows, verdicts, verdicts_prune = [], {}, {}
    methods = [m.name for m in plan["methods"]]
    for reduction in plan["budgets"]:
        by_method = {m: {u["seed"]: u for u in units if u["method"] == m and u["reduction"] == reduction}
                     for m in methods}
        for method in methods:
            ok = [u for u in by_method[method].values() if u["status"] == "ok"]
            if not ok:
                rows.append({"method": method, "name": method_name(method), "reduction": reduction, "status": "infeasible", "seeds": 0,
                             "reason": next(iter(by_method[method].values()), {}).get("reason")})
                continue
            mean, std = mean_std([u["accuracy"] for u in ok])
            pmean, pstd = mean_std([u["params"] for u in ok])
            rows.append({"method": method, "name": method_name(method), "reduction": reduction, "status": "ok", "seeds": len(ok),
                         "accuracy_mean": mean, "accuracy_std": std, "params_mean": pmean, "params_std": pstd,
                         "params_max": max(u["params"] for u in ok),
                         "reduction_achieved_mean": float(np.mean([u["reduction_achieved"] for u in ok])),
                         "ranks": sorted({r for u in ok for r in u["ranks"].values()}),
                         "num_samples": sorted({s for u in ok for s in u["num_samples"].values() if s is not None})})
        verdicts[repr(reduction)] = _paired_verdicts(by_method, methods, REFERENCE, reduction)
        if "prune" in methods:
            verdicts_prune[repr(reduction)] = _paired_verdicts(
                by_method, [m for m in methods if m.startswith(("auto", "bsd"))], "prune", reduction)
    for row in rows:
        v = verdicts[repr(row["reduction"])].get(row["method"])
        row["verdict_vs_bsd"] = v["verdict"] if v and v["n"] else None  # no paired bsd runs: no verdict
    return rows, verdicts, verdicts_prune


def format_table(rows: list[dict], acc_original: float, params_original: int) -> str:
    w = max([20] + [len(method_name(r["method"])) + 2 for r in rows])
    lines = [f"original: {acc_original:.2f} %, {params_original} parameters",
             f"{'method':<{w}}{'ρ':>6}{'top-1 % (mean ± std)':>24}{'params':>10}{'reduction':>11}{'seeds':>6}"
             f"   claim 'B-spline beats it'"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"{method_name(r['method']):<{w}}{r['reduction']:>6.2f}{'infeasible':>24}")
            continue
        lines.append(f"{method_name(r['method']):<{w}}{r['reduction']:>6.2f}"
                     f"{r['accuracy_mean']:>15.2f} ± {r['accuracy_std']:<6.2f}{r['params_mean']:>10.0f}"
                     f"{100 * r['reduction_achieved_mean']:>9.2f} %{r['seeds']:>6}   {r['verdict_vs_bsd'] or ''}")
    return "\n".join(lines)


def plot(rows: list[dict], path: pathlib.Path, acc_original: float, params_original: int, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"svd": "tab:blue", "drone": "tab:orange", "bsd": "tab:green", "bsd-greedy": "tab:olive",
              "prune": "tab:red", "auto": "tab:purple"}
    markers = {"svd": "s", "drone": "^", "bsd": "o", "bsd-greedy": "D", "prune": "v", "auto": "*"}
    spare = iter(["tab:brown", "tab:pink", "tab:gray", "tab:cyan", "k", "tab:olive", "tab:blue", "tab:orange"])
    for method in dict.fromkeys(r["method"] for r in rows):  # variants (bsd-warm, bsd-nu8, ...): spare colours
        colors.setdefault(method, next(spare, "k"))
        markers.setdefault(method, "P")
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for method in colors:
        ok = sorted((r for r in rows if r["method"] == method and r["status"] == "ok"), key=lambda r: r["params_mean"])
        if not ok:
            continue
        ax.errorbar([r["params_mean"] for r in ok], [r["accuracy_mean"] for r in ok],
                    yerr=[r["accuracy_std"] for r in ok], color=colors[method], marker=markers[method], ms=4,
                    capsize=3, lw=1, label=method_name(method))
    ax.axhline(acc_original, color="k", lw=0.8, ls="--", label=f"original ({params_original:,} params)")
    ax.set_xlabel("parameters of the compressed model")
    ax.set_ylabel("top-1 test accuracy (%)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_csv(rows: list[dict], path: pathlib.Path) -> None:
    """The summary rows as CSV: one line per (method, ρ)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method", "reduction_target", "accuracy_mean", "accuracy_std", "params_mean", "seeds",
                    "verdict_vs_bsd"])
        for r in rows:
            w.writerow([r["method"], r["reduction"], *(
                [f"{r['accuracy_mean']:.3f}", f"{r['accuracy_std']:.3f}", f"{r['params_mean']:.0f}"]
                if r["status"] == "ok" else ["infeasible", "", ""]), r["seeds"], r["verdict_vs_bsd"] or ""])


def _method_type(methods: tuple[Setting, ...]):
    """argparse type of ``--methods``: the :class:`Setting` a name stands for, whose base is one of
    ``methods``' or :data:`BASES`, or a B-spline variant (:func:`bsd_variant`)."""
    def parse(value: str) -> Setting:
        setting = Setting.parse(value)
        base = setting.base
        if base in {m.base for m in methods} or base in BASES:
            return setting
        if base.startswith("bsd-"):
            try:
                bsd_variant(base)
            except ValueError as err:
                raise argparse.ArgumentTypeError(str(err)) from None
            return setting
        raise argparse.ArgumentTypeError(f"invalid method {value!r} (choose from {', '.join(map(str, methods))} "
                                         "or bsd-<option>…)")
    return parse


def add_arguments(parser: argparse.ArgumentParser, methods: tuple[Setting, ...], *, quick: str = "vit/fashion-mnist",
                  budgets: str = "0.1 0.2 0.35 0.5 0.7") -> None:
    """The options both studies share (model, data, budgets, methods, seeds, solver, output);
    ``quick`` and ``budgets`` only document the script's presets in the help."""
    parser.add_argument("--model", choices=("deit", "vit"), default=None,
                        help=f"default deit (quick: {quick.split('/')[0]})")
    parser.add_argument("--dataset", choices=("usps", "fashion-mnist"), default=None,
                        help=f"default usps; vit: fashion-mnist (quick: {quick.split('/')[1]})")
    parser.add_argument("--checkpoint", default=None, help="trained model (default checkpoints/<model>-<dataset>)")
    parser.add_argument("--test-subset", type=int, default=None, help="test images (0 = all)")
    parser.add_argument("--budgets", type=float, nargs="+", default=None,
                        help=f"target reductions ρ of the whole model (full: {budgets})")
    parser.add_argument("--methods", nargs="+", type=_method_type(methods), default=None,
                        help=f"any of {' '.join(map(str, methods))}, or a B-spline variant bsd-<option>… "
                             "(options: greedy, warm, nu<ν>, s<k>, it<n>; e.g. bsd-warm-nu8)")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per (method, ρ) (full: 3)")
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--dof", type=int, default=4, help="ν of the B-splines")
    parser.add_argument("--degree", type=int, default=3, help="degree of the B-splines")
    parser.add_argument("--samples", type=int, default=None, help="fix S per block (default: S = max(128, 2r))")
    parser.add_argument("--max-iter", type=int, default=None, help="R-CMTF sweeps per block (full: 300)")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)


def apply_overrides(plan: dict, args, keys: tuple[str, ...]) -> dict:
    """``plan`` with the options given on the command line (a subset of 0 means all)."""
    plan = dict(plan)
    for key in keys:
        value = getattr(args, key, None)
        if value is not None:
            plan[key] = (value or None) if key.endswith("subset") else tuple(value) if isinstance(value, list) else value
    return plan


def run_study(args, plan: dict, prefix: str, *, script: str, argv, mode: str, describe, title: str,
              paper: dict | None = None, plotter=None) -> int:
    """Run every (ρ, method, seed) unit of ``plan`` (resuming finished ones), then write
    ``<args.out>/<prefix>.json`` (runs, summary rows, paired verdicts against bsd, command,
    provenance, wall time), ``.csv`` and ``.png``.

    Args:
      args: parsed options of :func:`add_arguments` (plus ``teacher`` where the plan fine-tunes
        with one); plan: ``model``, ``dataset``, ``budgets``, ``methods`` (:class:`Setting` s),
        ``seeds``, ``epochs``,
        ``train_subset``, ``test_subset``, ``blocks``, ``max_iter`` (optional ``teacher``: False
        to load none; ``val_fraction``, ``capture_images``: see :func:`run_unit`).
      prefix: output file name stem and state folder (``<out>/state/<prefix>/protocol-<key>/``;
        the key hashes the model, data and block order, never the methods).
      script, argv: for the recorded command; mode: recorded as ``mode``.
      describe: ``describe(plan, data, teacher, order) -> str``, the protocol sentence recorded.
      title: first line of the plot title.
      paper: the paper's values to record beside ours, if any.
      plotter: draws ``<prefix>.png`` as :func:`plot` does, same arguments (default :func:`plot`).
    """
    kind, name = plan["model"], plan["dataset"]
    args.out.mkdir(parents=True, exist_ok=True)
    command = command_line(script, argv)
    enable_compilation_cache()
    timer = Timer()

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    quick_dir = args.out / "checkpoints" if mode in ("quick", "smoke") else None
    dataset = load_dataset(name)
    teacher, teacher_info = None, None
    if (kind, name) in TEACHERS and plan.get("teacher", True):
        teacher, teacher_info = load_or_train(*TEACHERS[(kind, name)], checkpoint=getattr(args, "teacher", None),
                                                     quick_dir=quick_dir, log=log)
    model, model_info = load_or_train(kind, name, checkpoint=args.checkpoint, quick_dir=quick_dir, log=log)
    data = subset(dataset, train=plan["train_subset"], test=plan["test_subset"], seed=args.seed)
    model_path = pathlib.Path(model_info["checkpoint"])
    model_path = model_path if model_path.is_absolute() else ROOT / model_path

    # Back to front (the paper's BF) unless the plan says otherwise (the refinement targets' ablation).
    order = list(block_order(plan.get("order", "back-to-front"), len(model.blocks)))
    if plan["blocks"]:
        order = order[: plan["blocks"]]
    acc_original = 100 * evaluate(model, data.test_images, data.test_labels)
    acc_teacher = 100 * evaluate(teacher, data.test_images, data.test_labels) if teacher is not None else None
    params_original = count_params(model)
    log(f"{kind}/{name}: {params_original} parameters (MLPs of the compressed blocks: "
        f"{sum(count_params(model.blocks[i].mlp) for i in order)}), test accuracy {acc_original:.2f} % on "
        f"{data.test_images.shape[0]} images; blocks {order}; fine-tuning {plan['epochs']} epoch(s) on "
        f"{data.train_images.shape[0]} images after every block")

    protocol = {"model": kind, "dataset": name, "checkpoint": checkpoint_key(model_info["checkpoint"]),
                "teacher": checkpoint_key(teacher_info["checkpoint"]) if teacher_info else None,
                "train": plan["train_subset"],
                "test": plan["test_subset"], "data_seed": args.seed, "order": order}
    key = protocol_key(protocol)
    protocol_dir = args.out / "state" / prefix / f"protocol-{key}"
    units = []
    for reduction in plan["budgets"]:
        for setting in plan["methods"]:
            for seed in range(args.seed, args.seed + plan["seeds"]):
                units.append(run_unit(setting, reduction, seed, model_path=model_path, data=data, order=order,
                                      plan=plan, args=args, teacher=teacher, protocol_dir=protocol_dir, log=log))
    rows, verdicts, verdicts_prune = summarize(units, plan)
    table = format_table(rows, acc_original, params_original)
    print(table)
    payload = {
        "command": command,
        "mode": mode,
        "plan": {k: list(v) if isinstance(v, tuple) else v for k, v in plan.items()},
        "protocol": describe(plan, data, teacher, order),
        "protocol_key": key,
        "samples_rule": {"fixed": args.samples} if args.samples else {"min": 128, "per_rank": 2},
        "verdict_rule": ("per rho, paired over seeds against bsd: 'holds' if bsd's mean accuracy is higher and "
                         "the paired t-test gives p < 0.05, 'does not hold' if lower with p < 0.05, else "
                         "'within noise'; the sign test (binomtest) is reported beside it"),
        "model": model_info, "teacher": teacher_info, "teacher_accuracy": acc_teacher,
        "accuracy_original": acc_original, "params_original": params_original,
        "test_images": int(data.test_images.shape[0]), "train_images": int(data.train_images.shape[0]),
        "blocks": order, "rows": rows, "verdicts": verdicts,
        "verdicts_vs_prune": verdicts_prune or None,
        "paper": ({k: dict(zip(("accuracy", "params", "reduction"), v)) for k, v in paper.items()}
                  if paper else None),
        "machines": sorted({u["machine"] for u in units if u.get("machine")}),
        "table": table, "runs": units, "wall_seconds": timer(),
    }
    write_json(args.out / f"{prefix}.json", payload)
    write_csv(rows, args.out / f"{prefix}.csv")
    (plotter or plot)(rows, args.out / f"{prefix}.png", acc_original, params_original,
         f"{title}: accuracy against parameters (mean ± std over {plan['seeds']} seeds)\n"
         + (f"fine-tuning {plan['epochs']} epoch(s) on {data.train_images.shape[0]} images after every block"
            if plan["epochs"] else "no fine-tuning"))
    print(f"wrote {args.out / (prefix + '.json')}, .csv and .png ({timer():.0f} s)")
    return 0
