"""The real pretrained model (issue 42): all-MiniLM-L6-v2 compressed by every method, measured on
held-out Python documentation against the uncompressed model, no labels."""

from __future__ import annotations

import numpy as np

from .. import committed
from ..committed import source_line
from ..formats import md, pm
from ..names import display
from ..registry import source, table
from ..stats import Study

METRICS = (("mean_cosine", "mean cosine"), ("neighbour_overlap", "top-10 overlap"), ("recall@1", "recall@1"),
           ("recall@10", "recall@10"))


def _cell(runs: list[dict], key: str, digits: int = 3) -> str:
    v = [r[key] for r in runs]
    return pm(float(np.mean(v)), float(np.std(v)), digits) if v else "—"


def _alone_seconds(run: dict, runs: list[dict]) -> float:
    """A unit's seconds as if it had built everything itself: an ``auto`` unit that reused the
    builds of ``bsd`` (same share, seed and refinement) gets their seconds added."""
    if not run.get("builds_reused") or run.get("build_seconds"):
        return run["seconds"]
    family = "bsd-aug" if run["base"] == "auto-aug" else "bsd"  # whose builds it reused
    donor = [r for r in runs if r["base"] == family and r["share"] == run["share"] and r["seed"] == run["seed"]
             and r["refined"] == run["refined"]]
    return run["seconds"] + (donor[0].get("build_seconds") or 0.0 if donor else 0.0)


@table("minilm")
def minilm_table() -> str:
    """Per method, refinement and share of the MLP parameters removed: the committed units' label-free
    and structural measures (mean ± population std over the seeds done), beside the original's recall."""
    d = committed.load("minilm.json")
    if d is None:
        return "No current result committed (`python experiments/minilm.py`)."
    plan, runs = d["plan"], d["runs"]
    ref = runs[0] if runs else None
    head = (f"all-MiniLM-L6-v2 ({d['params']:,} parameters, {d['params_mlp']:,} in its six MLPs); "
            f"**{d['units_done']} of {d['units_planned']} units committed** "
            f"({len(plan['methods'])} methods × {len(plan['shares'])} shares × refinement off/on × "
            f"{plan['seeds']} seeds; the run resumes unit by unit). Measured on {plan['eval_passages']} held-out "
            f"passages and {plan['eval_pairs']} heading → first-paragraph pairs of evaluation files never "
            "calibrated on; mean ± std over the seeds done.")
    if ref is not None:
        head += (f" The original's recall@1 / recall@10: {ref['reference_recall@1']:.3f} / "
                 f"{ref['reference_recall@10']:.3f}.")
    cut = plan.get("slow_cells")
    if cut:
        seeds = "the first seed" if cut["seeds"] == 1 else f"the first {cut['seeds']} seeds"
        cells = [r for r in runs if r["base"] in cut["methods"] and r["share"] in cut["shares"]]
        builds = [r["build_seconds"] / 60 for r in cells if r.get("build_seconds")]
        spent = sum(r["seconds"] + r.get("eval_seconds", 0) for r in runs) / 3600
        more = sum(r["seconds"] + r.get("eval_seconds", 0) for r in cells) / 3600 * (plan["seeds"] - cut["seeds"])
        head += (f" **The cut:** {' and '.join(display(m) for m in cut['methods'])} at the shares "
                 f"{' and '.join(f'{s:g}' for s in cut['shares'])} (the highest decoupling ranks) run for {seeds} "
                 "only" + (f": there, one decoupling of the six MLPs took {min(builds):.0f}–{max(builds):.0f} min of "
                           f"wall time on this shared 2-core CPU, and their further seeds would add about {more:.1f} h "
                           f"to the {spent:.1f} h the committed units took" if builds else "") + ".")
    head += (" Seconds: the compression's wall time per unit, mean over seeds; where `auto` reused the decoupling "
             "of `bsd` at the same share, seed and refinement, that build's seconds are counted in its row as well, "
             "so each row is what the method costs alone.")
    rows = []
    for share in plan["shares"]:
        for method in plan["methods"]:
            for refined in (False, True):
                cell = [r for r in runs if r["share"] == share and r["base"] == method and r["refined"] == refined]
                if not cell:
                    continue
                rows.append([f"{share:g}", f"{np.mean([r['reduction'] for r in cell]):.3f}", display(method),
                             "yes" if refined else "no", str(len(cell)),
                             *[_cell(cell, key) for key, _ in METRICS],
                             f"{np.mean([_alone_seconds(r, runs) for r in cell]):.0f}"])
    table_md = md(["MLP share removed", "model reduction", "method", "refined", "seeds",
                   *[name for _, name in METRICS], "seconds"], rows) if rows else "_No unit done yet._"
    out = [head, "", source_line(d), "", table_md]
    if (committed.RESULTS / "minilm.png").exists():  # docs/hooks.py serves experiments/results/*.png as plots/
        out += ["", "![all-MiniLM-L6-v2: mean cosine and recall@10 against the share of MLP parameters removed]"
                "(plots/minilm.png)"]
    return "\n".join(out)


