"""The character language model's gated MLPs compressed (issue 23), with its figure source."""

from __future__ import annotations

from typing import Iterable

import numpy as np

from .. import committed
from ..committed import source_line
from ..formats import md, pm, pval
from ..names import is_refined, row_name, setting
from refinement import Setting
from ..registry import source, table
from ..stats import Paired, Study


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


@table("lm-compression")
def lm_compression_table() -> str:
    """Issue 23: the character LM's gated MLPs compressed (test bpc per setting × method × ρ,
    paired verdicts against B-spline), and the fit of one gated MLP against a plain one."""
    d = committed.load("lm_compression.json")
    if d is None:
        return "_No result committed._ (`python experiments/lm_compression.py`)"
    out = [f"Character LM on pystdlib (original {d['bpc_original']:.4f} bits per character on "
           f"{d['test_subset']['characters']:,} test characters, {d['params_original']:,} parameters); every gated "
           f"MLP compressed back to front; mean ± std over {d['plan']['seeds']} seeds (calibration windows and "
           f"solver key); fine-tuned = {d['plan']['finetune']['steps']} steps of train_lm (lr "
           f"{d['plan']['finetune']['lr']:g}) after the last replacement. Verdict = \"B-spline has lower test bpc\", "
           "paired over seeds (t-test, p < 0.05; Δ = method − B-spline, bits per character).", "", source_line(d), ""]
    lm = LanguageModel(d)
    if any(is_refined(r["method"]) for r in d["rows"]):
        out[0] += (" Refined rows (`+ refined`: every replacement refined without labels as it is built, "
                   "before any fine-tuning) are compared with the B-spline decoupling refined the same way.")
    rows = []
    for r in d["rows"]:
        if r["status"] != "ok":
            rows.append([r["setting"], row_name(r), f"{r['reduction']:g}", "infeasible", "—", "—", "—"])
            continue
        v = d["verdicts"][f"{r['setting']} {r['reduction']!r}"].get(r["method"])
        if is_refined(r["method"]):  # refined rows: against the B-spline refined the same way
            reference = Setting("bsd", setting(r["method"]).refine).name
            if r["method"] == reference:
                cell = "(reference, refined)"
            else:
                p = lm.vs(r["method"], reference, r["reduction"], setting=r["setting"], digits=3)
                cell = ("no paired runs" if not p.n else
                        f"{p.verdict} (Δ {p.diff:+.3f}, p = {pval(p.p if np.isfinite(p.p) else None)})")
        else:
            cell = ("(reference)" if v is None else "no paired runs" if not v["n"]
                    else f"{v['verdict']} (Δ {v['mean_diff']:+.3f}, p = {pval(v['p_ttest'])})")
        err = "—" if r.get("output_error_mean") is None else f"{r['output_error_mean']:.3g}"
        rows.append([r["setting"], row_name(r), f"{r['reduction']:g}", pm(r["bpc_mean"], r["bpc_std"], 3),
                     f"{r['params_mean']:,.0f}", err, cell])
    out += [md(["setting", "method", "ρ", "test bpc", "params", "output error", "B-spline lower bpc"], rows), ""]
    if (committed.RESULTS / "lm_compression.png").exists():  # docs/hooks.py serves experiments/results/*.png as plots/
        out += ["![Character LM: test bits per character against parameters](plots/lm_compression.png)", ""]
    fit = d["fit"]
    out += [f"**One MLP ({fit['mlp']}) decoupled at fixed ranks, gated (SwiGLU) against a plain GELU MLP of the same "
            f"shape** (mean ± std over {fit['seeds']} seeds; test bpc of the gated LM {d['bpc_original']:.4f}, of "
            f"its plain twin {d['plain_model'].get('test_bpc', float('nan')):.4f}):", ""]
    out += [md(["MLP", "rank", "Error(J)", "Error(F)", "output error", "params (MLP → decoupled)"],
                [[r["kind"], str(r["rank"]), pm(r["error_J_mean"], r["error_J_std"], 4),
                  pm(r["error_F_mean"], r["error_F_std"], 4), pm(r["output_error_mean"], r["output_error_std"], 4),
                  f"{r['params_mlp']:,} → {r['params_decoupled']:,}"] for r in fit["rows"]]), "",
            f"Finding: {fit['finding']}."]
    if fit.get("contain"):
        out += ["", f"**Where containment applies: the plain twin's MLP ({fit['mlp']}) at the same ranks**, pruned, as "
                "`compress_model`'s `\"bsd\"` (the decoupling that contains pruning: an MLP of the rank's units, "
                "pruning's parameters) and as the paper's decoupling; the output error on held-out tokens, mean ± std "
                f"over {fit['seeds']} seeds; the worst ratio of the contained decoupling's error to pruning's (same "
                "seed) and the sweeps it kept (0: the pruned MLP).", "",
                md(["rank", "pruning (params)", "contains pruning (params)", "paper's decoupling (params)",
                    "worst ratio", "sweeps kept"],
                   [[str(r["rank"]),
                     *(f"{pm(r[m]['output_error_mean'], r[m]['output_error_std'], 4)} ({r[m]['params']:,})"
                       if m in r else "—" for m in ("prune", "contain", "bsd")),
                     "—" if r["worst_ratio"] is None else f"{r['worst_ratio']:.4f}",
                     ", ".join(str(k) for k in r["sweeps_kept"]) or "—"] for r in fit["contain"]["rows"]])]
    return "\n".join(out).rstrip()


source("lm", "lm_compression.json", LanguageModel)
