"""Label-free refinement (issue 37): every replacement refined without labels (jaxbsd.Refine).
The refined units of a study are its methods with a suffix ``-ref<n>`` (n Adam steps, target
"local") or ``-refc<n>`` (target "consistent"), beside the unrefined units of the same study.
Its tables, its figure sources and the prose helpers its figures call."""

from __future__ import annotations

from typing import Iterable

import numpy as np

from .. import committed
from ..committed import source_line
from ..formats import bench_value, md, pm, sgn
from ..names import NAMES, REFINE_STEPS, display, join, prose_name, refined, setting
from ..registry import helper, source, table
from ..stats import AUTO_MARGIN, AutoRule, Paired, Study
from .lm import LanguageModel


#: The refined training-free study per pair: (title, short name in :data:`SOURCES`, file, the
#: command that writes it, methods in table order, the fine-tuned comparison of the same pair and
#: which of its methods stands beside each of ours).
REFINE_PAIRS = (
    ("ViT / Fashion-MNIST", "tf_vit", "training_free_vit_fashion-mnist.json",
     "python experiments/training_free.py --model vit --dataset fashion-mnist --budgets 0.1 0.2 0.35 0.5 --methods "
     "bsd svd drone prune bsd-warm auto auto-block bsd-warm-ref300 svd-ref300 drone-ref300 prune-ref300 auto-ref300",
     ("bsd-warm", "prune", "auto", "svd", "drone"), "comparison_vit_fashion-mnist.json",
     {"bsd-warm": "bsd", "prune": "prune", "svd": "svd", "drone": "drone"}),
    ("DeiT / USPS", "rf_deit", "refine_main_deit_usps.json", "python experiments/refine_ablation.py --study main --budgets 0.1 0.2 0.35 0.5",
     ("bsd-warm", "prune", "auto"), "comparison.json", {"bsd-warm": "bsd", "prune": "prune"}),
)


#: Issue 37's acceptance: the best refined method at ρ = 0.5 within this many points of the original.
REFINE_BOUND = {"tf_vit": 1.5, "rf_deit": 0.5}


REFINE_TITLES = {"tf_vit": "ViT/Fashion-MNIST", "rf_deit": "DeiT/USPS", "rf_steps": "ViT/Fashion-MNIST",
                 "rf_targets": "ViT/Fashion-MNIST", "rf_batch_vit": "ViT/Fashion-MNIST", "rf_batch_deit": "DeiT/USPS"}


def _paired_cell(v: "Paired", unit: str = "") -> str:
    """A paired difference as a table cell: ``+1.58 (p = 0.0031)``."""
    if not v.n:
        return "—"
    if v.n < 2:
        return f"{v.d}{unit} (1 seed)"
    return f"{v.d}{unit} ({v.pv})"


def _verdict_paired(v: "Paired") -> str:
    """A paired verdict as a table cell: ``holds (+0.80, p = 0.011)``."""
    if not v.n:
        return "no paired runs"
    return f"{v.verdict} ({v.d}, " + ("1 seed" if v.n < 2 else v.pv) + ")"


def _seeds_pm(values: list[float], digits: int = 2) -> str:
    return "—" if not values else pm(float(np.mean(values)), float(np.std(values)), digits)


def _refine_missing(title: str, d: dict | None, command: str, methods: Iterable[str]) -> str | None:
    """The line a refinement table shows instead of itself, or ``None`` when it has runs to show."""
    if d is None:
        return f"**{title}**: No current result committed (`{command}`)."
    if not Study(d).has(*methods):
        return f"**{title}**: the committed result has no refined runs yet (`{command}`)."
    return None


