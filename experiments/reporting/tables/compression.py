"""Method against method at a parameter budget: the comparison with fine-tuning (claim 1), the
training-free study, fidelity to the original model, the knobs of the decoupling and the rank
allocation, with their figure sources."""

from __future__ import annotations

import pathlib
from typing import Callable

import numpy as np

from .. import committed
from ..committed import source_line
from ..formats import md, pm, pval
from ..names import NAMES, is_refined, row_name
from ..registry import source, table
from ..stats import Result, Study


def _verdict_text(v: dict) -> str:
    """A paired verdict as a table cell."""
    return f"{v['verdict']} (Δ {v['mean_diff']:+.2f}, p = {pval(v['p_ttest'])})" if v["n"] else "no paired runs"


def _verdict_cell(d: dict, row: dict) -> str:
    """The paired verdict of ``row``'s method against the reference at its ρ, as a table cell."""
    v = d["verdicts"][repr(row["reduction"])].get(row["method"])
    return "(reference)" if v is None else _verdict_text(v)


def _vs_prune_cell(d: dict, row: dict) -> str:
    """The paired verdict "pruning beats this method" at the row's ρ (B-spline variants, auto)."""
    if row["method"] == "prune":
        return "(reference)"
    v = (d.get("verdicts_vs_prune") or {}).get(repr(row["reduction"]), {}).get(row["method"])
    return "—" if v is None else _verdict_text(v)


def _study_rows(d: dict, *, output_error: bool = True, verdict_header: str = "B-spline beats it",
                keep: Callable[[str], bool] = lambda method: True) -> str:
    """One table of a study: method × ρ (mean ± std, parameters, reduction), the mean per-block
    output error (``output_error``), the paired verdict against B-spline and, where pruning ran,
    against pruning. Only the methods ``keep`` accepts are shown."""
    vs_prune = bool(d.get("verdicts_vs_prune"))
    rows = []
    for r in d["rows"]:
        if not keep(r["method"]):
            continue
        if r["status"] != "ok":
            rows.append([row_name(r), f"{r['reduction']:g}", "infeasible"] + ["—"] * (3 + output_error + vs_prune))
            continue
        cells = [row_name(r), f"{r['reduction']:g}", pm(r["accuracy_mean"], r["accuracy_std"]),
                 f"{r['params_mean']:,.0f}", f"{100 * r['reduction_achieved_mean']:.2f} %"]
        if output_error:
            errs = [e for u in d["runs"] if u["method"] == r["method"] and u["reduction"] == r["reduction"]
                    and u.get("status") == "ok" for e in u.get("output_errors", {}).values() if e is not None]
            cells.append(f"{np.mean(errs):.3g}" if errs else "—")
        rows.append(cells + [_verdict_cell(d, r)] + ([_vs_prune_cell(d, r)] if vs_prune else []))
    header = (["method", "ρ", "top-1 %", "params", "reduction"] + (["output error"] if output_error else [])
              + [verdict_header] + (["pruning beats it"] if vs_prune else []))
    return md(header, rows)


#: The B-spline variant that ``compress_model``'s defaults now run (issue 24: warm start from the
#: pruned MLP, restart kept by its held-out output error); ``bsd`` in the studies is the old defaults.
NEW_BSD = "bsd-warm"


def auto_check(d: dict) -> list[str]:
    """Issue 24's acceptance, per ρ: ``auto`` against max(pruning, B-spline) (means over seeds)."""
    means = {(r["method"], r["reduction"]): r["accuracy_mean"] for r in d["rows"] if r["status"] == "ok"}
    lines = []
    for label in ("auto", "auto-block"):
        for rho in d["plan"]["budgets"]:
            auto = means.get((label, rho))
            others = {m: means.get((m, rho)) for m in ("prune", "bsd", NEW_BSD)}
            if auto is None or None in others.values():
                continue
            best = max(others.values())
            lines.append(f"ρ = {rho:g}: {label} {auto:.2f} against max(pruning {others['prune']:.2f}, B-spline "
                         f"{others['bsd']:.2f}, new defaults {others[NEW_BSD]:.2f}) = {best:.2f}: Δ {auto - best:+.2f} "
                         + ("(above all)" if auto > best else "(within 0.1)" if auto >= best - 0.1
                            else "(**more than 0.1 below**)"))
    return lines


@table("comparison")
def comparison_table() -> str:
    """Claim (1): method × ρ (mean ± std over seeds, parameters, verdict against B-spline)."""
    out = []
    for name, title in (("comparison.json", "DeiT / USPS"), ("comparison_vit_fashion-mnist.json",
                                                             "ViT / Fashion-MNIST")):
        d = committed.load(name)
        if d is None:
            out.append(f"**{title}**: No current result committed (`python experiments/comparison.py"
                       + (" --model vit --dataset fashion-mnist" if "vit" in name else "") + "`).")
            out.append("")
            continue
        out += [f"**{title}** (original {d['accuracy_original']:.2f} %, {d['params_original']:,} parameters; "
                f"mean ± std over {d['plan']['seeds']} seeds; fine-tuning {d['plan']['epochs']} epoch(s) on "
                f"{d['train_images']} images after every block, the same for every method). "
                "Verdict = \"B-spline (uniform) beats this method\", paired over seeds "
                "(t-test, p < 0.05).", "", source_line(d), ""]
        out += [_study_rows(d, output_error=False, verdict_header="claim (1) at this ρ"), ""]
    return "\n".join(out).rstrip()


