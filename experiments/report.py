"""The README's result tables, generated from the committed result JSON, and the staleness guard.

Usage::

    python experiments/report.py            # rewrite the generated blocks of README.md
    python experiments/report.py --check    # exit 1 if a result is stale or README.md is out of date

Every generated block of ``README.md`` sits between ``<!-- report:NAME -->`` and
``<!-- /report:NAME -->``; nothing between the markers is typed by hand.

Staleness: every JSON under ``experiments/results/`` and ``benchmarks/`` records a
``provenance`` (:func:`jaxbsd.io.provenance`: command, commit, source hashes). A result computed
with the solver records ``solver_hash``, the hash of :data:`jaxbsd.io.SOLVER_FILES`; when any of
those files changes, the result is stale until it is regenerated, and ``--check`` (run by the
test suite and by ``.ci/run``) fails naming it and the command that regenerates it.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
from typing import Callable, Iterable

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
README = ROOT / "README.md"


def result_files(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    """Every committed result: ``experiments/results/*.json`` and ``benchmarks/*.json``."""
    return sorted((root / "experiments" / "results").glob("*.json")) + sorted((root / "benchmarks").glob("*.json"))


def stale_results(paths: Iterable[pathlib.Path], solver_hash: str | None = None) -> list[str]:
    """Problems with the given result files: a missing or incomplete ``provenance``, or a
    ``solver_hash`` that is not the current solver's (``solver_hash``, default: computed from
    the package). Empty when every result is current."""
    from jaxbsd.io import SOLVER_FILES, source_hash

    current = solver_hash or source_hash(SOLVER_FILES)
    problems = []
    for path in paths:
        try:
            prov = json.loads(path.read_text()).get("provenance")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
            problems.append(f"{path}: not a JSON results object ({e})")
            continue
        if not isinstance(prov, dict) or not all(prov.get(k) for k in ("command", "commit", "source_hash")):
            problems.append(f"{path}: no provenance (command, commit, source_hash); regenerate it with its script")
            continue
        if "solver_hash" in prov and prov["solver_hash"] != current:
            problems.append(
                f"{path}: stale — computed with solver files {', '.join(SOLVER_FILES)} at commit "
                f"{str(prov['commit'])[:10]}, which have changed since; regenerate: {prov['command']}")
    return problems


# --------------------------------------------------------------------------- tables


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


def benchmark_table(name: str = "results.json") -> str:
    """The benchmark table of ``benchmarks/<name>``, headed by the machine that measured it."""
    path = ROOT / "benchmarks" / name
    if not path.exists():
        return "_No benchmark result committed._"
    d = json.loads(path.read_text())
    if not d.get("provenance"):
        return _source_line(d)
    def value(x, unit):
        if x is None:
            return "—"
        if unit != "s":
            return f"{x:.2f} {unit}"
        return f"{x:.2f} s" if x >= 1 else f"{x * 1e3:.2f} ms" if x >= 1e-3 else f"{x * 1e6:.1f} µs"

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
        rows = []
        for r in d["rows"]:
            if r["status"] != "ok":
                rows.append([_NAMES[r["method"]], f"{r['reduction']:g}", "infeasible", "—", "—", "—"])
                continue
            v = d["verdicts"][repr(r["reduction"])].get(r["method"])
            if v is None:
                verdict = "(reference)"
            elif not v["n"]:
                verdict = "no paired runs"
            else:
                verdict = f"{v['verdict']} (Δ {v['mean_diff']:+.2f}, p = {_pval(v['p_ttest'])})"
            rows.append([_NAMES[r["method"]], f"{r['reduction']:g}", _pm(r["accuracy_mean"], r["accuracy_std"]),
                         f"{r['params_mean']:,.0f}", f"{100 * r['reduction_achieved_mean']:.2f} %", verdict])
        out += [_md(["method", "ρ", "top-1 %", "params", "reduction", "claim (1) at this ρ"], rows), ""]
    return "\n".join(out).rstrip()


def training_free_table() -> str:
    """Issue 21: method × ρ without fine-tuning (mean ± std over seeds, parameters, mean
    per-block output error, verdict against B-spline), one table per model/data set."""
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
                "calibration tokens, averaged over blocks and seeds. Verdict = \"B-spline (uniform) beats this "
                "method\", paired over seeds (t-test, p < 0.05).", "", _source_line(d), ""]
        rows = []
        for r in d["rows"]:
            if r["status"] != "ok":
                rows.append([_NAMES[r["method"]], f"{r['reduction']:g}", "infeasible", "—", "—", "—", "—"])
                continue
            errs = [e for u in d["runs"] if u["method"] == r["method"] and u["reduction"] == r["reduction"]
                    and u.get("status") == "ok" for e in u.get("output_errors", {}).values() if e is not None]
            v = d["verdicts"][repr(r["reduction"])].get(r["method"])
            if v is None:
                verdict = "(reference)"
            elif not v["n"]:
                verdict = "no paired runs"
            else:
                verdict = f"{v['verdict']} (Δ {v['mean_diff']:+.2f}, p = {_pval(v['p_ttest'])})"
            rows.append([_NAMES[r["method"]], f"{r['reduction']:g}", _pm(r["accuracy_mean"], r["accuracy_std"]),
                         f"{r['params_mean']:,.0f}", f"{100 * r['reduction_achieved_mean']:.2f} %",
                         f"{np.mean(errs):.3g}" if errs else "—", verdict])
        out += [_md(["method", "ρ", "top-1 %", "params", "reduction", "output error", "B-spline beats it"], rows),
                ""]
    return "\n".join(out).rstrip()


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


def vit_cifar10_table() -> str:
    """ViT / CIFAR-10 per step, ours beside the paper's appendix table."""
    d = _load("full_compression_vit_cifar10.json")
    if d is None:
        return ("No current result committed (`python experiments/full_compression.py --model vit --dataset cifar10 "
                "--capture current --basis \"R-CMTF-PD d=3\" --basis \"R-CMTF-BSD nu=4 d=1\" "
                "--basis \"R-CMTF-BSD nu=4 d=2\" --basis \"R-CMTF-BSD nu=4 d=3\"`).")
    paper = d.get("paper") or {}
    capture = "current" if "current" in d["tables"] else next(iter(d["tables"]))
    bases = list(d["verdicts"][capture])
    out = [f"ViT / CIFAR-10, {capture} capture: ours (original {d['accuracy_original']:.2f} %; {d['plan']['runs']} "
           f"seeds; fine-tuning {d['plan']['epochs']} epoch(s) on {d['train_images']:,} images per step), and in "
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
        p_fb, p_bf = (paper.get(o, {}).get(last, {}).get(basis) for o in ("FB", "BF"))
        rows.append([basis.replace("nu=", "ν="), f"{v['mean_diff']:+.2f}"
                     + ("" if p_fb is None or p_bf is None else f" ({p_bf[0] - p_fb[0]:+.2f})"),
                     _pval(v["p_ttest"]), _pval(v["p_sign"]), v["verdict"]])
    if (v := d.get("pooled_verdicts", {}).get(capture)) and len(bases) > 1:
        rows.append([f"all bases ({v['pairs']} pairs)", f"{v['mean_diff']:+.2f}", _pval(v["p_ttest"]),
                     _pval(v["p_sign"]), v["verdict"]])
    out.append(_md(["basis", "BF − FB", "t-test p", "sign p", "verdict"], rows))
    budget = _load("full_compression_paper_budget_vit_cifar10.json")
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


TABLES: dict[str, Callable[[], str]] = {
    "allocation": allocation_table,
    "synthetic": synthetic_tables,
    "ablation": ablation_tables,
    "training": training_table,
    "benchmarks": benchmark_table,
    "benchmarks-gpu": lambda: benchmark_table("results_gpu.json"),
    "comparison": comparison_table,
    "training-free": training_free_table,
    "fb-bf": fb_bf_table,
    "vit-cifar10": vit_cifar10_table,
    "budget-study": budget_study_table,
}
MARKER = re.compile(r"<!-- report:([^ >]*) -->")  # every opening marker, well-formed or not
BLOCK = re.compile(r"(<!-- report:(?P<name>[a-z0-9_-]+) -->\n)(?P<body>.*?)(<!-- /report:(?P=name) -->)", re.S)


def render(text: str) -> str:
    """``text`` with every generated block replaced by its current table."""
    def fill(m: re.Match) -> str:
        name = m.group("name")
        if name not in TABLES:
            raise ValueError(f"README block report:{name} has no generator; known: {sorted(TABLES)}")
        return m.group(1) + TABLES[name]().rstrip("\n") + "\n" + m.group(4)

    opened = MARKER.findall(text)
    matched = [m.group("name") for m in BLOCK.finditer(text)]
    if opened != matched:
        # A block the pattern does not see would be left as it is, silently: refuse instead.
        raise ValueError(f"README report blocks {sorted(set(opened) - set(matched))} are malformed (a name "
                         "of a-z, 0-9, _ and -, a newline after the opening marker, a matching closing marker)")
    return BLOCK.sub(fill, text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="fail on stale results or an out-of-date README")
    args = parser.parse_args(argv)
    text = README.read_text()
    new = render(text)
    if args.check:
        problems = stale_results(result_files())
        if new != text:
            problems.append("README.md: generated tables are out of date; run python experiments/report.py")
        for p in problems:
            print(p, file=sys.stderr)
        print(f"report check: {len(problems)} problem(s) in {len(result_files())} results and README.md")
        return 1 if problems else 0
    README.write_text(new)
    print(f"README.md: {len(BLOCK.findall(text))} generated blocks written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