class MiniLM(Study):
    """The MiniLM study as figures see it: ``mean(method, share, key)`` and ``vs(a, b, share, key)``
    over the seeds done, ``method`` as the units name it (``"bsd-ref"``), the share of the MLP
    parameters removed in place of ρ, the mean cosine by default."""

    key = "mean_cosine"

    def _runs(self, method, rho, setting=None) -> dict:
        return {r["seed"]: r for r in self.json["runs"] if r["method"] == method and r["share"] == rho
                and r.get("status", "ok") == "ok"}

    #: The methods as this study's prose names them (its ``bsd`` is ``compress_model``'s, warm-started).
    NAMES = {"prune": "pruning", "svd": "SVD", "drone": "DRONE", "bsd": "B-splines", "auto": "`auto`",
             "bsd-aug": "B-splines containing pruning", "auto-aug": "`auto` containing pruning"}

    def tied(self, share: float, key: str | None = None, refined: bool = True, within: float = 5e-4) -> str:
        """The methods whose mean of ``key`` at ``share`` is within ``within`` of the highest, over
        the seeds all of them have there, as prose (``"pruning"``, ``"pruning and `auto`"``): a
        lead of less is no lead."""
        runs = {m: self._runs(m + ("-ref" if refined else ""), share) for m in self.json["plan"]["methods"]}
        names = [m for m in runs if runs[m]]
        common = set.intersection(*(set(runs[m]) for m in names))  # the seeds every method has here (the cut)
        means = {m: float(np.mean([runs[m][s][key or self.key] for s in common])) for m in names}
        top = max(means.values())
        return " and ".join(self.NAMES.get(m, m) for m in names if means[m] >= top - within)

    def best(self, share: float, key: str | None = None, refined: bool = True) -> str:
        """The method (unit name) with the highest mean of ``key`` at ``share``, refined or not."""
        names = [m + ("-ref" if refined else "") for m in self.json["plan"]["methods"]]
        return max((n for n in names if self._runs(n, share)), key=lambda n: self.mean(n, share, key))

    def leaders(self, refined: bool, key: str | None = None) -> str:
        """Which methods have the highest mean at each share (:meth:`tied`), as prose: "pruning at
        every share", or "pruning at s = 0.5 and 0.6, `auto` at s = 0.7–0.9" (the plan's order)."""
        shares = [s for s in self.json["plan"]["shares"] if any(self._runs(m + ("-ref" if refined else ""), s)
                                                                 for m in self.json["plan"]["methods"])]
        by: dict[str, list[int]] = {}
        for i, share in enumerate(shares):
            by.setdefault(self.tied(share, key, refined), []).append(i)
        if len(by) == 1:
            return f"{next(iter(by))} at every share"

        def span(idx: list[int]) -> str:  # a run of 3 or more neighbouring shares as a range
            if len(idx) >= 3 and idx[-1] - idx[0] == len(idx) - 1:
                return f"{shares[idx[0]]:g}–{shares[idx[-1]]:g}"
            return ", ".join(f"{shares[i]:g}" for i in idx[:-1]) + (" and " if len(idx) > 1 else "") + \
                f"{shares[idx[-1]]:g}"

        return ", ".join(f"{m} at s = {span(v)}" for m, v in by.items())

    def top(self, share: float, key: str | None = None, refined: bool = True) -> float:
        """The highest mean of ``key`` at ``share`` over the methods (refined or not)."""
        return self.mean(self.best(share, key, refined), share, key)


source("minilm", "minilm.json", MiniLM)
