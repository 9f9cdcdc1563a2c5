"""Issue 58's evidence: the decoupling that contains pruning (``bsd-aug``, ``compress_model``'s
``"bsd"``) against pruning and against the decoupling of before, paired over seeds, in every cell
measured: ViT/Fashion-MNIST and DeiT/USPS training-free (and refined), all-MiniLM-L6-v2 refined and not.

Read from the committed studies (``training_free_*.json``, ``minilm.json``); every verdict is a
paired t-test over the seeds both methods have (p < 0.05), never typed by hand."""

from __future__ import annotations


from ..formats import md, num, pv
from ..registry import helper, table
from . import result

#: (label, the figure source of its study, digits, the axis's name, today's decoupling, the refined suffix)
STUDIES = (("ViT/Fashion-MNIST", "tf_vit", 2, "ρ", "bsd-warm", "-ref300"),
           ("DeiT/USPS", "tf_deit", 2, "ρ", "bsd-warm", "-ref300"),
           ("all-MiniLM-L6-v2", "minilm", 4, "s", "bsd", "-ref"))
NEW, PRUNE, AUTO = "bsd-aug", "prune", "auto-aug"


def _studies():
    """``(label, study, digits, axis, old, suffix)`` of each committed study (its registered kind:
    ``Study`` by ρ, ``MiniLM`` by share; their ``key`` is the figure compared)."""
    for label, name, digits, axis, old, suffix in STUDIES:
        study = result(name)
        if study is not None:
            yield label, study, digits, axis, old, suffix


def _axes(study, method: str) -> list[float]:
    """The ρ (or shares) at which ``method`` has runs."""
    return sorted({r.get("share", r.get("reduction")) for r in study["runs"] if r["method"] == method})


def _errors(run: dict) -> dict:
    """Per MLP (block or path): the relative output error the run recorded on its check tokens."""
    if "mlps" in run:
        return {m["path"]: m["output_error"] for m in run["mlps"]}
    return {str(k): v for k, v in run.get("output_errors", {}).items()}


def _sweeps(run: dict) -> list:
    return [m.get("sweep_kept") for m in run.get("mlps", run.get("steps", []))]


def _word(p) -> str:
    return {"holds": "**above**", "does not hold": "**below**"}.get(p.verdict, "within noise")


def cells() -> list[dict]:
    """Every measured cell (study, axis value, refined): the means, the paired differences and
    verdicts (against pruning; the decoupling of before against the new one and against pruning;
    ``auto`` against the new one), the largest per-MLP output-error ratio of ``bsd-aug`` to pruning
    (same seed, same MLP) and the sweeps kept."""
    out = []
    for label, study, digits, axis, old, suffix in _studies():
        for at in _axes(study, NEW):
            for refined in (False, True):
                tail = suffix if refined else ""
                new, prune = study._runs(NEW + tail, at), study._runs(PRUNE + tail, at)
                if not new or not prune:
                    continue
                ratios = [e / _errors(prune[s])[k] for s in set(new) & set(prune)
                          for k, e in _errors(new[s]).items() if _errors(prune[s]).get(k)]
                sweeps = [x for r in new.values() for x in _sweeps(r) if x is not None]
                before = old + tail if study.seeds(old + tail, at) else None
                has_auto = bool(study.seeds(AUTO + tail, at))
                out.append(dict(
                    study=label, axis=axis, at=at, refined=refined, digits=digits, seeds=len(new),
                    new=study.mean(NEW + tail, at), prune=study.mean(PRUNE + tail, at),
                    vs_prune=study.vs(NEW + tail, PRUNE + tail, at, digits=digits),
                    old=before, old_mean=study.mean(before, at) if before else None,
                    vs_old=study.vs(NEW + tail, before, at, digits=digits) if before else None,
                    old_vs_prune=study.vs(before, PRUNE + tail, at, digits=digits) if before else None,
                    auto=study.mean(AUTO + tail, at) if has_auto else None,
                    auto_vs_new=study.vs(AUTO + tail, NEW + tail, at, digits=digits) if has_auto else None,
                    worst_ratio=max(ratios) if ratios else None,
                    sweeps=(min(sweeps), max(sweeps)) if sweeps else None))
    return out