@table("refine-main")
def refine_main_table() -> str:
    """Issue 37: per pair, method and ρ, top-1 without and with label-free refinement (mean ± std
    over seeds), the gain paired over seeds, and beside it the fine-tuned (labels) comparison."""
    out = []
    for title, _, name, command, methods, cmp_name, cmp_methods in REFINE_PAIRS:
        d = committed.load(name)
        if (missing := _refine_missing(title, d, command, [refined(m) for m in methods[:2]])) is not None:
            out += [missing, ""]
            continue
        s, c = Study(d), committed.load(cmp_name)
        cmp = Study(c) if c is not None else None
        rows = []
        for rho in [r for r in d["plan"]["budgets"] if any(s.has(refined(m), rho=r) for m in methods)]:
            for m in methods:
                if not s.has(m, rho=rho) and not s.has(refined(m), rho=rho):
                    continue
                base, ref = s.seeds(m, rho), s.seeds(refined(m), rho)
                gain = s.gain(m, rho)
                ft, behind = "—", "—"
                other = cmp_methods.get(m)
                if cmp is not None and other and cmp.has(other, rho=rho):
                    ft_values = cmp.seeds(other, rho)
                    ft = _seeds_pm(ft_values) + ("" if other == m else f" ({NAMES.get(other, other)})")
                    if ref:
                        behind = sgn(float(np.mean(ref)) - float(np.mean(ft_values)))
                rows.append([f"{rho:g}", display(m), str(len(ref)), _seeds_pm(base), _seeds_pm(ref),
                             _paired_cell(gain), ft, behind])
        ft_head = (f"fine-tuned with labels ({c['plan']['epochs']} epoch(s) after every block)" if c is not None
                   else "fine-tuned with labels")
        out += [f"**{title}**, no labels (original {d['accuracy_original']:.2f} %; mean ± std over the seeds shown: "
                "calibration images and solver key). Refined = every replacement trained for "
                f"{REFINE_STEPS} full-batch Adam steps towards the original MLP's outputs (the local target) on its calibration tokens as it is "
                "built, the best step on held-out tokens kept. Gain = refined − unrefined, paired over seeds (t-test). "
                "Beside it the committed comparison with label fine-tuning"
                + ("" if c is None else f" (`{c['provenance']['command']}`)" if c.get("provenance") else "")
                + " at the same ρ (the B-spline rows: the old-default decoupling, `bsd`, fine-tuned) and the refined "
                "mean minus the fine-tuned one (separate studies: not paired).", "", source_line(d), "",
                md(["ρ", "method", "seeds", "no refinement", f"refined ({REFINE_STEPS} full-batch steps, local target)", "gain",
                    ft_head, "refined − fine-tuned"], rows), ""]
    return "\n".join(out).rstrip()


@table("refine-verdicts")
def refine_verdicts_table() -> str:
    """Issue 37's acceptance with refinement, per pair and ρ: the best refined method against the
    original, ``auto`` against the better of B-spline and pruning (refined), and B-spline against
    pruning (refined), paired over seeds."""
    out = []
    for title, short, name, command, methods, _, _ in REFINE_PAIRS:
        d = committed.load(name)
        needed = [refined(m) for m in ("bsd-warm", "prune")]
        if (missing := _refine_missing(title, d, command, needed)) is not None:
            out += [missing, ""]
            continue
        s = Study(d)
        rows = []
        for rho in s.budgets(*needed):
            best = s.best_refined(rho, methods)
            gap = s.mean(best, rho) - d["accuracy_original"]
            bound = REFINE_BOUND.get(short)
            bound_cell = ("—" if rho != 0.5 or bound is None else
                          f"within {bound:g}: " + ("yes" if gap >= -bound else "**no**"))
            if s.has(refined("auto"), rho=rho):
                rule = AutoRule(s, rho)
                auto_cells = [f"{sgn(rule.diff)} against {display(setting(rule.against).base)} ({rule.paired.pv})",
                              "yes" if rule.holds else "**no**"]
            else:
                auto_cells = ["—", "—"]
            v = s.vs(needed[0], needed[1], rho)
            rows.append([f"{rho:g}", f"{display(setting(best).base)} ({s.mean(best, rho):.2f} %)",
                         f"{sgn(gap)}", bound_cell, *auto_cells,
                         _verdict_paired(v)])
        out += [f"**{title}** (original {d['accuracy_original']:.2f} %), every method refined ({REFINE_STEPS} full-batch steps, local target):",
                "", md(["ρ", "best refined method", "its gap to the original, points", "issue 37's bound (ρ = 0.5)",
                        "auto − max(B-spline, pruning)", f"auto ≥ max − {AUTO_MARGIN:g} or p ≥ 0.05",
                        "B-spline beats pruning (Δ = B-spline − pruning)"], rows), ""]
    return "\n".join(out).rstrip()