@table("training-free")
def training_free_table() -> str:
    """Issues 21 and 24: method × ρ without fine-tuning (mean ± std over seeds, parameters, mean
    per-block output error, verdicts against B-spline and pruning), one table per model/data set,
    and ``auto`` against the best of the others per ρ."""
    out = []
    for name, title in (("training_free_deit_usps.json", "DeiT / USPS"),
                        ("training_free_vit_fashion-mnist.json", "ViT / Fashion-MNIST")):
        d = committed.load(name)
        if d is None:
            out += [f"**{title}**: No current result committed (`python experiments/training_free.py"
                    + (" --model vit --dataset fashion-mnist" if "vit" in name else "") + "`).", ""]
            continue
        out += [f"**{title}**, no fine-tuning at any step (original {d['accuracy_original']:.2f} %, "
                f"{d['params_original']:,} parameters; mean ± std over {d['plan']['seeds']} seeds of the calibration "
                "images and solver key). Output error = relative squared error of a block's output on its "
                "calibration tokens, averaged over blocks and seeds. Verdicts = \"B-spline (old defaults) beats "
                "this method\" and, where pruning ran beside them, \"pruning beats this method\", paired over seeds "
                "(t-test, p < 0.05).", "", source_line(d), "",
                _study_rows(d, keep=lambda m: not is_refined(m)), ""]
        if any(is_refined(r["method"]) for r in d["rows"]):
            out += ["The refined units of this result (`-ref…`) are in the tables of "
                    "[label-free refinement](#label-free-refinement-issue-37).", ""]
        if check := auto_check(d):
            out += ["`auto` against the best of the others (means over seeds):", ""] + [f"- {c}" for c in check] + [""]
        plot = pathlib.Path(name).with_suffix(".png").name
        if (committed.RESULTS / plot).exists():
            out += [f"![{title}, no fine-tuning: accuracy against parameters](plots/{plot})", ""]
    return "\n".join(out).rstrip()


@table("fidelity")
def fidelity_table() -> str:
    """Issue 24: is the more accurate compressed model the more faithful one? Per pair, ρ and
    method, test accuracy beside the distance to the original on the test inputs and on held-out
    training images (``experiments/fidelity.py``), and per ρ which method each criterion picks."""
    def cell(r, key, digits):
        return f"{r[key + '_mean']:.{digits}f} ± {r[key + '_std']:.{digits}f}"

    out = []
    for name, title, flags in (("fidelity_deit_usps.json", "DeiT / USPS", ""),
                               ("fidelity_vit_fashion-mnist.json", "ViT / Fashion-MNIST",
                                " --model vit --dataset fashion-mnist")):
        d = committed.load(name)
        if d is None:
            out += [f"**{title}**: No current result committed (`python experiments/fidelity.py{flags}`).", ""]
            continue
        rows = [r for r in d["rows"] if r["seeds"]]
        table = md(["ρ", "method", "top-1 % (test)", "rel. logit error (test inputs)", "KL (test inputs)",
                    "agreement % (test inputs)", "rel. logit error (held-out train)", "top-1 % (held-out train)",
                    "kept per block"],
                    [[f"{r['reduction']:g}", row_name(r), cell(r, "test_accuracy", 2),
                      cell(r, "test_relative_error", 4), cell(r, "test_kl", 4), cell(r, "test_agreement", 2),
                      cell(r, "heldout_train_relative_error", 4), cell(r, "heldout_train_accuracy", 2),
                      " ".join(r["kept"]) if r["method"].startswith("auto") else ""] for r in rows])
        picks = []
        for rho in dict.fromkeys(r["reduction"] for r in rows):
            at = [r for r in rows if r["reduction"] == rho]
            best = max(at, key=lambda r: r["test_accuracy_mean"])
            closest = min(at, key=lambda r: r["test_relative_error_mean"])
            picks.append(f"- ρ = {rho:g}: the most accurate on test is {row_name(best)} "
                         f"({best['test_accuracy_mean']:.2f} %); the closest to the original on the test inputs is "
                         f"{row_name(closest)} (relative error {closest['test_relative_error_mean']:.4f}, "
                         f"{closest['test_accuracy_mean']:.2f} %)"
                         + (": the same model." if best is closest else ": **not the same model**."))
        plot = pathlib.Path(name).with_suffix(".png").name
        out += [f"**{title}**, no fine-tuning (original {d['accuracy_original']:.2f} % on {d['test_images']:,} test "
                f"images); mean ± std over {d['plan']['seeds']} seeds.", "", source_line(d), "", table, "", *picks, "",
                f"![{title}: accuracy against the distance to the original](plots/{plot})", ""]
    return "\n".join(["Each model is the training-free study's unit of the same method, ρ and seed, rebuilt. "
                      "Distances are to the original model's logits; the test inputs' labels are used only for the "
                      "accuracy. Kept per block (`auto`): `b` decoupling, `p` pruned MLP, per seed, in the order of "
                      "compression.", "", *out]).rstrip()