@table("contains-pruning")
def contains_pruning_table() -> str:
    """One row per cell: pruning, the decoupling that contains it, the verdict between them, the
    decoupling of before, ``auto`` containing pruning, the worst per-MLP error ratio, the sweeps kept."""
    rows = []
    for c in cells():
        d = c["digits"]
        rows.append([
            c["study"], f"{c['axis']} = {c['at']:g}", "yes" if c["refined"] else "no", str(c["seeds"]),
            num(c["prune"], d), num(c["new"], d),
            f"{_word(c['vs_prune'])} ({c['vs_prune'].d}, {c['vs_prune'].pv})",
            "—" if c["old"] is None else f"{num(c['old_mean'], d)} ({c['vs_old'].d}, {c['vs_old'].pv})",
            "—" if c["auto"] is None else f"{num(c['auto'], d)} ({c['auto_vs_new'].d})",
            "—" if c["worst_ratio"] is None else f"{c['worst_ratio']:.4f}",
            "—" if c["sweeps"] is None else (f"{c['sweeps'][0]}" if c["sweeps"][0] == c["sweeps"][1]
                                             else f"{c['sweeps'][0]}–{c['sweeps'][1]}")])
    if not rows:
        return "No result with `bsd-aug` committed yet."
    head = ("Each cell: the mean over seeds (top-1 accuracy %, or MiniLM's mean cosine to the original's embeddings) "
            "of pruning and of the decoupling that contains it (`bsd-aug`: `compress_model`'s `\"bsd\"`), the "
            "verdict of the paired t-test between them (**above** or **below** where p < 0.05), the decoupling of "
            "before (warm-started, the paper's basis; Δ and p against it), `auto` choosing between pruning and the "
            "new decoupling (Δ against the new decoupling), the largest ratio of the new decoupling's output error "
            "to pruning's over every MLP and seed (1.0100 is the issue's bound), and the sweeps kept (0: the "
            "pruned MLP written as a decoupling).")
    return "\n".join([head, "", md(["model", "at", "refined", "seeds", "pruning", "contains pruning",
                                    "against pruning", "before", "auto", "worst error ratio", "sweeps kept"], rows)])


@helper
def contain_summary() -> str:
    """The verdicts over every cell, as prose: how many cells, which are above or below pruning,
    the worst per-MLP error ratio, and the cells where the decoupling of before was below it."""
    cs = cells()
    if not cs:
        return "no cell committed yet"
    def where(c):  # noqa: E306
        return f"{c['study']} at {c['axis']} = {c['at']:g}{' refined' if c['refined'] else ''}"
    below = [where(c) for c in cs if c["vs_prune"].verdict == "does not hold"]
    above = [where(c) for c in cs if c["vs_prune"].verdict == "holds"]
    old_below = [c for c in cs if c["old"] and c["old_vs_prune"].verdict == "does not hold"]
    ratios = [c["worst_ratio"] for c in cs if c["worst_ratio"] is not None]
    parts = [f"over {len(cs)} cells, the decoupling that contains pruning is significantly below pruning in "
             + (f"{len(below)}: {'; '.join(below)}" if below else "none"),
             "significantly above it in " + (f"{len(above)}: {'; '.join(above)}" if above else "none"),
             f"its worst per-MLP output error is {max(ratios):.4f}× pruning's" if ratios else "",
             f"the decoupling of before was significantly below pruning in {len(old_below)} of the cells where it "
             "was measured"]
    return "; ".join(p for p in parts if p)


@helper
def contain_p(study: str, at: float, refined: bool = False) -> str:
    """The paired difference and p of the new decoupling against pruning in one cell, as prose."""
    c = next(c for c in cells() if c["study"] == study and c["at"] == at and c["refined"] == refined)
    return f"{c['vs_prune'].d}, {pv(c['vs_prune'].p)}"


#: The single methods ``auto`` is held against on the vision pairs (the studies' names, unrefined).
SINGLE = ("prune", "bsd-aug", "bsd", "bsd-warm", "svd", "drone")


@helper
def contain_auto_rule() -> str:
    """Issue 58's rule for ``auto`` (containing pruning), as prose: on the vision pairs its mean
    against the best single method measured in the same cell (the largest shortfall, and where), on
    MiniLM against the decoupling that contains pruning (the lowest difference)."""
    vision, minilm = [], []
    for label, study, _, axis, _, suffix in _studies():
        for at in _axes(study, AUTO):
            for tail in ("", suffix):
                if not study.seeds(AUTO + tail, at):
                    continue
                mean = study.mean(AUTO + tail, at)
                where = f"{label} at {axis} = {at:g}{' refined' if tail else ''}"
                if study.key == "accuracy":
                    singles = {m + tail: study.mean(m + tail, at) for m in SINGLE if study.seeds(m + tail, at)}
                    best = max(singles, key=singles.get)
                    vision.append((mean - singles[best], where, best))
                elif study.seeds(NEW + tail, at):
                    minilm.append((mean - study.mean(NEW + tail, at), where))
    parts = []
    if vision:
        gap, where, best = min(vision)
        parts.append(f"on the vision pairs its largest shortfall to the best single method of a cell is "
                     f"{num(-gap, 3) if gap < 0 else num(0, 3)} points ({where}, against `{best}`) over {len(vision)} cells")
    if minilm:
        low, where = min(minilm)
        parts.append(f"on MiniLM its lowest mean cosine against the decoupling that contains pruning is "
                     f"{'+' if low >= 0 else '−'}{abs(low):.5f} ({where}) over {len(minilm)} cells")
    return "; ".join(parts) or "not measured yet"