def _refine_seconds(study: "Study", method: str, rho: float) -> str:
    """The seconds of the refinement stage per MLP, mean over every block of every seed's run
    (``—`` if the runs record none)."""
    secs = [st["refine"]["seconds"] for r in study._runs(method, rho).values() for st in r.get("steps") or []
            if isinstance(st.get("refine"), dict) and st["refine"].get("seconds") is not None]
    return "—" if not secs else bench_value(float(np.mean(secs)), "s")


@table("refine-steps")
def refine_steps_table() -> str:
    """Issue 37's ablation of the number of steps (0 = the unrefined method): top-1 mean ± std,
    the gain over the unrefined method paired over seeds, and the seconds of refinement per block."""
    d = committed.load("refine_steps_vit_fashion-mnist.json")
    command = "python experiments/refine_ablation.py --study steps"
    if d is None:
        return f"No current result committed (`{command}`)."
    s = Study(d)
    bases = [m for m in ("bsd-warm", "prune") if any(setting(x).base == m for x in d["plan"]["methods"])]
    steps = sorted({st.refine.steps for m in d["plan"]["methods"] if (st := setting(m)).base in bases} | {0})
    rho = d["plan"]["budgets"][0]
    rows = []
    for n in steps:
        row = [str(n)]
        for b in bases:
            m = refined(b, n)
            if not s.has(m, rho=rho):
                row += ["—", "—", "—"]
                continue
            row += [s.pm(m, rho), "(reference)" if not n else _paired_cell(s.vs(m, b, rho)),
                    _refine_seconds(s, m, rho)]
        rows.append(row)
    header = ["steps"] + [f"{display(b)}{h}" for b in bases for h in (": top-1 %", ": gain", ": s per block")]
    return "\n".join([f"ViT / Fashion-MNIST, ρ = {rho:g}, no labels (original {d['accuracy_original']:.2f} %; "
                      f"mean ± std over {d['plan']['seeds']} seeds). Gain = against the same method unrefined, "
                      "paired over seeds; s per block = seconds of the refinement stage per MLP, mean over blocks "
                      "and seeds.", "", source_line(d), "", md(header, rows)])


#: Tokens per step of :class:`jaxbsd.Refine`'s default loop, as the studies name it (``-ref<n>b512``).
REFINE_BATCH = 512


@table("refine-batch")
def refine_batch_table() -> str:
    """Issue 37's full-batch loop (the studies' ``-ref300``) against minibatch loops (``-ref300b512``,
    ``-ref300b256``, on the ViT also ``-ref1000b512``), per pair at ρ = 0.5: top-1, the difference
    from the full-batch loop paired over seeds, and the seconds of refinement per block."""
    out = []
    for pair, file in (("ViT / Fashion-MNIST", "refine_batch_vit_fashion-mnist.json"),
                       ("DeiT / USPS", "refine_batch_deit_usps.json")):
        d = committed.load(file)
        if d is None:
            model = "" if "vit" in file else " --model deit"
            out.append(f"**{pair}**: no current result committed (`python experiments/refine_ablation.py "
                       f"--study batch{model}`).")
            continue
        s = Study(d)
        rho = d["plan"]["budgets"][0]
        rows = []
        for b in ("bsd-warm", "prune"):
            full = refined(b)
            minibatch = sorted(((m, v) for m in d["plan"]["methods"]
                                if (st := setting(m)).base == b and (v := st.refine).batch),
                               key=lambda mv: (-mv[1].batch, -mv[1].steps, mv[1].learning_rate or 0.0))
            variants = [(full, "300 full-batch steps")] + [
                (m, f"{v.steps} steps of {v.batch} tokens" + (f", learning rate {v.learning_rate:g}" if v.learning_rate else ""))
                for m, v in minibatch]
            for m, how in variants:
                if not s.has(m, rho=rho):
                    continue
                rows.append([display(b), how, s.pm(b, rho) if s.has(b, rho=rho) else "—", s.pm(m, rho),
                             "(reference)" if m == full else _paired_cell(s.vs(m, full, rho)),
                             _refine_seconds(s, m, rho)])
        out += [f"**{pair}**, ρ = {rho:g}, back to front, no labels (original {d['accuracy_original']:.2f} %; mean ± "
                f"std over {d['plan']['seeds']} seeds). Δ = against the full-batch loop, paired over seeds; "
                "s per block = seconds of the refinement stage per MLP, mean over blocks and seeds (wall "
                "time of a study on a shared machine: the benchmark below times the two loops side by side).",
                "", source_line(d), "",
                md(["method", "refinement", "unrefined", "refined", "Δ against full batch", "s per block"], rows), ""]
    return "\n".join(out).rstrip()


