"""The result tables of the README and the documentation site, generated from the committed
result JSON, and the staleness guard.

Usage::

    python experiments/report.py            # rewrite the generated blocks and figures of README.md and docs/
    python experiments/report.py --check    # exit 1 if a result is stale, a block or figure is out of date,
                                            # or a result-like number is typed by hand
    python experiments/report.py --results DIR   # read the results from DIR (a regenerated copy)

Every generated block sits between ``<!-- report:NAME -->`` and ``<!-- /report:NAME -->``;
nothing between the markers is typed by hand. ``NAME`` is a key of :data:`TABLES`. The pages
rendered and checked are :func:`target_files`: ``README.md`` (the short ``headline-*`` tables)
and every page of the documentation site under ``docs/``.

A figure in a sentence is a reference too: ``<!-- fig EXPR -->TEXT<!-- /fig -->``, where
``EXPR`` is a Python expression over the committed results (one short name per file,
:data:`SOURCES`, with helpers such as ``cmp_vit.vs("bsd", "svd", 0.1).d`` for a difference
paired over seeds, recomputed from the per-seed runs) and the formatters :func:`pct`,
:func:`sgn`, :func:`pv`, :func:`rng`, :func:`ratio`, :func:`count`...; ``TEXT`` is its
rendering, rewritten by this script. A sentence that only a result yet to be committed can
write is one figure guarded by ``has``: ``<!-- fig ("... " + rf_deit.moves("prune", 0.5)) if
has("rf_deit", "prune-ref300") else "not committed yet" -->`` renders the fallback until the
result (and those runs) exist, then the sentence; an unguarded figure of an absent result fails. The HTML comments are invisible on the site. A number
quoted from elsewhere (the paper, a run that is not committed) is wrapped in
``<!-- from SOURCE -->...<!-- /from -->``, naming the source. ``--check`` fails, naming file and
line, when a block or a figure no longer matches its result, and when a result-like number
(:data:`RESULT_LIKE`: a percentage, a p-value, a ``×`` ratio, a signed difference, a time or
difference with decimals) appears anywhere else in the prose of a page.

Staleness: every JSON under ``experiments/results/`` and ``benchmarks/`` records a
``provenance`` (:func:`jaxbsd.io.provenance`: command, commit, source hashes). A result computed
with the solver also records ``solver_fingerprint``, the values of a few canonical float64
solves (:mod:`jaxbsd.fingerprint`). ``--check`` (run by the test suite and by ``.ci/run``)
recomputes the fingerprint once and fails for a result whose recorded fingerprint moved beyond
:data:`jaxbsd.fingerprint.RTOL`, naming the result, the entries that moved and the command
that regenerates it; a solver result without a fingerprint, and a result without provenance,
fail too. A change that leaves the solver's numbers alone (a comment, a refactoring) stales
nothing; ``commit``, ``source_hash`` and ``solver_hash`` are kept as information only.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
from typing import Callable, Iterable

import numpy as np

from refine_names import refined as _refined_name, split_refine  # the studies' -ref… suffix (stdlib only)

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
README = ROOT / "README.md"
DOCS = ROOT / "docs"
BENCHMARKS = ROOT / "benchmarks"


def result_files(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    """Every committed result: ``experiments/results/*.json`` and ``benchmarks/*.json``."""
    return sorted((root / "experiments" / "results").glob("*.json")) + sorted((root / "benchmarks").glob("*.json"))


#: Provenance keys that mark a result computed with the solver (older results record only the
#: source hash of the solver files; those need a fingerprint too).
SOLVER_KEYS = ("solver_fingerprint", "fingerprint_version", "solver_hash", "solver_files")


def _fingerprint_module():
    """:mod:`jaxbsd.fingerprint` of this checkout: the numbers must be this checkout's solver's,
    not those of whichever ``jaxbsd`` is installed (an editable install may be another tree)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(1, str(ROOT))
    from jaxbsd import fingerprint

    return fingerprint


def stale_results(paths: Iterable[pathlib.Path], fingerprint: dict | None = None) -> list[str]:
    """Problems with the given result files: a missing or incomplete ``provenance``; for a result
    computed with the solver, no ``solver_fingerprint`` or one that moved beyond tolerance
    against ``fingerprint`` (default: this checkout's solver's, computed once, on first need).
    Empty when every result is current."""
    fp = _fingerprint_module()
    current = fingerprint
    problems = []
    foreign = not pathlib.Path(fp.__file__).resolve().is_relative_to(ROOT.resolve())
    for path in paths:
        try:
            prov = json.loads(path.read_text()).get("provenance")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
            problems.append(f"{path}: not a JSON results object ({e})")
            continue
        if not isinstance(prov, dict) or not all(prov.get(k) for k in ("command", "commit", "source_hash")):
            problems.append(f"{path}: no provenance (command, commit, source_hash); regenerate it with its script")
            continue
        if not any(k in prov for k in SOLVER_KEYS):
            continue  # not computed with the solver (a training run)
        recorded = prov.get("solver_fingerprint")
        if not isinstance(recorded, dict) or not recorded:
            problems.append(f"{path}: stale — computed with the solver at commit {str(prov['commit'])[:10]} but "
                            f"records no solver_fingerprint; regenerate: {prov['command']}")
            continue
        if prov.get("fingerprint_version") != fp.FINGERPRINT_VERSION:
            problems.append(f"{path}: stale — its solver_fingerprint is of version {prov.get('fingerprint_version')}, "
                            f"the current cases are version {fp.FINGERPRINT_VERSION}; regenerate: {prov['command']}")
            continue
        if current is None:
            if foreign:  # checked only when a fingerprint is needed
                return problems + [f"the solver fingerprint would come from {fp.__file__}, not from this checkout "
                                   f"({ROOT}): run from the checkout's root or put it first on PYTHONPATH"]
            current = fp.solver_fingerprint()
        moved = fp.compare_fingerprints(recorded, current)
        if moved:
            shown = "; ".join(moved[:4]) + (f"; and {len(moved) - 4} more" if len(moved) > 4 else "")
            problems.append(
                f"{path}: stale — the solver's numbers moved since commit {str(prov['commit'])[:10]} "
                f"({len(moved)} of {len(current)} fingerprint entries beyond rtol {fp.RTOL:g}: {shown}); "
                f"regenerate: {prov['command']}")
    return problems


def _load(name: str) -> dict | None:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else None


def _md(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _run_seconds(payload: dict) -> float:
    """Seconds the result's runs took, each as recorded when it finished (0 if none say)."""
    if "run_seconds_total" in payload:  # full_compression records the sum itself
        return payload["run_seconds_total"]
    runs = payload.get("runs")
    return sum(r.get("seconds") or 0 for r in runs if isinstance(r, dict)) if isinstance(runs, list) else 0.0


def _source_line(payload: dict) -> str:
    prov = payload.get("provenance")
    if not prov:
        return "**No provenance: this result is stale (report --check fails) and must be regenerated.**"
    wall = payload.get("wall_seconds")
    machines = payload.get("machines") or []
    if any("(cpu)" not in m for m in machines):
        # Runs kept from unit.json computed elsewhere (a GPU): say where, and what they cost there.
        where = f" (runs: {_run_seconds(payload) / 60:.1f} min on {', '.join(machines)})."
    elif wall and (runs := _run_seconds(payload)) > 2 * wall:
        # Most runs were kept from unit.json (a study that spans sessions): their own time counts.
        where = (f" (runs: {runs / 3600:.1f} h on the 2-core CPU machine over several sessions; "
                 f"this assembly {wall / 60:.1f} min).")
    else:
        where = f" ({wall / 60:.1f} min on the 2-core CPU machine)." if wall else "."
    return f"Generated from `{prov['command']}` at commit `{str(prov['commit'])[:10]}`" + where


def synthetic_tables() -> str:
    d = _load("synthetic.json")
    if d is None:
        return "_No synthetic result committed._"
    res = d["results"]
    strategies = list(res)
    out = [_source_line(d), "",
           "The paper's metric, eᵢ on the S = 200 sampling points (mean over "
           f"{d['protocol']['draws']} draws; ± the spread of the mean over draws):", ""]
    rows = []
    for name in res[strategies[0]]:
        for s in strategies:
            r = res[s][name]
            p = r["paper"]
            e1, e2 = r["e_S_mean"]
            rows.append([name.replace("nu", "ν"), s, f"{e1:.2f}", f"{p['e1']:.2f}", f"{e2:.2f}", f"{p['e2']:.2f}",
                         f"{r['e_S_avg']:.2f} ± {r['e_S_avg_std']:.2f}", f"{p['mean']:.2f}"])
    out.append(_md(["method", "restarts", "e₁ %", "paper", "e₂ %", "paper", "mean %", "paper"], rows))
    out += ["", "Beside it, never instead of it: held-out points in the same square, and points outside "
            "it (extrapolation, x ∈ [−7.5, 7.5]² \\ [−5, 5]²):", ""]
    rows = []
    for name in res[strategies[0]]:
        for s in strategies:
            r = res[s][name]
            cells = []
            for metric in ("e_heldout", "e_outside"):
                e1, e2 = r[f"{metric}_mean"]
                cells.append(f"{e1:.2f} / {e2:.2f} / {r[f'{metric}_avg']:.2f}")
            statuses = ", ".join(f"{k} {v}" for k, v in r["status_counts"].items())
            rows.append([name.replace("nu", "ν"), s, *cells, statuses])
    out.append(_md(["method", "restarts", "held-out e₁ / e₂ / mean %", "outside e₁ / e₂ / mean %",
                    "restart statuses (all draws)"], rows))
    return "\n".join(out)


def _ablation_table(d: dict) -> str:
    g = d["grids"]
    rows = []
    for variant in g["variants"]:
        for lam in g["lams"]:
            cells = []
            for col in g["columns"]:
                counts = g["counts"][variant][repr(lam)][col]
                runs = sum(np.sum(counts[s]) for s in counts if s != "nonfinite_logits")
                if runs < len(g["y"][col]) * len(g["ranks"]) * d["grid"]["restarts"]:
                    cells.append("not yet rerun")
                    continue
                vals = [np.nanmean(np.asarray(g[m][variant][repr(lam)][col], dtype=float))
                        for m in ("accuracy", "error_J", "error_F")]
                cells.append(f"{vals[0]:.2f} / {vals[1]:.3f} / {vals[2]:.3f}")
            rows.append([variant, f"{lam:g}", *cells])
    return _md(["variant", "λ", *g["columns"]], rows)


def ablation_tables() -> str:
    out = []
    for name in ("mnist", "fashion-mnist"):
        d = _load(f"ablation_{name}.json")
        if d is None:
            out.append(f"**{name}**: no current result committed (see the text above).")
            continue
        out += [f"**{name}** (original accuracy {d['accuracy_original_eval_subset']:.2f} % on "
                f"{d['eval_images']} test images; cells: accuracy % / Error(𝒥) / Error(F), mean over ranks, "
                f"degrees or ν and {d['grid']['restarts']} runs). Status counts: "
                + ", ".join(f"{k} {v}" for k, v in d["grids"]["status_totals"].items()) + ".",
                "", _source_line(d)
                + (f" Partial: {d['configurations']['done']} of {d['configurations']['total']} configurations "
                   "finished; the others are listed in the JSON and resume with the same command."
                   if d.get("configurations", {}).get("missing") else ""),
                "", _ablation_table(d), ""]
    return "\n".join(out).rstrip()


def training_table() -> str:
    d = _load("training.json")
    if d is None:
        return "_No training result committed._"
    rows = []
    for r in d["runs"]:
        rows.append([f"{r['model']} / {r['dataset']}", f"{r['params']:,}", str(r["epochs"]),
                     f"{100 * r['test_acc']:.2f} %", f"{r['wall_seconds'] / 60:.1f} min"])
    return _md(["model / data", "params", "epochs", "test accuracy", "wall time"], rows)


def _bench_value(x, unit: str) -> str:
    """A measured benchmark value in its unit (times scaled to s, ms or µs)."""
    if x is None:
        return "—"
    if unit != "s":
        return f"{x:.2f} {unit}"
    return f"{x:.2f} s" if x >= 1 else f"{x * 1e3:.2f} ms" if x >= 1e-3 else f"{x * 1e6:.1f} µs"


def benchmark_table(name: str = "results.json") -> str:
    """The benchmark table of ``benchmarks/<name>``, headed by the machine that measured it."""
    path = BENCHMARKS / name
    if not path.exists():
        return "_No benchmark result committed._"
    d = json.loads(path.read_text())
    if not d.get("provenance"):
        return _source_line(d)
    value = _bench_value
    rows = []
    for r in d["rows"]:
        ratio = "—" if r.get("ratio") is None else f"{r['ratio']:.2f}×"
        passed = {True: "yes", False: "**no**", None: "—"}[r.get("passed")]
        unit = r.get("unit", "s")
        rows.append([r["name"], value(r.get("ours"), unit), value(r.get("reference"), unit), ratio,
                     str(r.get("target") or "—"), passed])
    m = d["machine"]
    head = (f"Generated from `{d['provenance']['command']}` at commit `{str(d['provenance']['commit'])[:10]}` "
            f"({d['total_s'] / 60:.1f} min on {m.get('device_kind', '?')} ({m.get('backend', '?')}), "
            f"{m.get('cpu_count', '?')} CPUs, jax {m.get('jax', '?')}, load at start "
            f"{[round(x, 2) for x in m.get('loadavg_start') or []]}).")
    notes = [f"- {r['name']}: {r['note']}" for r in d["rows"]
             if r.get("note") and (r["name"].startswith("(f)") or "headline" in r["name"])]
    table = _md(["benchmark", "ours", "reference", "ratio", "target", "met"], rows)
    return head + "\n\n" + table + ("\n\n" + "\n".join(notes) if notes else "")


_NAMES = {"svd": "SVD", "drone": "DRONE", "bsd": "B-spline", "bsd-greedy": "B-spline (greedy)", "prune": "Pruning"}


def _name(row: dict) -> str:
    """A summary row's method as displayed (the study records it; older results: by key)."""
    return row.get("name") or _NAMES.get(row["method"], row["method"])


def _pm(mean, std, digits=2) -> str:
    return "—" if mean is None else f"{mean:.{digits}f} ± {std:.{digits}f}"


def _pval(p) -> str:
    return "n/a" if p is None else f"{p:.3g}"


def comparison_table() -> str:
    """Claim (1): method × ρ (mean ± std over seeds, parameters, verdict against B-spline)."""
    out = []
    for name, title in (("comparison.json", "DeiT / USPS"), ("comparison_vit_fashion-mnist.json",
                                                             "ViT / Fashion-MNIST")):
        d = _load(name)
        if d is None:
            out.append(f"**{title}**: No current result committed (`python experiments/comparison.py"
                       + (" --model vit --dataset fashion-mnist" if "vit" in name else "") + "`).")
            out.append("")
            continue
        out += [f"**{title}** (original {d['accuracy_original']:.2f} %, {d['params_original']:,} parameters; "
                f"mean ± std over {d['plan']['seeds']} seeds; fine-tuning {d['plan']['epochs']} epoch(s) on "
                f"{d['train_images']} images after every block, the same for every method). "
                "Verdict = \"B-spline (uniform) beats this method\", paired over seeds "
                "(t-test, p < 0.05).", "", _source_line(d), ""]
        out += [_study_rows(d, output_error=False, verdict_header="claim (1) at this ρ"), ""]
    return "\n".join(out).rstrip()


def _verdict_text(v: dict) -> str:
    """A paired verdict as a table cell."""
    return f"{v['verdict']} (Δ {v['mean_diff']:+.2f}, p = {_pval(v['p_ttest'])})" if v["n"] else "no paired runs"


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
            rows.append([_name(r), f"{r['reduction']:g}", "infeasible"] + ["—"] * (3 + output_error + vs_prune))
            continue
        cells = [_name(r), f"{r['reduction']:g}", _pm(r["accuracy_mean"], r["accuracy_std"]),
                 f"{r['params_mean']:,.0f}", f"{100 * r['reduction_achieved_mean']:.2f} %"]
        if output_error:
            errs = [e for u in d["runs"] if u["method"] == r["method"] and u["reduction"] == r["reduction"]
                    and u.get("status") == "ok" for e in u.get("output_errors", {}).values() if e is not None]
            cells.append(f"{np.mean(errs):.3g}" if errs else "—")
        rows.append(cells + [_verdict_cell(d, r)] + ([_vs_prune_cell(d, r)] if vs_prune else []))
    header = (["method", "ρ", "top-1 %", "params", "reduction"] + (["output error"] if output_error else [])
              + [verdict_header] + (["pruning beats it"] if vs_prune else []))
    return _md(header, rows)


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


def training_free_table() -> str:
    """Issues 21 and 24: method × ρ without fine-tuning (mean ± std over seeds, parameters, mean
    per-block output error, verdicts against B-spline and pruning), one table per model/data set,
    and ``auto`` against the best of the others per ρ."""
    out = []
    for name, title in (("training_free_deit_usps.json", "DeiT / USPS"),
                        ("training_free_vit_fashion-mnist.json", "ViT / Fashion-MNIST")):
        d = _load(name)
        if d is None:
            out += [f"**{title}**: No current result committed (`python experiments/training_free.py"
                    + (" --model vit --dataset fashion-mnist" if "vit" in name else "") + "`).", ""]
            continue
        out += [f"**{title}**, no fine-tuning at any step (original {d['accuracy_original']:.2f} %, "
                f"{d['params_original']:,} parameters; mean ± std over {d['plan']['seeds']} seeds of the calibration "
                "images and solver key). Output error = relative squared error of a block's output on its "
                "calibration tokens, averaged over blocks and seeds. Verdicts = \"B-spline (old defaults) beats "
                "this method\" and, where pruning ran beside them, \"pruning beats this method\", paired over seeds "
                "(t-test, p < 0.05).", "", _source_line(d), "",
                _study_rows(d, keep=lambda m: not is_refined(m)), ""]
        if any(is_refined(r["method"]) for r in d["rows"]):
            out += ["The refined units of this result (`-ref…`) are in the tables of "
                    "[label-free refinement](#label-free-refinement-issue-37).", ""]
        if check := auto_check(d):
            out += ["`auto` against the best of the others (means over seeds):", ""] + [f"- {c}" for c in check] + [""]
        plot = pathlib.Path(name).with_suffix(".png").name
        if (RESULTS / plot).exists():
            out += [f"![{title}, no fine-tuning: accuracy against parameters](plots/{plot})", ""]
    return "\n".join(out).rstrip()


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
        d = _load(name)
        if d is None:
            out += [f"**{title}**: No current result committed (`python experiments/fidelity.py{flags}`).", ""]
            continue
        rows = [r for r in d["rows"] if r["seeds"]]
        table = _md(["ρ", "method", "top-1 % (test)", "rel. logit error (test inputs)", "KL (test inputs)",
                     "agreement % (test inputs)", "rel. logit error (held-out train)", "top-1 % (held-out train)",
                     "kept per block"],
                    [[f"{r['reduction']:g}", _name(r), cell(r, "test_accuracy", 2),
                      cell(r, "test_relative_error", 4), cell(r, "test_kl", 4), cell(r, "test_agreement", 2),
                      cell(r, "heldout_train_relative_error", 4), cell(r, "heldout_train_accuracy", 2),
                      " ".join(r["kept"]) if r["method"].startswith("auto") else ""] for r in rows])
        picks = []
        for rho in dict.fromkeys(r["reduction"] for r in rows):
            at = [r for r in rows if r["reduction"] == rho]
            best = max(at, key=lambda r: r["test_accuracy_mean"])
            closest = min(at, key=lambda r: r["test_relative_error_mean"])
            picks.append(f"- ρ = {rho:g}: the most accurate on test is {_name(best)} "
                         f"({best['test_accuracy_mean']:.2f} %); the closest to the original on the test inputs is "
                         f"{_name(closest)} (relative error {closest['test_relative_error_mean']:.4f}, "
                         f"{closest['test_accuracy_mean']:.2f} %)"
                         + (": the same model." if best is closest else ": **not the same model**."))
        plot = pathlib.Path(name).with_suffix(".png").name
        out += [f"**{title}**, no fine-tuning (original {d['accuracy_original']:.2f} % on {d['test_images']:,} test "
                f"images); mean ± std over {d['plan']['seeds']} seeds.", "", _source_line(d), "", table, "", *picks, "",
                f"![{title}: accuracy against the distance to the original](plots/{plot})", ""]
    return "\n".join(["Each model is the training-free study's unit of the same method, ρ and seed, rebuilt. "
                      "Distances are to the original model's logits; the test inputs' labels are used only for the "
                      "accuracy. Kept per block (`auto`): `b` decoupling, `p` pruned MLP, per seed, in the order of "
                      "compression.", "", *out]).rstrip()


def knobs_table() -> str:
    """Issue 24: the knob ablation of a training-free B-spline decoupling (ViT/Fashion-MNIST)."""
    d = _load("knobs_vit_fashion-mnist.json")
    if d is None:
        return "No current result committed (`python experiments/knobs.py`)."
    out = [f"ViT / Fashion-MNIST, no fine-tuning (original {d['accuracy_original']:.2f} %; mean ± std over "
           f"{d['plan']['seeds']} seeds). One knob of the old defaults changed per row. Verdicts as above: "
           "\"B-spline (old defaults) beats this variant\" and \"pruning beats it\", paired over seeds.",
           "", _source_line(d), "", _study_rows(d), ""]
    if (RESULTS / "knobs_vit_fashion-mnist.png").exists():
        out += ["![Knobs of the B-spline decoupling, ViT/Fashion-MNIST, no fine-tuning]"
                "(plots/knobs_vit_fashion-mnist.png)", ""]
    return "\n".join(out).rstrip()


def lm_compression_table() -> str:
    """Issue 23: the character LM's gated MLPs compressed (test bpc per setting × method × ρ,
    paired verdicts against B-spline), and the fit of one gated MLP against a plain one."""
    d = _load("lm_compression.json")
    if d is None:
        return "_No result committed._ (`python experiments/lm_compression.py`)"
    out = [f"Character LM on pystdlib (original {d['bpc_original']:.4f} bits per character on "
           f"{d['test_subset']['characters']:,} test characters, {d['params_original']:,} parameters); every gated "
           f"MLP compressed back to front; mean ± std over {d['plan']['seeds']} seeds (calibration windows and "
           f"solver key); fine-tuned = {d['plan']['finetune']['steps']} steps of train_lm (lr "
           f"{d['plan']['finetune']['lr']:g}) after the last replacement. Verdict = \"B-spline has lower test bpc\", "
           "paired over seeds (t-test, p < 0.05; Δ = method − B-spline, bits per character).", "", _source_line(d), ""]
    lm = LanguageModel(d)
    if any(is_refined(r["method"]) for r in d["rows"]):
        out[0] += (" Refined rows (`+ refined`: every replacement refined without labels as it is built, "
                   "before any fine-tuning) are compared with the B-spline decoupling refined the same way.")
    rows = []
    for r in d["rows"]:
        if r["status"] != "ok":
            rows.append([r["setting"], _name(r), f"{r['reduction']:g}", "infeasible", "—", "—", "—"])
            continue
        v = d["verdicts"][f"{r['setting']} {r['reduction']!r}"].get(r["method"])
        if is_refined(r["method"]):  # refined rows: against the B-spline refined the same way
            reference = "bsd" + r["method"][len(split_refine(r["method"])[0]):]
            if r["method"] == reference:
                cell = "(reference, refined)"
            else:
                p = lm.vs(r["method"], reference, r["reduction"], setting=r["setting"], digits=3)
                cell = ("no paired runs" if not p.n else
                        f"{p.verdict} (Δ {p.diff:+.3f}, p = {_pval(p.p if np.isfinite(p.p) else None)})")
        else:
            cell = ("(reference)" if v is None else "no paired runs" if not v["n"]
                    else f"{v['verdict']} (Δ {v['mean_diff']:+.3f}, p = {_pval(v['p_ttest'])})")
        err = "—" if r.get("output_error_mean") is None else f"{r['output_error_mean']:.3g}"
        rows.append([r["setting"], _name(r), f"{r['reduction']:g}", _pm(r["bpc_mean"], r["bpc_std"], 3),
                     f"{r['params_mean']:,.0f}", err, cell])
    out += [_md(["setting", "method", "ρ", "test bpc", "params", "output error", "B-spline lower bpc"], rows), ""]
    if (RESULTS / "lm_compression.png").exists():  # docs/hooks.py serves experiments/results/*.png as plots/
        out += ["![Character LM: test bits per character against parameters](plots/lm_compression.png)", ""]
    fit = d["fit"]
    out += [f"**One MLP ({fit['mlp']}) decoupled at fixed ranks, gated (SwiGLU) against a plain GELU MLP of the same "
            f"shape** (mean ± std over {fit['seeds']} seeds; test bpc of the gated LM {d['bpc_original']:.4f}, of "
            f"its plain twin {d['plain_model'].get('test_bpc', float('nan')):.4f}):", ""]
    out += [_md(["MLP", "rank", "Error(J)", "Error(F)", "output error", "params (MLP → decoupled)"],
                [[r["kind"], str(r["rank"]), _pm(r["error_J_mean"], r["error_J_std"], 4),
                  _pm(r["error_F_mean"], r["error_F_std"], 4), _pm(r["output_error_mean"], r["output_error_std"], 4),
                  f"{r['params_mlp']:,} → {r['params_decoupled']:,}"] for r in fit["rows"]]), "",
            f"Finding: {fit['finding']}."]
    return "\n".join(out).rstrip()


# --------------------------------------------------------------------------- label-free refinement
# Issue 37: every replacement refined without labels (jaxbsd.Refine). The refined units of a
# study are its methods with a suffix ``-ref<n>`` (n Adam steps, target "local") or ``-refc<n>``
# (target "consistent"), beside the unrefined units of the same study.

#: The refinement every study and table below means unless it says otherwise (``-ref300``).
REFINE_STEPS = 300


def is_refined(method: str) -> bool:
    return split_refine(method)[1] > 0


def refined(method: str, steps: int = REFINE_STEPS, target: str = "local", batch: int | None = None,
            lr: float | None = None) -> str:
    """:func:`refine_names.refined`, ``steps`` defaulting to :data:`REFINE_STEPS`."""
    return _refined_name(method, steps, target, batch, lr)


_PROSE_NAMES = {"bsd-warm": "the warm-started B-spline decoupling", "bsd": "the B-spline decoupling (old defaults)",
                "prune": "pruning", "auto": "`auto`", "svd": "SVD", "drone": "DRONE"}


def prose_name(method: str) -> str:
    """A method as prose: ``"pruning"``, ``"refined pruning"``, ``"the refined warm-started B-spline
    decoupling"``."""
    base, steps, target, batch, lr = split_refine(method)
    name = _PROSE_NAMES.get(base, f"`{base}`")
    if not steps:
        return name
    tail = (f" ({steps} steps{f' of {batch} tokens' if batch else ''}{f', learning rate {lr:g}' if lr else ''}"
            f"{', consistent target' if target == 'consistent' else ''})"
            if steps != REFINE_STEPS or target != "local" or batch or lr else "")
    return (name.replace("the ", "the refined ", 1) if name.startswith("the ") else "refined " + name) + tail


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
#: Issue 37's rule for ``auto``: at least max(B-spline, pruning) − this, or not significantly below.
AUTO_MARGIN = 0.1
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
    return "—" if not values else _pm(float(np.mean(values)), float(np.std(values)), digits)


def _refine_missing(title: str, d: dict | None, command: str, methods: Iterable[str]) -> str | None:
    """The line a refinement table shows instead of itself, or ``None`` when it has runs to show."""
    if d is None:
        return f"**{title}**: No current result committed (`{command}`)."
    if not Study(d).has(*methods):
        return f"**{title}**: the committed result has no refined runs yet (`{command}`)."
    return None


def refine_main_table() -> str:
    """Issue 37: per pair, method and ρ, top-1 without and with label-free refinement (mean ± std
    over seeds), the gain paired over seeds, and beside it the fine-tuned (labels) comparison."""
    out = []
    for title, _, name, command, methods, cmp_name, cmp_methods in REFINE_PAIRS:
        d = _load(name)
        if (missing := _refine_missing(title, d, command, [refined(m) for m in methods[:2]])) is not None:
            out += [missing, ""]
            continue
        s, c = Study(d), _load(cmp_name)
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
                    ft = _seeds_pm(ft_values) + ("" if other == m else f" ({_NAMES.get(other, other)})")
                    if ref:
                        behind = sgn(float(np.mean(ref)) - float(np.mean(ft_values)))
                rows.append([f"{rho:g}", _display(m), str(len(ref)), _seeds_pm(base), _seeds_pm(ref),
                             _paired_cell(gain), ft, behind])
        ft_head = (f"fine-tuned with labels ({c['plan']['epochs']} epoch(s) after every block)" if c is not None
                   else "fine-tuned with labels")
        out += [f"**{title}**, no labels (original {d['accuracy_original']:.2f} %; mean ± std over the seeds shown: "
                "calibration images and solver key). Refined = every replacement trained for "
                f"{REFINE_STEPS} Adam steps towards the original MLP's outputs on its calibration tokens as it is "
                "built, the best step on held-out tokens kept. Gain = refined − unrefined, paired over seeds (t-test). "
                "Beside it the committed comparison with label fine-tuning"
                + ("" if c is None else f" (`{c['provenance']['command']}`)" if c.get("provenance") else "")
                + " at the same ρ (the B-spline rows: the old-default decoupling, `bsd`, fine-tuned) and the refined "
                "mean minus the fine-tuned one (separate studies: not paired).", "", _source_line(d), "",
                _md(["ρ", "method", "seeds", "no refinement", f"refined ({REFINE_STEPS} steps)", "gain",
                     ft_head, "refined − fine-tuned"], rows), ""]
    return "\n".join(out).rstrip()


class AutoRule:
    """Issue 37's rule for ``auto`` at one ρ: ``auto`` (refined) against the better (by mean) of
    the refined B-spline decoupling and refined pruning, paired over seeds; ``holds`` when auto ≥
    that − :data:`AUTO_MARGIN` or the paired difference is not significant (p ≥ 0.05)."""

    def __init__(self, study: "Study", rho: float, steps: int = REFINE_STEPS):
        auto, candidates = refined("auto", steps), [refined(m, steps) for m in ("bsd-warm", "prune")]
        self.rho = rho
        self.against = max(candidates, key=lambda m: study.mean(m, rho))
        self.paired = study.vs(auto, self.against, rho)
        self.diff = study.mean(auto, rho) - study.mean(self.against, rho)
        # Means of accuracies with two decimals: compare at the precision they carry.
        self.holds = bool(round(self.diff, 6) >= -AUTO_MARGIN or not self.paired.p < 0.05)

    def __str__(self) -> str:
        return f"{sgn(self.diff)} against {prose_name(self.against)}, {self.paired.pv}"


def refine_verdicts_table() -> str:
    """Issue 37's acceptance with refinement, per pair and ρ: the best refined method against the
    original, ``auto`` against the better of B-spline and pruning (refined), and B-spline against
    pruning (refined), paired over seeds."""
    out = []
    for title, short, name, command, methods, _, _ in REFINE_PAIRS:
        d = _load(name)
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
                auto_cells = [f"{sgn(rule.diff)} against {_display(split_refine(rule.against)[0])} ({rule.paired.pv})",
                              "yes" if rule.holds else "**no**"]
            else:
                auto_cells = ["—", "—"]
            v = s.vs(needed[0], needed[1], rho)
            rows.append([f"{rho:g}", f"{_display(split_refine(best)[0])} ({s.mean(best, rho):.2f} %)",
                         f"{sgn(gap)}", bound_cell, *auto_cells,
                         _verdict_paired(v)])
        out += [f"**{title}** (original {d['accuracy_original']:.2f} %), every method refined ({REFINE_STEPS} steps):",
                "", _md(["ρ", "best refined method", "its gap to the original, points", "issue 37's bound (ρ = 0.5)",
                         "auto − max(B-spline, pruning)", f"auto ≥ max − {AUTO_MARGIN:g} or p ≥ 0.05",
                         "B-spline beats pruning (Δ = B-spline − pruning)"], rows), ""]
    return "\n".join(out).rstrip()


_DISPLAY = {"bsd-warm": "B-spline (warm start)", "bsd": "B-spline", "prune": "Pruning", "auto": "Auto",
            "svd": "SVD", "drone": "DRONE"}


def _display(method: str) -> str:
    """A method's short name in the refinement tables."""
    return _DISPLAY.get(method, method)


def _refine_seconds(study: "Study", method: str, rho: float) -> str:
    """The seconds of the refinement stage per MLP, mean over every block of every seed's run
    (``—`` if the runs record none)."""
    secs = [st["refine"]["seconds"] for r in study._runs(method, rho).values() for st in r.get("steps") or []
            if isinstance(st.get("refine"), dict) and st["refine"].get("seconds") is not None]
    return "—" if not secs else _bench_value(float(np.mean(secs)), "s")


def refine_steps_table() -> str:
    """Issue 37's ablation of the number of steps (0 = the unrefined method): top-1 mean ± std,
    the gain over the unrefined method paired over seeds, and the seconds of refinement per block."""
    d = _load("refine_steps_vit_fashion-mnist.json")
    command = "python experiments/refine_ablation.py --study steps"
    if d is None:
        return f"No current result committed (`{command}`)."
    s = Study(d)
    bases = [m for m in ("bsd-warm", "prune") if any(split_refine(x)[0] == m for x in d["plan"]["methods"])]
    steps = sorted({split_refine(m)[1] for m in d["plan"]["methods"] if split_refine(m)[0] in bases} | {0})
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
    header = ["steps"] + [f"{_display(b)}{h}" for b in bases for h in (": top-1 %", ": gain", ": s per block")]
    return "\n".join([f"ViT / Fashion-MNIST, ρ = {rho:g}, no labels (original {d['accuracy_original']:.2f} %; "
                      f"mean ± std over {d['plan']['seeds']} seeds). Gain = against the same method unrefined, "
                      "paired over seeds; s per block = seconds of the refinement stage per MLP, mean over blocks "
                      "and seeds.", "", _source_line(d), "", _md(header, rows)])


#: Tokens per step of :class:`jaxbsd.Refine`'s default loop, as the studies name it (``-ref<n>b512``).
REFINE_BATCH = 512


def refine_batch_table() -> str:
    """Issue 37's full-batch loop (the studies' ``-ref300``) against minibatch loops (``-ref300b512``,
    ``-ref300b256``, on the ViT also ``-ref1000b512``), per pair at ρ = 0.5: top-1, the difference
    from the full-batch loop paired over seeds, and the seconds of refinement per block."""
    out = []
    for pair, file in (("ViT / Fashion-MNIST", "refine_batch_vit_fashion-mnist.json"),
                       ("DeiT / USPS", "refine_batch_deit_usps.json")):
        d = _load(file)
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
            minibatch = sorted(((m, v) for m in d["plan"]["methods"] if (v := split_refine(m)).base == b and v.batch),
                               key=lambda mv: (-mv[1].batch, -mv[1].steps, mv[1].learning_rate or 0.0))
            variants = [(full, "300 full-batch steps")] + [
                (m, f"{v.steps} steps of {v.batch} tokens" + (f", learning rate {v.learning_rate:g}" if v.learning_rate else ""))
                for m, v in minibatch]
            for m, how in variants:
                if not s.has(m, rho=rho):
                    continue
                rows.append([_display(b), how, s.pm(b, rho) if s.has(b, rho=rho) else "—", s.pm(m, rho),
                             "(reference)" if m == full else _paired_cell(s.vs(m, full, rho)),
                             _refine_seconds(s, m, rho)])
        out += [f"**{pair}**, ρ = {rho:g}, back to front, no labels (original {d['accuracy_original']:.2f} %; mean ± "
                f"std over {d['plan']['seeds']} seeds). Δ = against the full-batch loop, paired over seeds; "
                "s per block = seconds of the refinement stage per MLP, mean over blocks and seeds (wall "
                "time of a study on a shared machine: the benchmark below times the two loops side by side).",
                "", _source_line(d), "",
                _md(["method", "refinement", "unrefined", "refined", "Δ against full batch", "s per block"], rows), ""]
    return "\n".join(out).rstrip()


def refine_targets_table() -> str:
    """Issue 37's two targets, front to back: local against consistent, paired over seeds."""
    d = _load("refine_targets_vit_fashion-mnist.json")
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
        rows.append([_display(b), f"{rho:g}", s.pm(b, rho) if s.has(b, rho=rho) else "—",
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
                      "", _source_line(d), "",
                      _md(["method", "ρ", "no refinement", "local target", "consistent target",
                           "consistent beats local", f"consistent, {REFINE_BATCH}-token batches, 300 steps",
                           "… 1000 steps"], rows)])


def refine_lm_table() -> str:
    """Issue 37 on the character LM's gated MLPs, training-free: test bpc of B-spline and pruning
    with and without refinement per ρ, and refined B-spline against refined pruning."""
    d = _load("lm_compression.json")
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
                      "", _source_line(d), "",
                      _md(["ρ", "B-spline", "B-spline refined", "gain", "pruning", "pruning refined", "gain",
                           "refined B-spline lower bpc"], rows)])


def refine_benchmark_table() -> str:
    """``benchmarks/refine.json``: the refinement stage against the decoupling, per MLP shape."""
    path = BENCHMARKS / "refine.json"
    if not path.exists():
        return "No current result committed (`python benchmarks/refine.py`)."
    d = json.loads(path.read_text())
    rows = []
    for r in d["rows"]:
        m = re.search(r"refinement(?P<how> \(full batch\))? / decoupling, (?P<what>.*?) \((?P<shape>[^)]*)\)", r["name"])
        what, shape = (m["what"] + (", full batch" if m["how"] else ", default (minibatches of 512)"),
                       m["shape"]) if m else (r["name"], "")
        ratio_ = "—" if r.get("ratio") is None else f"{r['ratio']:.3f}"
        rows.append([what, shape, _bench_value(r.get("ours"), "s"), _bench_value(r.get("reference"), "s"), ratio_,
                     str(r.get("target") or "—").replace("<=", "≤"),
                     {True: "yes", False: "**no**", None: "—"}[r.get("passed")]])
    head = (_source_line(d) + f" Device: {d.get('device', '?')}; median of the timed repeats, the two stages "
            "timed alternately, compiled.")
    return "\n".join([head, "", _md(["MLP", "shape", "refine", "decouple", "ratio", "target", "met"], rows)])


def fb_bf_table() -> str:
    """Claim (2): BF against FB under both capture protocols (final accuracy, per-step means in the JSON)."""
    d = _load("full_compression_vit_fashion-mnist.json")
    if d is None:
        return "No current result committed (`python experiments/full_compression.py`)."
    out = [f"ViT / {d['dataset']} (original {d['accuracy_original']:.2f} %; {d['plan']['runs']} seeds; "
           f"fine-tuning {d['plan']['epochs']} epoch(s) on {d['train_images']} images per step).", "",
           _source_line(d), ""]
    rows = []
    for capture, tables in d["tables"].items():
        last = list(tables["FB"])[-1]
        for basis, v in d["verdicts"][capture].items():
            fb, bf = tables["FB"][last][basis], tables["BF"][last][basis]
            rows.append([capture, basis.replace("nu=", "ν="), _pm(fb["mean"], fb["std"]), _pm(bf["mean"], bf["std"]),
                         f"{v['mean_diff']:+.2f}", _pval(v["p_ttest"]), _pval(v["p_sign"]), v["verdict"]])
    out.append(_md(["capture", "basis", "FB final %", "BF final %", "BF − FB", "t-test p", "sign p", "verdict"],
                   rows))
    return "\n".join(out)


_MODEL_TITLES = {"vit": "ViT", "swin": "Swin"}


def _main_capture(d: dict) -> str:
    """The capture protocol a full-compression result is shown under: ``current`` if it ran."""
    return "current" if "current" in d["verdicts"] else next(iter(d["verdicts"]))


def _paper_final(d: dict, capture: str, basis: str) -> tuple:
    """The paper's last-step ``(mean, std)`` cells for ``basis``, FB and BF (``None`` where the
    paper has none), and its BF − FB difference (``None`` unless it has both)."""
    paper, last = d.get("paper") or {}, list(d["tables"][capture]["FB"])[-1]
    p_fb, p_bf = (paper.get(o, {}).get(last, {}).get(basis) for o in ("FB", "BF"))
    return p_fb, p_bf, (None if p_fb is None or p_bf is None else p_bf[0] - p_fb[0])


def cifar10_table(model: str) -> str:
    """``model`` / CIFAR-10 per step, ours beside the paper's appendix table (and, where it was run,
    the same at the paper's fine-tuning budget)."""
    d = _load(f"full_compression_{model}_cifar10.json")
    if d is None:
        return (f"No current result committed (`python experiments/full_compression.py --model {model} --dataset "
                "cifar10 --capture current --basis \"R-CMTF-PD d=3\" --basis \"R-CMTF-BSD nu=4 d=1\" "
                "--basis \"R-CMTF-BSD nu=4 d=2\" --basis \"R-CMTF-BSD nu=4 d=3\"`).")
    paper = d.get("paper") or {}
    capture = _main_capture(d)
    bases = list(d["verdicts"][capture])
    out = [f"{_MODEL_TITLES.get(model, model)} / CIFAR-10, {capture} capture: ours (original "
           f"{d['accuracy_original']:.2f} %; {d['plan']['runs']} seeds; fine-tuning {d['plan']['epochs']} epoch(s) on {d['train_images']:,} images per step), and in "
           f"brackets the paper (original {paper.get('original', float('nan')):.2f} %; 5 epochs on 50,000 "
           "images), mean ± std over runs.", "", _source_line(d), ""]
    rows = []
    for order in ("FB", "BF"):
        for label, cells in d["tables"][capture][order].items():
            row = [order, label]
            for basis in bases:
                c, p = cells[basis], paper.get(order, {}).get(label, {}).get(basis)
                row.append(_pm(c["mean"], c["std"]) + ("" if p is None else f" ({p[0]:.2f})"))
            rows.append(row)
    out.append(_md(["order", "step", *(b.replace("nu=", "ν=") for b in bases)], rows))
    out += ["", "Final accuracy, BF − FB paired over seeds (ours; the paper's difference in brackets):", ""]
    rows = []
    last = list(d["tables"][capture]["FB"])[-1]
    for basis, v in d["verdicts"][capture].items():
        paper_diff = _paper_final(d, capture, basis)[2]
        rows.append([basis.replace("nu=", "ν="), f"{v['mean_diff']:+.2f}"
                     + ("" if paper_diff is None else f" ({paper_diff:+.2f})"),
                     _pval(v["p_ttest"]), _pval(v["p_sign"]), v["verdict"]])
    if (v := d.get("pooled_verdicts", {}).get(capture)) and len(bases) > 1:
        rows.append([f"all bases ({v['pairs']} pairs)", f"{v['mean_diff']:+.2f}", _pval(v["p_ttest"]),
                     _pval(v["p_sign"]), v["verdict"]])
    out.append(_md(["basis", "BF − FB", "t-test p", "sign p", "verdict"], rows))
    budget = _load(f"full_compression_paper_budget_{model}_cifar10.json")
    if budget is not None:
        cap = capture if capture in budget["tables"] else next(iter(budget["tables"]))
        rows = []
        for basis, v in budget["verdicts"][cap].items():
            fb, bf = budget["tables"][cap]["FB"][last][basis], budget["tables"][cap]["BF"][last][basis]
            ours = {o: d["tables"][capture][o][last].get(basis) for o in ("FB", "BF")}
            one = len(v["seeds"]) == 1  # no spread to show
            rows.append([basis.replace("nu=", "ν="), ", ".join(str(s) for s in v["seeds"]),
                         *(f"{c['mean']:.2f}" if one else _pm(c["mean"], c["std"]) for c in (fb, bf)),
                         f"{v['mean_diff']:+.2f}",
                         *("—" if ours[o] is None else f"{ours[o]['mean']:.2f}" for o in ("FB", "BF"))])
        out += ["", f"The paper's fine-tuning budget ({budget['plan']['epochs']} epochs on "
                f"{budget['train_images']:,} images per step), final accuracy:", "", _source_line(budget), "",
                _md(["basis", "seeds", "FB final %", "BF final %", "BF − FB", "FB, our budget", "BF, our budget"],
                    rows)]
    return "\n".join(out)


def cifar10_verdicts(model: str) -> str:
    """Final accuracy per basis, FB and BF, ours beside the paper's appendix values, and the
    paired BF − FB verdict per basis and pooled (the README's short form of :func:`cifar10_table`)."""
    d = _load(f"full_compression_{model}_cifar10.json")
    if d is None:
        return f"_No {_MODEL_TITLES.get(model, model)} / CIFAR-10 result committed._"
    paper = d.get("paper") or {}
    capture = _main_capture(d)
    last = list(d["tables"][capture]["FB"])[-1]
    bracket = lambda cell: "" if cell is None else f" ({cell[0]:.2f})"  # noqa: E731  (mean, std) or None
    rows = []
    for basis, v in d["verdicts"][capture].items():
        p_fb, p_bf, paper_diff = _paper_final(d, capture, basis)
        fb, bf = (d["tables"][capture][o][last][basis]["mean"] for o in ("FB", "BF"))
        rows.append([basis.replace("nu=", "ν="), f"{fb:.2f}" + bracket(p_fb), f"{bf:.2f}" + bracket(p_bf),
                     f"{v['mean_diff']:+.2f}" + ("" if paper_diff is None else f" ({paper_diff:+.2f})"),
                     f"{v['verdict']} (p = {_pval(v['p_ttest'])})"])
    if (v := d.get("pooled_verdicts", {}).get(capture)) and len(rows) > 1:
        rows.append([f"all bases ({v['pairs']} pairs)", "", "", f"{v['mean_diff']:+.2f}",
                     f"{v['verdict']} (p = {_pval(v['p_ttest'])})"])
    title = (f"{_MODEL_TITLES.get(model, model)} / CIFAR-10, final (original {d['accuracy_original']:.2f} %, "
             f"paper {paper.get('original', float('nan')):.2f} %)")
    return _md([title, "FB % (paper)", "BF % (paper)", "BF − FB (paper)", "verdict (3 seeds)"], rows)


def budget_study_table() -> str:
    """Our fine-tuning budget against the paper's (ViT/Fashion-MNIST, BF, cubic)."""
    d = _load("full_compression_budget_study.json")
    if d is None:
        return "No current result committed (`python experiments/full_compression.py --budget-study`)."
    rows = [[label, str(r["epochs"]), f"{r['train_images']:,}", _pm(r["mean"], r["std"]),
             ", ".join(f"{a:.2f}" for a in r["final_accuracy"])] for label, r in d["results"].items()]
    v = d["difference"]
    return "\n".join([f"ViT / Fashion-MNIST, BF, {d['study']['basis'].replace('nu=', 'ν=')} (original "
                      f"{d['accuracy_original']:.2f} %), seeds {d['seeds']}.", "", _source_line(d), "",
                      _md(["budget", "epochs per step", "images", "final %", "per seed"], rows), "",
                      f"Paper − ours: {v['mean_diff']:+.2f} points (paired t-test p = {_pval(v['p_ttest'])}, "
                      f"sign test p = {_pval(v['p_sign'])}): **{v['verdict']}**."])


def allocation_table() -> str:
    d = _load("allocation.json")
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
    head = (f"{_source_line(d)} ViT/Fashion-MNIST ({d['runs'][0]['acc_original']:.2f} % on {proto['test_images']} "
            f"test images, {d['runs'][0]['params_original']:,} parameters), reduction ρ = {proto['reduction']}, "
            f"back to front, cubic ν = 4, {proto['seeds']} seeds, {proto['finetune_epochs']} fine-tuning epoch(s) "
            f"on {proto['train_subset']:,} images per step; accuracy % after the last step, mean ± std over seeds.")
    return head + "\n\n" + _md(["allocation", "params", "ranks", "after decoupling", "after fine-tuning"], rows) \
        + "\n\n" + paired + "."


# --------------------------------------------------------------------------- README headlines
# One short table per result for the README; the full tables are on the documentation site.


def headline_synthetic() -> str:
    """Table 1 of the paper: mean eᵢ on the sampling points, best of 8 restarts, ours beside the paper's."""
    d = _load("synthetic.json")
    if d is None:
        return "_No synthetic result committed._"
    res = d["results"]["best-of-8"] if "best-of-8" in d["results"] else next(iter(d["results"].values()))
    rows = [[name.replace("nu", "ν"), f"{r['e_S_avg']:.2f}", f"{r['paper']['mean']:.2f}"] for name, r in res.items()]
    return _md(["method (synthetic example, paper Table 1)", "mean eᵢ %, ours", "paper"], rows)


def headline_comparison(reduction: float = 0.5) -> str:
    """Claim (1) at one budget: top-1 of B-spline, SVD and DRONE on both models."""
    models = [(title, _load(name)) for name, title in (("comparison.json", "DeiT / USPS"),
                                                       ("comparison_vit_fashion-mnist.json", "ViT / Fashion-MNIST"))]
    models = [(t, d) for t, d in models if d is not None]
    if not models:
        return "_No comparison result committed._"
    rows = []
    for method in ("bsd", "svd", "drone"):
        row = [_NAMES[method]]
        for _, d in models:
            r = next((r for r in d["rows"] if r["method"] == method and r["reduction"] == reduction), None)
            row.append("—" if r is None or r["status"] != "ok" else _pm(r["accuracy_mean"], r["accuracy_std"]))
        rows.append(row)
    return _md([f"method, ρ = {reduction:g} (top-1 %)", *(f"{t} ({d['accuracy_original']:.2f} % before)"
                                                         for t, d in models)], rows)


def headline_compression() -> str:
    """Claim (2): final accuracy of back-to-front minus front-to-back, cubic B-splines, ours and the paper's."""
    rows = []
    for name, title in (("full_compression_vit_fashion-mnist.json", "ViT / Fashion-MNIST"),
                        ("full_compression_vit_cifar10.json", "ViT / CIFAR-10"),
                        ("full_compression_swin_cifar10.json", "Swin / CIFAR-10")):
        d = _load(name)
        if d is None:
            continue
        capture = _main_capture(d)
        basis = next((b for b in d["verdicts"][capture] if "d=3" in b and "BSD" in b), next(iter(d["verdicts"][capture])))
        v = d["verdicts"][capture][basis]
        paper_diff = _paper_final(d, capture, basis)[2]
        rows.append([title, basis.replace("nu=", "ν="), f"{v['mean_diff']:+.2f} (p = {_pval(v['p_ttest'])})",
                     v["verdict"], "—" if paper_diff is None else f"{paper_diff:+.2f}"])
    if not rows:
        return "_No full-compression result committed._"
    return _md(["model / data", "basis", "BF − FB final, points", "verdict (3 seeds)", "paper"], rows)


def headline_benchmarks() -> str:
    """The headline benchmark rows on each machine that measured them."""
    rows = []
    for name in ("results.json", "results_gpu.json"):
        path = BENCHMARKS / name
        if not path.exists():
            continue
        d = json.loads(path.read_text())
        m = d.get("machine", {})
        machine = f"{m.get('cpu_count', '?')}-core CPU" if m.get("backend") == "cpu" else m.get("device_kind", "?")
        for r in d.get("rows", []):
            if r["name"].startswith(("(c) headline: 100 sweeps", "(d) DecoupledMLP")):
                unit = r.get("unit", "s")
                met = {True: "yes", False: "**no**", None: "—"}[r.get("passed")]
                rows.append([r["name"], machine, _bench_value(r.get("ours"), unit),
                             _bench_value(r.get("reference"), unit), str(r.get("target") or "—"), met])
    if not rows:
        return "_No benchmark result committed._"
    return _md(["benchmark", "machine", "ours", "reference", "target", "met"], rows)


TABLES: dict[str, Callable[[], str]] = {
    "allocation": allocation_table,
    "synthetic": synthetic_tables,
    "ablation": ablation_tables,
    "training": training_table,
    "benchmarks": benchmark_table,
    "benchmarks-gpu": lambda: benchmark_table("results_gpu.json"),
    "comparison": comparison_table,
    "training-free": training_free_table,
    "knobs": knobs_table,
    "fidelity": fidelity_table,
    "lm-compression": lm_compression_table,
    "refine-main": refine_main_table,
    "refine-verdicts": refine_verdicts_table,
    "refine-steps": refine_steps_table,
    "refine-targets": refine_targets_table,
    "refine-batch": refine_batch_table,
    "refine-lm": refine_lm_table,
    "refine-benchmark": refine_benchmark_table,
    "fb-bf": fb_bf_table,
    "vit-cifar10": lambda: cifar10_table("vit"),
    "swin-cifar10": lambda: cifar10_table("swin"),
    "headline-swin-cifar10": lambda: cifar10_verdicts("swin"),
    "budget-study": budget_study_table,
    "headline-synthetic": headline_synthetic,
    "headline-comparison": headline_comparison,
    "headline-compression": headline_compression,
    "headline-benchmarks": headline_benchmarks,
}
MARKER = re.compile(r"<!-- report:([^ >]*) -->")  # every opening marker, well-formed or not
BLOCK = re.compile(r"(<!-- report:(?P<name>[a-z0-9_-]+) -->\n)(?P<body>.*?)(<!-- /report:(?P=name) -->)", re.S)


# --------------------------------------------------------------------------- figures in prose
# A figure in a sentence is a reference to a committed result, rendered in place:
#
#     B-spline leads SVD by <!-- fig cmp_vit.vs("bsd", "svd", 0.1).d -->+0.22<!-- /fig -->
#
# The expression between ``<!-- fig`` and ``-->`` is evaluated against :func:`namespace` (one
# name per result file, see :data:`SOURCES`, and the formatters below); the text up to
# ``<!-- /fig -->`` is its rendering, rewritten by ``report.py`` and compared by ``--check``.
# A figure quoted from elsewhere (the paper, a run that is not committed) is wrapped in
# ``<!-- from SOURCE -->...<!-- /from -->``, SOURCE naming where it comes from. Any other
# result-like number (:data:`RESULT_LIKE`) on a page fails ``--check``.

FIG = re.compile(r"(?<!`)<!-- fig (?P<expr>[^\n]+?) -->(?P<text>(?:(?!<!--).)*?)<!-- /fig -->", re.S)
FIG_OPEN = re.compile(r"(?<!`)<!-- fig\b")  # a marker quoted in code (`<!-- fig ...`) is text
FROM = re.compile(r"(?<!`)<!-- from (?P<source>[^>\n]*?\S[^>\n]*?) -->(?P<text>(?:(?!<!--).)*?)<!-- /from -->", re.S)
FROM_OPEN = re.compile(r"(?<!`)<!-- from\b")

#: What counts as a result-like number in prose: a percentage, a p-value, a ratio ("5.8×",
#: not a shape like 8×8), a signed difference (+0.99, −0.20), a difference or time in points,
#: bits per character or seconds with decimals.
RESULT_LIKE = re.compile(
    r"(?<![\w.])\d+(?:[.,]\d+)?(?:[–-]\d+(?:[.,]\d+)?)?\s?%"          # 88.55 %, 87–89 %
    r"|\bp\s?(?:[=>≤≥]|<(?!\s?0\.05\b))\s?\d*\.\d+"                  # p = 0.022 (p < 0.05 is the test's level)
    r"|(?<![\w.×])\d+(?:\.\d+)?(?:[–-]\d+(?:\.\d+)?)?\s?×(?!\s?\d)"    # 5.8×, 5.8–6.5×, not 8×8
    r"|(?<![\w.)\]])[+−±]\s?\d+\.\d+"                                  # +0.99, −0.20
    r"|(?<![\w.])\d+\.\d+(?:[–-]\d+\.\d+)?\s(?:points?|bpc|bits|s|ms|µs|min|h)\b")  # 0.45 s, 0.7 points

#: Result files by the short name a figure uses: ``experiments/results/<file>`` (``bench*``:
#: ``benchmarks/<file>``).
SOURCES = {
    "synthetic": "synthetic.json",
    "abl_mnist": "ablation_mnist.json", "abl_fmnist": "ablation_fashion-mnist.json",
    "training": "training.json", "training_lm": "training_lm_pystdlib.json",
    "training_vit_c10": "training_vit_cifar10.json",
    "fc_vit_fmnist": "full_compression_vit_fashion-mnist.json",
    "fc_vit_c10": "full_compression_vit_cifar10.json", "fc_swin_c10": "full_compression_swin_cifar10.json",
    "fc_vit_c10_paper_budget": "full_compression_paper_budget_vit_cifar10.json",
    "budget_study": "full_compression_budget_study.json",
    "cmp_deit": "comparison.json", "cmp_vit": "comparison_vit_fashion-mnist.json",
    "tf_deit": "training_free_deit_usps.json", "tf_vit": "training_free_vit_fashion-mnist.json",
    "fid_deit": "fidelity_deit_usps.json", "fid_vit": "fidelity_vit_fashion-mnist.json",
    "knobs": "knobs_vit_fashion-mnist.json", "lm": "lm_compression.json", "alloc": "allocation.json",
    "rf_deit": "refine_main_deit_usps.json", "rf_steps": "refine_steps_vit_fashion-mnist.json",
    "rf_batch_vit": "refine_batch_vit_fashion-mnist.json", "rf_batch_deit": "refine_batch_deit_usps.json",
    "rf_targets": "refine_targets_vit_fashion-mnist.json",
    "bench": "results.json", "bench_gpu": "results_gpu.json", "bench_refine": "refine.json",
}


def _minus(s: str) -> str:
    return s.replace("-", "−")


def num(x: float, digits: int = 2) -> str:
    """``x`` with ``digits`` decimals (a minus sign, not a hyphen)."""
    return _minus(f"{x:.{digits}f}")


def pct(x: float, digits: int = 2) -> str:
    """An accuracy or share in percent: ``88.55 %``."""
    return num(x, digits) + " %"


def sgn(x: float, digits: int = 2) -> str:
    """A signed difference: ``+0.22``, ``−0.20``."""
    return _minus(f"{x:+.{digits}f}")


def pv(p: float) -> str:
    """A p-value as prose: ``p = 0.022`` (two significant digits), ``p < 0.001``."""
    if p is None or not np.isfinite(p):
        return "p n/a"
    return "p < 0.001" if p < 0.001 else f"p = {float(f'{p:.2g}'):g}"


def rng(values: Iterable[float], digits: int = 2, unit: str = "") -> str:
    """The range of ``values``: ``0.7–3.5`` (one value if they round alike), ``unit`` appended."""
    vals = sorted(float(v) for v in values)
    lo, hi = num(vals[0], digits), num(vals[-1], digits)
    return (lo if lo == hi else f"{lo}–{hi}") + unit


def ratio(x: float, digits: int = 1) -> str:
    """A speed-up or size ratio: ``5.8×``."""
    return num(x, digits) + "×"


def slash(values: Iterable[float], digits: int = 2, unit: str = " %") -> str:
    """Values side by side, one per seed or setting: ``95.12 / 95.37 / 95.32 %``."""
    return " / ".join(num(v, digits) for v in values) + unit


def count(k: int, n: int) -> str:
    """``k of n``."""
    return f"{k} of {n}"


def secs(x: float, digits: int = 1) -> str:
    """A duration in seconds: ``19.7 s``."""
    return num(x, digits) + " s"


class Paired:
    """Method ``a`` against ``b`` paired over seeds: ``diff`` (mean of a − b), ``p`` (paired
    t-test, scipy), ``verdict`` ("holds" if a is higher with p < 0.05, "does not hold" if lower
    with p < 0.05, else "within noise"), ``wins``/``losses``/``n``. ``d``, ``pv`` and ``dp``
    render the difference, the p-value and both."""

    def __init__(self, a: list[float], b: list[float], alpha: float = 0.05, digits: int = 2):
        from scipy import stats

        diffs = np.asarray(a, float) - np.asarray(b, float)
        self.n, self.diffs, self.digits = len(diffs), diffs, digits
        self.diff = float(diffs.mean()) if self.n else float("nan")
        self.wins, self.losses = int((diffs > 0).sum()), int((diffs < 0).sum())
        if self.n > 1 and np.ptp(diffs) > 0:
            self.p = float(stats.ttest_rel(a, b).pvalue)
        else:
            self.p = float("nan") if self.n < 2 or self.diff == 0 else 0.0
        self.verdict = ("holds" if self.diff > 0 and self.p < alpha else
                        "does not hold" if self.diff < 0 and self.p < alpha else "within noise")

    @property
    def d(self) -> str:
        return sgn(self.diff, self.digits)

    @property
    def pv(self) -> str:
        return "identical on every seed" if self.n and not self.diffs.any() else pv(self.p)

    @property
    def dp(self) -> str:
        return f"{self.d}, {self.pv}"

    def __str__(self) -> str:
        return f"{self.d} ({self.pv})"

    def says(self, a: str, b: str) -> str:
        """The verdict as prose naming the two sides: "**a is better** (+0.30, p = 0.01)", "**b is
        better** (...)" or "**within noise** (...)"."""
        word = {"holds": f"{a} is better", "does not hold": f"{b} is better"}.get(self.verdict, self.verdict)
        return f"**{word}** ({self.dp})"


class Result:
    """One committed result: ``r["key"]`` reads its JSON; studies add helpers."""

    def __init__(self, payload: dict):
        self.json = payload

    def __getitem__(self, key):
        """``r["key"]``, or a path: ``r["results", "paper", "mean"]`` (no ``][`` in a page's
        source, which Markdown would read as a reference link)."""
        value = self.json
        for k in key if isinstance(key, tuple) else (key,):
            value = value[k]
        return value


class Study(Result):
    """A study with ``runs`` per (method, ρ, seed) and an ``accuracy`` each (comparison,
    training-free, knobs): means and paired tests recomputed from the per-seed runs."""

    key = "accuracy"

    def _runs(self, method, rho, setting=None) -> dict:
        return {r["seed"]: r for r in self.json["runs"] if r["method"] == method and r["reduction"] == rho
                and r.get("status", "ok") == "ok" and (setting is None or r.get("setting") == setting)}

    def seeds(self, method: str, rho: float, key: str | None = None, setting=None) -> list[float]:
        """Per-seed values (``key``, default accuracy), in seed order."""
        runs = self._runs(method, rho, setting)
        return [runs[s][key or self.key] for s in sorted(runs)]

    def mean(self, method: str, rho: float, key: str | None = None, setting=None) -> float:
        return float(np.mean(self.seeds(method, rho, key, setting)))

    acc = mean

    def vs(self, a: str, b: str, rho: float, key: str | None = None, setting=None, digits: int = 2) -> Paired:
        """``a`` against ``b`` at ρ, paired over their common seeds."""
        ra, rb = self._runs(a, rho, setting), self._runs(b, rho, setting)
        common = sorted(set(ra) & set(rb))
        k = key or self.key
        return Paired([ra[s][k] for s in common], [rb[s][k] for s in common], digits=digits)

    def verdicts(self, a: str, b: str, rhos: Iterable[float] | None = None, key: str | None = None,
                 setting=None, digits: int = 2) -> str:
        """``a`` against ``b`` over ρ as prose, grouped by verdict: "**holds** at ρ = 0.1 (+0.22,
        p = 0.022) and 0.5 (...); **within noise** at ρ = 0.2 (...)". A flipped verdict moves its ρ."""
        rhos = [r for r in (rhos or self.json["plan"]["budgets"]) if self._runs(a, r, setting) and self._runs(b, r, setting)]
        groups: dict[str, list[str]] = {}
        for r in rhos:
            v = self.vs(a, b, r, key, setting, digits)
            groups.setdefault(v.verdict, []).append(f"{r:g} ({v.d}, {v.pv})")
        parts = []
        for verdict, items in groups.items():
            items = items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
            parts.append(f"**{verdict}** at ρ = {items}")
        return "; ".join(parts)

    def pm(self, method: str, rho: float, key: str | None = None, digits: int = 2) -> str:
        """Mean ± std over seeds (population std, as in the tables)."""
        v = self.seeds(method, rho, key)
        return f"{num(np.mean(v), digits)} ± {num(np.std(v), digits)}"

    def param_gap(self, a: str, b: str, rho: float) -> float:
        """How many percent fewer parameters ``a`` keeps than ``b`` at ρ (means)."""
        return 100 * (1 - self.mean(a, rho, "params") / self.mean(b, rho, "params"))

    def reduction_gap(self, a: str, b: str, rho: float) -> float:
        """How many more percent of the model's parameters ``a`` removes than ``b`` at ρ (means)."""
        return 100 * (self.mean(a, rho, "reduction_achieved") - self.mean(b, rho, "reduction_achieved"))

    def kept(self, method: str, rho: float, candidate: str = "bsd") -> str:
        """How many blocks ``auto``'s judge gave to ``candidate`` over all seeds: ``9 of 18``."""
        steps = [s for r in self._runs(method, rho).values() for s in r["steps"]]
        return count(sum(s["method"] == candidate for s in steps), len(steps))

    def lower_block_error(self, method: str, rho: float, candidate: str = "prune") -> str:
        """In how many of ``auto``'s choices ``candidate`` had the lower output error of the block."""
        autos = [s["auto"] for r in self._runs(method, rho).values() for s in r["steps"] if s.get("auto")]
        other = {"prune": "bsd", "bsd": "prune"}[candidate]
        return count(sum(a[candidate]["output_error"] < a[other]["output_error"] for a in autos), len(autos))

    def row(self, method: str, rho: float, setting=None) -> dict:
        """The study's summary row of ``method`` at ρ (and ``setting``)."""
        return next(r for r in self.json["rows"] if r["method"] == method and r["reduction"] == rho
                    and (setting is None or r.get("setting") == setting))

    def best(self, rho: float, methods: Iterable[str], key: str | None = None) -> str:
        """The method with the highest mean at ρ among ``methods``."""
        return max(methods, key=lambda m: self.mean(m, rho, key))

    # Label-free refinement (issue 37): a refined unit is its method with ``-ref<n>`` / ``-refc<n>``.

    def has(self, *methods: str, rho: float | None = None) -> bool:
        """Whether each of ``methods`` has a finished run (at ρ, or at any ρ)."""
        return all(any(r["method"] == m and r.get("status", "ok") == "ok" and (rho is None or r["reduction"] == rho)
                       for r in self.json["runs"]) for m in methods)

    def budgets(self, *methods: str) -> list[float]:
        """The study's ρ at which each of ``methods`` has runs."""
        return [r for r in self.json["plan"]["budgets"] if self.has(*methods, rho=r)]

    def gain(self, method: str, rho: float, steps: int = REFINE_STEPS, target: str = "local", key: str | None = None,
             setting=None, digits: int = 2) -> Paired:
        """What refinement changes: ``method`` refined (``steps`` towards ``target``) − ``method``,
        paired over seeds."""
        return self.vs(refined(method, steps, target), method, rho, key, setting, digits)

    def best_refined(self, rho: float, methods: Iterable[str] | None = None, steps: int = REFINE_STEPS) -> str:
        """The refined method (``-ref<steps>``) with the highest mean at ρ, among ``methods``'
        refined units (default: every refined unit at ρ)."""
        names = ([refined(m, steps) for m in methods] if methods is not None else
                 sorted({r["method"] for r in self.json["runs"] if split_refine(r["method"])[1:] == (steps, "local", None, None)}))
        return self.best(rho, [m for m in names if self.has(m, rho=rho)])

    def changes(self, a: str, b: str, a0: str, b0: str, setting=None) -> str:
        """Whether the verdict of ``a`` against ``b`` differs from that of ``a0`` against ``b0``
        (say, both refined against both unrefined) at any ρ where all four ran: "at no ρ" or
        "at ρ = 0.2 and 0.35"."""
        rhos = [r for r in self.budgets(a, b, a0, b0)
                if self.vs(a, b, r, setting=setting).verdict != self.vs(a0, b0, r, setting=setting).verdict]
        return "at no ρ" if not rhos else "at ρ = " + _join([f"{r:g}" for r in rhos])

    def auto_rule(self, rho: float, steps: int = REFINE_STEPS) -> "AutoRule":
        """Issue 37's rule for ``auto`` at ρ (:class:`AutoRule`)."""
        return AutoRule(self, rho, steps)

    def moves(self, method: str, rho: float, steps: int = REFINE_STEPS, target: str = "local") -> str:
        """``from 85.32 % to 86.90 % (+1.58, p = 0.0031)``: ``method`` before and after refinement."""
        after = refined(method, steps, target)
        return f"from {pct(self.mean(method, rho))} to {pct(self.mean(after, rho))} ({self.gain(method, rho, steps, target).dp})"

    def gap(self, method: str, rho: float) -> str:
        """``1.52 points below the original (88.42 %)``: ``method``'s mean against the original model."""
        x = self.mean(method, rho) - self["accuracy_original"]
        return f"{num(abs(x))} points {'below' if x < 0 else 'above'} the original ({pct(self['accuracy_original'])})"

    def curve(self, method: str, rho: float, steps: Iterable[int]) -> str:
        """Mean top-1 after each number of refinement steps: ``85.32 / 86.10 / 86.90 %``."""
        return slash(self.mean(refined(method, n), rho) for n in steps)


class LanguageModel(Study):
    """The character LM study: test bits per character per setting ("training-free",
    "fine-tuned"), method, ρ and seed; and the fit of one gated MLP against a plain one."""

    key = "test_bpc"

    def fit_ratio(self, rank: int) -> float:
        """Output error of the gated MLP over that of the plain GELU MLP at ``rank``."""
        rows = {r["kind"]: r for r in self.json["fit"]["rows"] if r["rank"] == rank}
        return rows["gated"]["output_error_mean"] / rows["plain"]["output_error_mean"]

    def fit_ratios(self) -> list[float]:
        return [self.fit_ratio(r) for r in self.json["fit"]["ranks"]]

    def gaps(self, a: str, b: str, setting: str, rhos: Iterable[float] | None = None) -> list[Paired]:
        """``a`` − ``b`` in bits per character at each ρ, paired over seeds."""
        return [self.vs(a, b, r, setting=setting, digits=3) for r in (rhos or self.json["plan"]["budgets"])]


def pmax(paired: Iterable[Paired]) -> str:
    """The largest p-value of several paired tests, as prose: ``p < 0.001``, ``p ≤ 0.0069``."""
    worst = max(v.p for v in paired)
    return "p < 0.001" if worst < 0.001 else f"p ≤ {float(f'{worst:.2g}'):g}"


def _title(study: "Study") -> str:
    return REFINE_TITLES.get(getattr(study, "source", ""), getattr(study, "source", "?"))


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


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
                groups[outcome].append(f"on {_title(s)} at ρ = " + _join([f"{r.rho:g} ({r})" for r in at]))
    parts = [f"**{'holds' if o else 'fails'}** " + _join(items) for o, items in groups.items() if items]
    return "; it ".join(parts) if parts else "is not measured yet (no refined `auto` run is committed)"


def refined_verdicts(a: str, b: str, *studies: "Study") -> str:
    """``a`` against ``b`` paired over seeds, per study, grouped by verdict (:meth:`Study.verdicts`):
    "on ViT/Fashion-MNIST, **holds** at ρ = ...; on DeiT/USPS, **within noise** at ρ = ..."."""
    parts = [f"on {_title(s)}, {s.verdicts(a, b)}" for s in studies if s.budgets(a, b)]
    return "; ".join(parts) if parts else "not measured yet (no refined runs are committed)"


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
    return _join(items) if items else "nothing (no method ran in both studies)"


class FullCompression(Result):
    """A full-compression result (FB/BF per step and basis, paired verdicts BF − FB)."""

    def capture(self, capture=None) -> str:
        return capture or _main_capture(self.json)

    def cell(self, order: str, step: str, basis: str, capture=None) -> dict:
        return self.json["tables"][self.capture(capture)][order][step][basis]

    def final(self, order: str, basis: str, capture=None) -> float:
        steps = list(self.json["tables"][self.capture(capture)][order])
        return self.cell(order, steps[-1], basis, capture)["mean"]

    def bases(self, capture=None) -> list[str]:
        return list(self.json["verdicts"][self.capture(capture)])

    def steps(self, capture=None) -> list[str]:
        return list(self.json["tables"][self.capture(capture)]["FB"])

    def values(self, order: str, step: str, capture=None) -> list[float]:
        """Every seed's accuracy at ``step`` over all bases."""
        t = self.json["tables"][self.capture(capture)][order][step]
        return [v for basis in t for v in t[basis]["values"]]

    def means(self, order: str, step: str, capture=None) -> list[float]:
        """The mean over seeds at ``step``, one per basis."""
        t = self.json["tables"][self.capture(capture)][order][step]
        return [t[basis]["mean"] for basis in t]

    def vs(self, basis: str, capture=None) -> Paired:
        """BF − FB on the final accuracy, paired over seeds (from the per-seed values)."""
        last = self.steps(capture)[-1]
        return Paired(self.cell("BF", last, basis, capture)["values"], self.cell("FB", last, basis, capture)["values"])

    def pooled(self, capture=None) -> Paired:
        """BF − FB over every basis and seed."""
        last = self.steps(capture)[-1]
        return Paired(self.values("BF", last, capture), self.values("FB", last, capture))

    def run_minutes(self) -> float:
        """Minutes its runs took, each as recorded where it ran."""
        return _run_seconds(self.json) / 60

    def at(self, order: str, step: str, capture=None) -> list[float]:
        """The mean at ``step`` per basis (our runs)."""
        return self.means(order, step, capture)

    def paper_at(self, order: str, step: str) -> list[float]:
        """The paper's mean at ``step`` per basis."""
        return [self.paper(order, step, b) for b in self.bases()]

    def paper_diffs(self) -> list[float]:
        """The paper's final BF − FB per basis."""
        last = self.steps()[-1]
        return [b - f for b, f in zip(self.paper_at("BF", last), self.paper_at("FB", last))]

    def paper(self, order: str, step: str, basis: str):
        return (self.json.get("paper") or {}).get(order, {}).get(step, {}).get(basis, [None])[0]


class Synthetic(Result):
    """The synthetic example: ``r(basis, strategy)`` is one method's record; bases by short name."""

    BASES = {"poly10": "R-CMTF-PD d=10", "spline10": "R-CMTF-BSD nu=11 d=10", "linear": "R-CMTF-BSD nu=11 d=1",
             "cubic": "R-CMTF-BSD nu=11 d=3"}

    def r(self, basis: str, strategy: str = "best-of-8") -> dict:
        return self.json["results"][strategy][self.BASES.get(basis, basis)]

    def e(self, basis: str, metric: str = "e_S", strategy: str = "best-of-8") -> float:
        """Mean error in percent over draws and both outputs (``e_S``, ``e_heldout``, ``e_outside``)."""
        return self.r(basis, strategy)[f"{metric}_avg"]

    def paper(self, basis: str) -> float:
        return self.r(basis)["paper"]["mean"]

    def per_draw(self, basis: str, metric: str = "e_S", strategy: str = "best-of-8") -> list[float]:
        return [float(np.mean(x)) for x in self.r(basis, strategy)[metric]]


class Ablation(Result):
    """An ablation grid: cells are means over ranks, degrees (or ν) and runs, as in its table."""

    def cell(self, variant: str, lam: float, column: str, metric: str = "accuracy") -> float:
        return float(np.nanmean(np.asarray(self.json["grids"][metric][variant][repr(lam)][column], dtype=float)))

    def cells(self, variant: str, lam: float, prefix: str = "", metric: str = "accuracy") -> list[float]:
        """The cells of the columns starting with ``prefix`` (``"BSD"``: every B-spline degree)."""
        return [self.cell(variant, lam, c, metric) for c in self.columns(prefix)]

    def spread(self, variant: str, lam: float) -> float:
        """Largest minus smallest cell over every basis at λ."""
        return float(np.ptp(self.cells(variant, lam)))

    def robust_gap(self, lams: Iterable[float]) -> float:
        """Largest |robust − plain| over the bases at these λ."""
        return max(abs(a - b) for lam in lams
                   for a, b in zip(self.cells("R-CMTF", lam), self.cells("CMTF", lam)))

    def savings(self) -> np.ndarray:
        """Savings in percent, every variant, λ, basis and degree by rank (last axis)."""
        g = self.json["grids"]
        arr = np.asarray([g["savings"][v][repr(lam)][c] for v in g["variants"] for lam in g["lams"]
                          for c in g["columns"]], dtype=float)
        return arr.reshape(-1, arr.shape[-1])

    def columns(self, prefix: str = "") -> list[str]:
        return [c for c in self.json["grids"]["columns"] if c.startswith(prefix)]

    def by_rank(self, variant: str, lam: float, columns: Iterable[str], metric: str = "accuracy") -> list[float]:
        """Mean per rank over ``columns`` (and degrees, runs)."""
        g = self.json["grids"][metric][variant][repr(lam)]
        arr = np.asarray([g[c] for c in columns], dtype=float)  # columns × y × ranks
        return list(np.nanmean(arr.reshape(-1, arr.shape[-1]), axis=0))


class Training(Result):
    def run(self, model: str, dataset: str) -> dict:
        """The recorded training run of ``model`` on ``dataset``."""
        return next(r for r in self.json["runs"] if r["model"] == model and r["dataset"] == dataset)


class Benchmark(Result):
    def row(self, prefix: str) -> dict:
        """The benchmark row whose name starts with ``prefix``."""
        rows = [r for r in self.json["rows"] if r["name"].startswith(prefix)]
        if len(rows) != 1:
            raise KeyError(f"{len(rows)} benchmark rows start with {prefix!r}")
        return rows[0]

    def note(self, prefix: str, pattern: str) -> float:
        """A number the row's note records: the first group of ``pattern`` (a regex) in it."""
        note = self.row(prefix).get("note") or ""
        m = re.search(pattern, note)
        if m is None:
            raise KeyError(f"{pattern!r} not in the note of {prefix!r}: {note!r}")
        return float(m.group(1))

    def rows(self, prefix: str) -> list[dict]:
        return [r for r in self.json["rows"] if r["name"].startswith(prefix)]


_KINDS = {"synthetic": Synthetic, "training": Training, "cmp_": Study, "tf_": Study, "fid_": Study, "knobs": Study,
          "rf_": Study, "lm": LanguageModel, "fc_": FullCompression,
          "abl_": Ablation, "bench": Benchmark}


_JSON_CACHE: dict = {}


def _read_json(path: pathlib.Path) -> dict:
    """The JSON at ``path``, parsed once per version of the file (shared: figures only read it)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    if key not in _JSON_CACHE:
        _JSON_CACHE[key] = json.loads(path.read_bytes())
    return _JSON_CACHE[key]


def namespace(results: pathlib.Path | None = None, benchmarks: pathlib.Path | None = None) -> dict:
    """What a figure's expression sees: each of :data:`SOURCES` (loaded on first use) and the
    formatters."""
    results = results or RESULTS
    benchmarks = benchmarks or BENCHMARKS

    def path_of(name: str) -> pathlib.Path:
        return (benchmarks if name.startswith("bench") else results) / SOURCES[name]

    class Lazy(dict):
        def __missing__(self, name):
            if name not in SOURCES:
                raise KeyError(name)
            kind = next((k for p, k in _KINDS.items() if name.startswith(p)), Result)
            self[name] = value = kind(_read_json(path_of(name)))
            value.source = name
            return value

    def has(name: str, *methods: str, rho: float | None = None) -> bool:
        """Whether the result ``name`` is committed and, for a study, has runs of each of ``methods``
        (at ρ, or at any ρ): the guard of a sentence that only a result yet to land can write,
        ``<!-- fig (...) if has("rf_deit", "prune-ref300") else "..." -->``."""
        if not path_of(name).exists():
            return False
        return not methods or ns[name].has(*methods, rho=rho)

    def present(*names: str, methods: Iterable[str] = ()) -> list:
        """The studies among ``names`` that are committed and have runs of each of ``methods``."""
        return [ns[n] for n in names if has(n, *methods)]

    ns = Lazy(num=num, pct=pct, slash=slash, pmax=pmax, sgn=sgn, pv=pv, rng=rng, ratio=ratio, count=count, secs=secs, Paired=Paired,
              np=np, min=min, max=max, abs=abs, len=len, sum=sum, round=round, sorted=sorted, zip=zip,
              str=str, int=int, float=float, next=next, list=list, all=all, any=any,
              has=has, present=present, prose_name=prose_name, refined=refined, auto_rules=auto_rules,
              refined_verdicts=refined_verdicts, recovery=recovery)
    return ns


def figure(expr: str, ns: dict | None = None) -> str:
    """The rendering of one figure's expression."""
    ns = namespace() if ns is None else ns
    if "][" in expr or "](" in expr:
        raise ValueError(f"figure `{expr}`: write r[\"a\", \"b\"], not r[\"a\"][\"b\"] (Markdown reads ][ and ]( as links)")
    try:
        for name in set(re.findall(r"[A-Za-z_]\w*", expr)) & set(SOURCES):
            try:
                ns[name]  # load the results it names (comprehensions see globals only)
            except FileNotFoundError:
                pass  # absent: an expression that reads it fails naming it; one guarded by has() does not
        value = eval(expr, {**ns, "__builtins__": {}})  # noqa: S307  (our own pages' expressions)
    except NameError as e:
        if e.name in SOURCES:
            raise ValueError(f"figure `{expr}` reads {e.name} ({SOURCES[e.name]}), which is not committed: guard it "
                             f"with has(\"{e.name}\", ...)") from e
        raise ValueError(f"figure `{expr}` cannot be evaluated: {type(e).__name__}: {e}") from e
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"figure `{expr}` cannot be evaluated: {type(e).__name__}: {e}") from e
    return value if isinstance(value, str) else str(value)


def render(text: str, ns: dict | None = None) -> str:
    """``text`` with every generated block replaced by its current table and every figure in
    prose by its current value."""
    def fill(m: re.Match) -> str:
        name = m.group("name")
        if name not in TABLES:
            raise ValueError(f"report block report:{name} has no generator; known: {sorted(TABLES)}")
        return m.group(1) + TABLES[name]().rstrip("\n") + "\n" + m.group(4)

    opened = MARKER.findall(text)
    matched = [m.group("name") for m in BLOCK.finditer(text)]
    if opened != matched:
        # A block the pattern does not see would be left as it is, silently: refuse instead.
        raise ValueError(f"report blocks {sorted(set(opened) - set(matched))} are malformed (a name "
                         "of a-z, 0-9, _ and -, a newline after the opening marker, a matching closing marker)")
    for pattern, opening, what in ((FIG, FIG_OPEN, "fig EXPR"), (FROM, FROM_OPEN, "from SOURCE")):
        starts = {m.start() for m in pattern.finditer(text)}
        bad = [text.count("\n", 0, m.start()) + 1 for m in opening.finditer(text) if m.start() not in starts]
        if bad:
            raise ValueError(f"malformed <!-- {what} -->...<!-- /{what.split()[0]} --> on line(s) {bad} "
                             "(an expression or source on the opening marker's line, then a closing marker)")
    text = BLOCK.sub(fill, text)
    if FIG.search(text):
        ns = namespace() if ns is None else ns
        text = FIG.sub(lambda m: m.group(0)[:m.start("text") - m.start()] + figure(m.group("expr"), ns)
                       + "<!-- /fig -->", text)
    return text


def figures(text: str) -> list[str]:
    """The expressions of the figures in ``text``."""
    return [m.group("expr") for m in FIG.finditer(text)]


def unmarked_figures(text: str) -> list[tuple[int, str]]:
    """``(line, number)`` for each result-like number of ``text`` that is neither generated (a
    report block, a figure) nor marked as quoted from elsewhere. Code (fenced or inline), link
    targets and HTML comments are not prose and are skipped."""
    keep_lines = lambda m: "\n" * m.group(0).count("\n")  # noqa: E731
    text = BLOCK.sub(keep_lines, text)
    text = FIG.sub("⟨fig⟩", text)
    text = FROM.sub("⟨quoted⟩", text)
    text = re.sub(r"^(```|~~~).*?^\1", keep_lines, text, flags=re.S | re.M)
    text = re.sub(r"<!--.*?-->", keep_lines, text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "⟨code⟩", text)
    text = re.sub(r"\]\([^)\s]*\)", "]", text)
    return [(i, m.group(0)) for i, line in enumerate(text.splitlines(), 1) for m in RESULT_LIKE.finditer(line)]


def misplaced_markers(text: str) -> list[int]:
    """Lines that begin with a figure or quote marker: Markdown reads a line that starts with
    ``<!--`` as an HTML block, which ends the paragraph or list item around it on the site."""
    return [i for i, line in enumerate(text.splitlines(), 1) if re.match(r"\s*<!-- /?(fig|from)\b", line)]


def target_files(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    """The pages this script renders and checks: ``README.md`` and every page of the
    documentation site (``docs/**/*.md``)."""
    return [p for p in [root / "README.md", *sorted((root / "docs").rglob("*.md"))] if p.exists()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="fail on stale results, a generated block or figure that is out of date, or a "
                             "result-like number typed by hand")
    parser.add_argument("--results", type=pathlib.Path, default=None,
                        help="read the results from this directory instead of experiments/results")
    args = parser.parse_args(argv)
    global RESULTS
    if args.results is not None:
        RESULTS = args.results
    targets = target_files()
    ns = namespace()
    rendered = {path: (path.read_text(), render(path.read_text(), ns)) for path in targets}
    if args.check:
        problems = stale_results(result_files())
        count_figs = 0
        for path, (text, new) in rendered.items():
            rel = path.relative_to(ROOT)
            count_figs += len(figures(text))
            if new != text:
                old_lines, new_lines = text.splitlines(), new.splitlines()
                where = next((i for i, (a, b) in enumerate(zip(old_lines, new_lines), 1) if a != b),
                             min(len(old_lines), len(new_lines)) + 1)
                problems.append(f"{rel}:{where}: generated tables or figures are out of date; "
                                "run python experiments/report.py")
            problems += [f"{rel}:{line}: a line starts with a figure marker, which ends the paragraph on the site: "
                         "join it to the line before" for line in misplaced_markers(text)]
            for line, found in unmarked_figures(text):
                problems.append(f"{rel}:{line}: result-like number {found!r} typed by hand: make it a "
                                "<!-- fig EXPR --> of a committed result, or mark where it is quoted from "
                                "with <!-- from SOURCE -->")
        for p in problems:
            print(p, file=sys.stderr)
        print(f"report check: {len(problems)} problem(s) in {len(result_files())} results and {len(targets)} pages "
              f"({count_figs} generated figures in prose): {', '.join(str(p.relative_to(ROOT)) for p in targets)}")
        return 1 if problems else 0
    for path, (text, new) in rendered.items():
        if new != text:
            path.write_text(new)
        print(f"{path.relative_to(ROOT)}: {len(BLOCK.findall(text))} generated blocks, {len(figures(text))} figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