@table("knobs")
def knobs_table() -> str:
    """Issue 24: the knob ablation of a training-free B-spline decoupling (ViT/Fashion-MNIST)."""
    d = committed.load("knobs_vit_fashion-mnist.json")
    if d is None:
        return "No current result committed (`python experiments/knobs.py`)."
    out = [f"ViT / Fashion-MNIST, no fine-tuning (original {d['accuracy_original']:.2f} %; mean ± std over "
           f"{d['plan']['seeds']} seeds). One knob of the old defaults changed per row. Verdicts as above: "
           "\"B-spline (old defaults) beats this variant\" and \"pruning beats it\", paired over seeds.",
           "", source_line(d), "", _study_rows(d), ""]
    if (committed.RESULTS / "knobs_vit_fashion-mnist.png").exists():
        out += ["![Knobs of the B-spline decoupling, ViT/Fashion-MNIST, no fine-tuning]"
                "(plots/knobs_vit_fashion-mnist.png)", ""]
    return "\n".join(out).rstrip()


@table("allocation")
def allocation_table() -> str:
    d = committed.load("allocation.json")
    if d is None:
        return "_No current result committed: run `python experiments/allocation.py`._"
    proto = d["protocol"]
    rows = []
    for allocation, summ in d["summary"].items():
        ranks = sorted({tuple(sorted(r["ranks"].items())) for r in d["runs"] if r["allocation"] == allocation})
        rank_text = "; ".join(", ".join(f"block {b}: {k}" for b, k in rs) for rs in ranks)
        rows.append([allocation, f"{summ['params'][0]:,.0f}", rank_text,
                     f"{summ['acc_cmtf'][0]:.2f} ± {summ['acc_cmtf'][1]:.2f}",
                     f"{summ['acc_ft'][0]:.2f} ± {summ['acc_ft'][1]:.2f}"])
    paired = "; ".join(
        f"{label}: greedy − uniform = {v['mean_difference']:+.2f} points"
        + (f" (paired t-test p = {v['p_value_paired_t']:.3f})" if v["p_value_paired_t"] is not None else "")
        + f", **{v['verdict']}**"
        for label, v in (("after decoupling", d["paired"]["acc_cmtf"]), ("after fine-tuning", d["paired"]["acc_ft"])))
    head = (f"{source_line(d)} ViT/Fashion-MNIST ({d['runs'][0]['acc_original']:.2f} % on {proto['test_images']} "
            f"test images, {d['runs'][0]['params_original']:,} parameters), reduction ρ = {proto['reduction']}, "
            f"back to front, cubic ν = 4, {proto['seeds']} seeds, {proto['finetune_epochs']} fine-tuning epoch(s) "
            f"on {proto['train_subset']:,} images per step; accuracy % after the last step, mean ± std over seeds.")
    return head + "\n\n" + md(["allocation", "params", "ranks", "after decoupling", "after fine-tuning"], rows) \
        + "\n\n" + paired + "."


@table("headline-comparison")
def headline_comparison(reduction: float = 0.5) -> str:
    """Claim (1) at one budget: top-1 of B-spline, SVD and DRONE on both models."""
    pairs = (("comparison.json", "DeiT / USPS"), ("comparison_vit_fashion-mnist.json", "ViT / Fashion-MNIST"))
    models = [(title, committed.load(name)) for name, title in pairs]
    models = [(t, d) for t, d in models if d is not None]
    if not models:
        return "_No comparison result committed._"
    rows = []
    for method in ("bsd", "svd", "drone"):
        row = [NAMES[method]]
        for _, d in models:
            r = next((r for r in d["rows"] if r["method"] == method and r["reduction"] == reduction), None)
            row.append("—" if r is None or r["status"] != "ok" else pm(r["accuracy_mean"], r["accuracy_std"]))
        rows.append(row)
    return md([f"method, ρ = {reduction:g} (top-1 %)", *(f"{t} ({d['accuracy_original']:.2f} % before)"
                                                         for t, d in models)], rows)


source("cmp_deit", "comparison.json", Study)
source("cmp_vit", "comparison_vit_fashion-mnist.json", Study)
source("tf_deit", "training_free_deit_usps.json", Study)
source("tf_vit", "training_free_vit_fashion-mnist.json", Study)
source("fid_deit", "fidelity_deit_usps.json", Study)
source("fid_vit", "fidelity_vit_fashion-mnist.json", Study)
source("knobs", "knobs_vit_fashion-mnist.json", Study)
source("alloc", "allocation.json", Result)