@table("refine-targets")
def refine_targets_table() -> str:
    """Issue 37's two targets, front to back: local against consistent, paired over seeds."""
    d = committed.load("refine_targets_vit_fashion-mnist.json")
    command = "python experiments/refine_ablation.py --study targets"
    if d is None:
        return f"No current result committed (`{command}`)."
    s = Study(d)
    rho = d["plan"]["budgets"][0]
    rows = []
    for b in ("bsd-warm", "prune"):
        local, consistent = refined(b), refined(b, target="consistent")
        if not (s.has(local, rho=rho) or s.has(consistent, rho=rho)):
            continue
        v = s.vs(consistent, local, rho)
        mini = [(n, refined(b, n, "consistent", REFINE_BATCH)) for n in (300, 1000)]
        rows.append([display(b), f"{rho:g}", s.pm(b, rho) if s.has(b, rho=rho) else "—",
                     s.pm(local, rho) if s.has(local, rho=rho) else "—",
                     s.pm(consistent, rho) if s.has(consistent, rho=rho) else "—",
                     _verdict_paired(v),
                     *(s.pm(m, rho) if s.has(m, rho=rho) else "—" for _, m in mini)])
    return "\n".join([f"ViT / Fashion-MNIST, every MLP replaced **front to back** (so the inputs an MLP is fed "
                      f"differ from the original model's), {REFINE_STEPS} steps, no labels (original "
                      f"{d['accuracy_original']:.2f} %; mean ± std over {d['plan']['seeds']} seeds). Local = the "
                      "original MLP applied to the inputs the compressed model feeds it; consistent = the original "
                      "model's own MLP outputs on the same images. Verdict = \"the consistent target is better\", "
                      "paired over seeds (Δ = consistent − local). The last two columns: the consistent "
                      f"target with the default loop (minibatches of {REFINE_BATCH} tokens), 300 and 1000 steps.",
                      "", source_line(d), "",
                      md(["method", "ρ", "no refinement", "local target", "consistent target",
                          "consistent beats local", f"consistent, {REFINE_BATCH}-token batches, 300 steps",
                          "… 1000 steps"], rows)])


@table("refine-lm")
def refine_lm_table() -> str:
    """Issue 37 on the character LM's gated MLPs, training-free: test bpc of B-spline and pruning
    with and without refinement per ρ, and refined B-spline against refined pruning."""
    d = committed.load("lm_compression.json")
    command = ("python experiments/lm_compression.py --methods bsd svd drone prune "
               f"bsd-ref{REFINE_STEPS} prune-ref{REFINE_STEPS}")
    if d is None:
        return f"No current result committed (`{command}`)."
    lm, setting = LanguageModel(d), "training-free"
    if not lm.has(refined("bsd"), refined("prune")):
        return f"The committed result has no refined runs yet (`{command}`)."
    rows = []
    for rho in lm.budgets(refined("bsd"), refined("prune")):
        cells = [f"{rho:g}"]
        for m in ("bsd", "prune"):
            cells += [_seeds_pm(lm.seeds(x, rho, setting=setting), 3) for x in (m, refined(m))]
            cells.append(_paired_cell(lm.gain(m, rho, setting=setting, digits=3)))
        v = lm.vs(refined("prune"), refined("bsd"), rho, setting=setting, digits=3)
        cells.append(_verdict_paired(v))
        rows.append(cells)
    return "\n".join([f"Character LM on pystdlib, training-free (original {d['bpc_original']:.4f} bits per "
                      f"character); mean ± std over {d['plan']['seeds']} seeds; lower is better. Gain = refined − "
                      "unrefined (negative: refinement lowers the bpc); verdict = \"refined B-spline has lower test "
                      "bpc than refined pruning\" (Δ = pruning − B-spline), paired over seeds. All methods, with "
                      "the fine-tuned setting, are in [the LM table](#a-character-language-model-with-gated-mlps-issue-23).",
                      "", source_line(d), "",
                      md(["ρ", "B-spline", "B-spline refined", "gain", "pruning", "pruning refined", "gain",
                          "refined B-spline lower bpc"], rows)])


