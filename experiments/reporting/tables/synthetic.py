"""The paper's first studies: the synthetic example (Table 1), the ablation grids and the
trained models, with their figure sources."""

from __future__ import annotations

from typing import Iterable

import numpy as np

from .. import committed
from ..committed import source_line
from ..formats import md
from ..registry import source, table
from ..stats import Result


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


@table("synthetic")
def synthetic_tables() -> str:
    d = committed.load("synthetic.json")
    if d is None:
        return "_No synthetic result committed._"
    res = d["results"]
    strategies = list(res)
    out = [source_line(d), "",
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
    out.append(md(["method", "restarts", "e₁ %", "paper", "e₂ %", "paper", "mean %", "paper"], rows))
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
    out.append(md(["method", "restarts", "held-out e₁ / e₂ / mean %", "outside e₁ / e₂ / mean %",
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
    return md(["variant", "λ", *g["columns"]], rows)


@table("ablation")
def ablation_tables() -> str:
    out = []
    for name in ("mnist", "fashion-mnist"):
        d = committed.load(f"ablation_{name}.json")
        if d is None:
            out.append(f"**{name}**: no current result committed (see the text above).")
            continue
        out += [f"**{name}** (original accuracy {d['accuracy_original_eval_subset']:.2f} % on "
                f"{d['eval_images']} test images; cells: accuracy % / Error(𝒥) / Error(F), mean over ranks, "
                f"degrees or ν and {d['grid']['restarts']} runs). Status counts: "
                + ", ".join(f"{k} {v}" for k, v in d["grids"]["status_totals"].items()) + ".",
                "", source_line(d)
                + (f" Partial: {d['configurations']['done']} of {d['configurations']['total']} configurations "
                   "finished; the others are listed in the JSON and resume with the same command."
                   if d.get("configurations", {}).get("missing") else ""),
                "", _ablation_table(d), ""]
    return "\n".join(out).rstrip()


@table("training")
def training_table() -> str:
    d = committed.load("training.json")
    if d is None:
        return "_No training result committed._"
    rows = []
    for r in d["runs"]:
        rows.append([f"{r['model']} / {r['dataset']}", f"{r['params']:,}", str(r["epochs"]),
                     f"{100 * r['test_acc']:.2f} %", f"{r['wall_seconds'] / 60:.1f} min"])
    return md(["model / data", "params", "epochs", "test accuracy", "wall time"], rows)


@table("headline-synthetic")
def headline_synthetic() -> str:
    """Table 1 of the paper: mean eᵢ on the sampling points, best of 8 restarts, ours beside the paper's."""
    d = committed.load("synthetic.json")
    if d is None:
        return "_No synthetic result committed._"
    res = d["results"]["best-of-8"] if "best-of-8" in d["results"] else next(iter(d["results"].values()))
    rows = [[name.replace("nu", "ν"), f"{r['e_S_avg']:.2f}", f"{r['paper']['mean']:.2f}"] for name, r in res.items()]
    return md(["method (synthetic example, paper Table 1)", "mean eᵢ %, ours", "paper"], rows)


source("synthetic", "synthetic.json", Synthetic)
source("abl_mnist", "ablation_mnist.json", Ablation)
source("abl_fmnist", "ablation_fashion-mnist.json", Ablation)
source("training", "training.json", Training)
source("training_lm", "training_lm_pystdlib.json", Training)
source("training_vit_c10", "training_vit_cifar10.json", Training)
