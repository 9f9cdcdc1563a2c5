"""The real pretrained model (issue 42): all-MiniLM-L6-v2 compressed by every method, measured on
held-out Python documentation against the uncompressed model, no labels."""

from __future__ import annotations

import numpy as np

from .. import committed
from ..committed import source_line
from ..formats import md, pm
from ..names import display
from ..registry import table

METRICS = (("mean_cosine", "mean cosine"), ("neighbour_overlap", "top-10 overlap"), ("recall@1", "recall@1"),
           ("recall@10", "recall@10"))


def _cell(runs: list[dict], key: str, digits: int = 3) -> str:
    v = [r[key] for r in runs]
    return pm(float(np.mean(v)), float(np.std(v)), digits) if v else "—"


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
                             f"{np.mean([r['seconds'] for r in cell]):.0f}"])
    table_md = md(["MLP share removed", "model reduction", "method", "refined", "seeds",
                   *[name for _, name in METRICS], "seconds"], rows) if rows else "_No unit done yet._"
    return "\n".join([head, "", source_line(d), "", table_md])