def _title(study: "Study") -> str:
    return REFINE_TITLES.get(getattr(study, "source", ""), getattr(study, "source", "?"))


@helper
def auto_rules(*studies: "Study", steps: int = REFINE_STEPS) -> str:
    """Issue 37's rule for refined ``auto`` (:class:`AutoRule`) at every ρ of ``studies``, as a
    predicate grouped by outcome: "**holds** on ViT/Fashion-MNIST at every ρ (0.1: +0.00 against
    refined pruning, p = 0.42; ...) and on DeiT/USPS at ρ = 0.5 (...); it **fails** on DeiT/USPS
    at ρ = 0.35 (...)". A flipped outcome moves its ρ."""
    groups: dict[bool, list[str]] = {True: [], False: []}
    for s in studies:
        rules = [s.auto_rule(r, steps) for r in s.budgets(*(refined(m, steps) for m in ("auto", "bsd-warm", "prune")))]
        for outcome in (True, False):
            at = [r for r in rules if r.holds == outcome]
            if len(at) == len(rules) > 1:
                groups[outcome].append(f"on {_title(s)} at every ρ measured (" + "; ".join(f"{r.rho:g}: {r}" for r in at) + ")")
            elif at:
                groups[outcome].append(f"on {_title(s)} at ρ = " + join([f"{r.rho:g} ({r})" for r in at]))
    parts = [f"**{'holds' if o else 'fails'}** " + join(items) for o, items in groups.items() if items]
    return "; it ".join(parts) if parts else "is not measured yet (no refined `auto` run is committed)"


@helper
def refined_verdicts(a: str, b: str, *studies: "Study") -> str:
    """``a`` against ``b`` paired over seeds, per study, grouped by verdict (:meth:`Study.verdicts`):
    "on ViT/Fashion-MNIST, **holds** at ρ = ...; on DeiT/USPS, **within noise** at ρ = ..."."""
    parts = [f"on {_title(s)}, {s.verdicts(a, b)}" for s in studies if s.budgets(a, b)]
    return "; ".join(parts) if parts else "not measured yet (no refined runs are committed)"


@helper
def recovery(study: "Study", finetuned: "Study", rho: float, methods: Iterable[str]) -> str:
    """What label-free refinement gains over each unrefined method at ρ, beside what fine-tuning
    with labels (``finetuned``, the same method) gains over it: "+1.67 of +1.84 points for
    pruning, +5.07 of +15.02 for SVD and +3.07 of +9.36 for DRONE" (means over seeds)."""
    items = []
    for m in methods:
        if study.has(m, refined(m), rho=rho) and finetuned.has(m, rho=rho):
            base = study.mean(m, rho)
            items.append(f"{sgn(study.mean(refined(m), rho) - base)} of {sgn(finetuned.mean(m, rho) - base)}"
                         + (" points" if not items else "") + f" for {prose_name(m)}")
    return join(items) if items else "nothing (no method ran in both studies)"


source("rf_deit", "refine_main_deit_usps.json", Study)
source("rf_steps", "refine_steps_vit_fashion-mnist.json", Study)
source("rf_batch_vit", "refine_batch_vit_fashion-mnist.json", Study)
source("rf_batch_deit", "refine_batch_deit_usps.json", Study)
source("rf_targets", "refine_targets_vit_fashion-mnist.json", Study)