@helper
def contain_auto_adds() -> str:
    """What ``auto`` (containing pruning) adds to the decoupling that contains pruning, its own
    candidate, as prose: in how many cells its figure equals the decoupling's on every seed, where it differs (the
    paired difference and verdict), and what it costs on MiniLM (its mean wall time over the
    decoupling's, unrefined and refined, from the study's runs)."""
    cs = [c for c in cells() if c["auto_vs_new"] is not None]
    if not cs:
        return "not measured yet"
    same = [c for c in cs if c["auto_vs_new"].pv == "identical on every seed"]
    differ = [f"{c['study']} at {c['axis']} = {c['at']:g}{' refined' if c['refined'] else ''} "
              f"({c['auto_vs_new'].d}, {_word(c['auto_vs_new'])})" for c in cs if c not in same]
    out = f"in {len(same)} of {len(cs)} cells its figure equals `bsd`'s on every seed"
    if differ:
        out += f"; it differs in {len(differ)}: {'; '.join(differ)}"
    lm = result("minilm")
    if lm is not None:
        costs = []
        for tail in ("", "-ref"):
            t = {m: [r["seconds"] for r in lm["runs"] if r["method"] == m + tail and r.get("seconds")]
                 for m in (AUTO, NEW)}
            if t[AUTO] and t[NEW]:
                ratio = (sum(t[AUTO]) / len(t[AUTO])) / (sum(t[NEW]) / len(t[NEW]))
                costs.append(f"{ratio:.2f}× {'refined' if tail else 'unrefined'}")
        if costs:
            out += f"; on all-MiniLM-L6-v2 it takes {' and '.join(costs)} the decoupling's wall time (mean over its runs)"
    return out


@helper
def contain_sweeps() -> str:
    """Where the sweeps improved on the pruned MLP (a kept sweep above 0), per study, as prose."""
    by: dict[str, list] = {}
    for c in cells():
        if c["sweeps"] is not None:
            by.setdefault(c["study"], []).append(c)
    parts = []
    for study, cs in by.items():
        moved = [c for c in cs if c["sweeps"][1] > 0]
        if not moved:
            parts.append(f"{study}: sweep 0 in every MLP of every cell")
        else:
            at = sorted({c["at"] for c in moved})
            parts.append(f"{study}: a later sweep kept at {cs[0]['axis']} = {', '.join(f'{a:g}' for a in at)} "
                         f"(up to sweep {max(c['sweeps'][1] for c in moved)}), sweep 0 elsewhere")
    return "; ".join(parts) or "no cell committed yet"


@helper
def contain_plain_twin() -> str:
    """Where containment applies in the language model: its plain-GELU twin's MLP, the contained
    decoupling's output error against pruning's and the paper decoupling's at each rank, as prose."""
    lm = result("lm")
    rows = (lm.json.get("fit", {}).get("contain") or {}).get("rows") if lm is not None else None
    if not rows:
        return "not measured yet"
    parts = [f"rank {r['rank']} ({r['contain']['params']:,} parameters, pruning's): {r['contain']['output_error_mean']:.4f} "
             f"against pruning's {r['prune']['output_error_mean']:.4f} (worst seed {r['worst_ratio']:.4f}×) and the "
             f"paper's decoupling's {r['bsd']['output_error_mean']:.4f} ({r['bsd']['params']:,} parameters)"
             for r in rows if "contain" in r and "prune" in r and "bsd" in r]
    sweeps = sorted({k for r in rows for k in r["sweeps_kept"]})
    paper = [str(r["rank"]) for r in rows if "bsd" in r and "contain" in r
             and r["bsd"]["output_error_mean"] < r["contain"]["output_error_mean"]]
    gap = max((abs(r["bsd"]["params"] / r["contain"]["params"] - 1) for r in rows if str(r["rank"]) in paper), default=0)
    verdict = (f"; the paper's decoupling has the lowest error at rank {' and '.join(paper)} (its parameters within "
               f"{100 * gap:.1f} % of pruning's), the one that contains pruning elsewhere" if paper else
               "; the one that contains pruning has the lowest error at every rank")
    return (f"{'; '.join(parts)} (output error, mean over {rows[0]['contain']['seeds']} seeds; sweeps kept: "
            f"{', '.join(map(str, sweeps)) or '—'}){verdict}")


@helper
def contain_worst() -> str:
    """The largest per-MLP error ratio to pruning over every cell, unrefined and refined, and where
    the ratios above 1 are (the cells and the sweeps they kept), as prose."""
    cs = [c for c in cells() if c["worst_ratio"] is not None]
    if not cs:
        return "no cell committed yet"
    parts = []
    for refined in (False, True):
        sel = [c for c in cs if c["refined"] == refined]
        if not sel:
            continue
        worst = max(sel, key=lambda c: c["worst_ratio"])
        above = [c for c in sel if round(c["worst_ratio"], 4) > 1]  # above 1 as the table prints it (float32 rounding)
        if not above:
            where = " (no MLP above pruning's to four digits)"
        else:
            swept = all(c["sweeps"] and c["sweeps"][1] > 0 for c in above)
            where = (f" ({worst['study']} at {worst['axis']} = {worst['at']:g}); above 1 in {len(above)} of {len(sel)} "
                     f"cells{', each one where a later sweep was kept' if swept else ''}")
        parts.append(f"{'refined' if refined else 'unrefined'} {worst['worst_ratio']:.4f}×{where}")
    return "; ".join(parts)
