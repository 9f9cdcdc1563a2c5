"""One compression per family group (issue 60): ``jaxbsd compress-hf`` on a sentence encoder, an image
classifier and a causal LM, each measured by its kind's label-free figures against the original."""

from __future__ import annotations

from .. import committed
from ..committed import source_line
from ..formats import md
from ..names import display
from ..registry import table

#: The figures of each kind, in order, with their names on the page.
FIGURES = {"mean_cosine": "mean cosine", "neighbour_overlap@10": "top-10 overlap", "recall@1": "recall@1",
           "recall@10": "recall@10", "top1_agreement": "top-1 agreement", "mean_kl": "mean KL",
           "max_kl": "max KL", "bits_per_token": "bits per token", "next_token_agreement": "next-token agreement"}
#: Figures whose original value is a measurement (the others are 1 or 0 by definition), shown beside them.
MEASURED_REFERENCE = ("recall@1", "recall@10", "bits_per_token")
#: The family groups, as the page names them.
GROUP_NAMES = {"encoder": "encoders", "vision": "vision", "decoder": "decoders"}


def _figures(run: dict) -> str:
    cells = []
    for key, value in run["figures"].items():
        name = FIGURES.get(key, key)
        digits = 4 if "kl" in key else 3
        cell = f"{name} {value:.{digits}f}"
        if key in MEASURED_REFERENCE:
            cell += f" (original {run['reference'][key]:.{digits}f})"
        cells.append(cell)
    return "; ".join(cells)


def _data(run: dict) -> str:
    cal, ev = run["calibration_facts"], run["evaluation_facts"]
    if run["kind"] == "vision":
        return (f"exported as `{run['exported_as']}` with a `preprocessor_config.json` of its training "
                f"normalisation ({run['preprocessing']}); calibrated on {cal['images']} images of {cal['source']}, "
                f"evaluated on {ev['images']:,} images of {ev['source']}")
    if run["kind"] == "decoder":
        return (f"exported as `{run['exported_as']}` with its character `tokenizer.json`; calibrated on "
                f"{cal['windows']} windows of {cal['tokens_per_window']} tokens of {run['calibration']}, evaluated "
                f"on {run['evaluation']}, {ev['predicted_tokens']:,} tokens predicted")
    return (f"calibrated on {cal['windows']} windows of {cal['tokens_per_window']} tokens of {cal['source']}, "
            f"evaluated on {ev['texts']} passages and {ev['pairs']} title → section pairs of {ev['source']}")


@table("hf-families")
def hf_families_table() -> str:
    """Per family group and method: the model, its parameters before and after, the kind's figures beside the
    original's where those are measured, the seconds of the whole command, then what each was calibrated and
    evaluated on."""
    d = committed.load("hf_families.json")
    if d is None:
        return "No current result committed (`python experiments/hf_families.py`)."
    runs, plan = d["runs"], d["plan"]
    head = (f"`jaxbsd compress-hf` run in-process on one real model of each family group, every MLP compressed "
            f"to remove {plan['reduction']:g} of the whole model's parameters (only the MLPs shrink), refined for "
            f"{plan['refine_steps']} steps per MLP (`--refine-steps`). The figures are the kind's own, "
            "without labels, against the uncompressed model on held-out data: encoders the embeddings' agreement "
            "and title → section retrieval; image classifiers top-1 agreement and the KL divergence of the class "
            "distributions (nats); causal LMs bits per token (the character LM's tokens are characters) and the "
            "share of positions with the original's most likely next token. Seconds: the whole command (loading, "
            "calibration, compression, evaluation, writing).")
    rows = [[GROUP_NAMES[r["group"]], r["model"], f"`{r['model_type']}`", display(r["method"]),
             f"{r['params_before']:,} → {r['params_after']:,}", f"{r['reduction']:.3f}", f"{r['mlp_reduction']:.3f}",
             _figures(r), f"{r['seconds']:.0f}"] for r in runs]
    first = {}
    for r in runs:  # the methods of a group share its calibration and evaluation
        first.setdefault(r["group"], r)
    data = [f"- {GROUP_NAMES[group]}: {_data(r)}." for group, r in first.items()]
    return "\n".join([head, "", source_line(d), "",
                      md(["group", "model", "model_type", "method", "parameters", "model reduction",
                          "MLP share removed", "figures (the original's where measured)", "seconds"], rows),
                      "", "Calibration and evaluation, per group:", "", *data])
