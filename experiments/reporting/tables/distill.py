"""Label-free distillation of the whole compressed model (issue 43): every committed run of
``experiments/distill.py``, the headline and its ablations, with their figure sources."""

from __future__ import annotations

import pathlib

import numpy as np

from .. import committed
from ..committed import source_line
from ..formats import md, num, pct, pm
from ..names import prose_name
from ..registry import SOURCES, source, table
from ..stats import Paired, Study

#: The studies' result files: the headline of each model (the script's full plan) first.
HEADLINES = ("distill_vit_fashion-mnist.json", "distill_deit_usps.json")


class Distillation(Study):
    """One ``experiments/distill.py`` result: per (method, variant, ρ, seed), the test accuracy
    after refinement alone (``accuracy_refined``, the pairing) and after distillation."""

    def __init__(self, payload: dict, file: str | None = None):
        super().__init__(payload)
        self.source_file = file or payload.get("file", "")

    def _runs(self, method, rho, setting=None) -> dict:
        return {r["seed"]: r for r in self.json["runs"] if r["method"] == method and r["reduction"] == rho
                and r.get("status", "ok") == "ok" and (setting is None or r["variant"] == setting)}

    def gap(self, method: str, rho: float, variant: str | None = None) -> float:
        """The original's accuracy minus the distilled one's, mean over seeds, in points."""
        return self.json["accuracy_original"] - self.mean(method, rho, setting=variant)

    def gap_refined(self, method: str, rho: float, variant: str | None = None) -> float:
        """The same for refinement alone (the same compressions)."""
        return self.json["accuracy_original"] - self.mean(method, rho, "accuracy_refined", setting=variant)

    def gain(self, method: str, rho: float, variant: str | None = None) -> Paired:
        """Distilled − refined alone, paired over seeds (points)."""
        runs = self._runs(method, rho, variant)
        return Paired([runs[s]["accuracy"] for s in sorted(runs)], [runs[s]["accuracy_refined"] for s in sorted(runs)])

    def ablation(self, suffix: str) -> "Distillation | None":
        """The committed ablation of this headline whose file ends in ``_<suffix>`` (``"n1024"``),
        or None."""
        file = self.source_file or SOURCES[self.source]  # a figure's source: named by the namespace
        name = pathlib.Path(file).stem + f"_{suffix}.json"
        d = committed.load(name)
        return None if d is None else Distillation(d, name)

    def seed_gap(self, method: str, rho: float, variant: str, seed: int = 0) -> float:
        """The original's accuracy minus one seed's distilled accuracy (points)."""
        return self.json["accuracy_original"] - self._runs(method, rho, variant)[seed]["accuracy"]

    def knob_gaps(self, suffixes, method: str = "prune-ref300", rho: float = 0.5, variant: str = "kl+blocks",
                  seed: int = 0) -> str | None:
        """``"1.14 / 1.06 / 0.66"``: :meth:`seed_gap` of each ablation (``""``: this result), or
        None while one of them is not committed."""
        runs = [self if k == "" else self.ablation(k) for k in suffixes]
        if not all(runs):
            return None
        return " / ".join(num(r.seed_gap(method, rho, variant, seed)) for r in runs)

    def images(self) -> int:
        """The unlabeled training images the runs distilled on (a split smaller than the plan caps it)."""
        return int(self.json["runs"][0]["images"])

    def says(self, method: str, rho: float, variant: str, target: float) -> str:
        """The headline as prose: what the distilled model reaches, its gap to the original against
        refinement alone's, the paired gain, and whether the gap meets ``target`` (points)."""
        n, gain, gap = len(self.seeds(method, rho, setting=variant)), self.gain(method, rho, variant), \
            self.gap(method, rho, variant)
        name = prose_name(method)
        return (f"{name[:1].upper() + name[1:]} distilled on {self.images():,} unlabeled training images reaches "
                f"{pct(self.mean(method, rho, setting=variant))} (mean of {n} seed{'s' * (n != 1)}), "
                f"{num(gap)} points below the original ({pct(self.json['accuracy_original'])}); refined alone it "
                f"stops {num(self.gap_refined(method, rho, variant))} points below (paired gain {gain.d}, {gain.pv}). "
                f"Issue 43's target, within {target:g} point{'s' * (target != 1)}: "
                + ("**met**" if gap <= target else "**missed**") + ("." if n >= 3 else " (fewer than 3 seeds so far)."))


for _name in HEADLINES:
    source("dst_" + _name.split("_")[1], _name, Distillation)  # dst_vit, dst_deit


def _files() -> list[str]:
    """The committed results of ``experiments/distill.py``: the headlines, then the ablations by name."""
    found = sorted(p.name for p in committed.RESULTS.glob("distill_*.json") if "_quick" not in p.name)
    return [f for f in HEADLINES if f in found] + [f for f in found if f not in HEADLINES]


def _model_data(name: str) -> str:
    """``distill_vit_fashion-mnist_lr10.json`` -> ``"ViT / Fashion-MNIST"``."""
    parts = name.removesuffix(".json").split("_")
    return f"{parts[1].replace('vit', 'ViT').replace('deit', 'DeiT')} / " + \
        {"fashion-mnist": "Fashion-MNIST", "usps": "USPS"}.get(parts[2], parts[2])


def _settings(plan: dict, images: int) -> str:
    lr = f"lr {plan['learning_rate']:g}" + (f", {plan['schedule']}" if plan.get("schedule", "constant") != "constant"
                                            else "") + (f" (warm-up {plan['warmup']})" if plan.get("warmup") else "")
    return (f"{images:,} images, {plan['steps']:,} steps of {plan['batch']}, {lr}, "
            f"{plan.get('trainable', 'replaced')}")


@table("distill")
def distill_table() -> str:
    """Every committed distillation result: per model, method, variant and ρ, the test accuracy
    after refinement alone and after distillation (mean ± std over seeds), the gap to the original,
    the paired gain, the step kept and what the stage cost."""
    files = _files()
    if not files:
        return "No current result committed (`python experiments/distill.py`)."
    rows, sources = [], []
    for name in files:
        d = committed.load(name)
        study = Distillation(d)
        tag = "headline" if name in HEADLINES else "ablation"
        for r in d["rows"]:
            method, variant, rho = r["method"], r["variant"], r["reduction"]
            runs = study._runs(method, rho, variant)
            if not runs:
                continue
            seeds = sorted(runs)
            acc = [runs[s]["accuracy"] for s in seeds]
            ref = [runs[s]["accuracy_refined"] for s in seeds]
            gain = study.gain(method, rho, variant)
            rows.append([_model_data(name), tag, prose_name(method), variant, f"{rho:g}",
                         _settings(d["plan"], runs[seeds[0]]["images"]), str(len(seeds)), pm(float(np.mean(ref)), float(np.std(ref))),
                         pm(float(np.mean(acc)), float(np.std(acc))),
                         f"{study.gap(method, rho, variant):.2f}", f"{gain.d} ({gain.pv})",
                         f"{np.mean([runs[s]['distill']['steps_kept'] for s in seeds]):.0f}",
                         f"{np.mean([runs[s]['seconds_distill'] for s in seeds]):.0f}"])
        sources.append(f"`{name}`: {source_line(d)}")
    originals = ", ".join(f"{_model_data(n)} {committed.load(n)['accuracy_original']:.2f} %"
                          for n in files if n in HEADLINES)
    head = ("Test accuracy (%) after the training-free protocol refined without labels (`refined`), and after "
            "distilling the whole compressed model from the original on unlabeled training images (`distilled`; "
            "their labels are never read; 20 % of them held out, the best evaluated step kept), mean ± std over "
            f"seeds. Originals: {originals}. Gap = original − distilled; gain = distilled − refined, paired over "
            "seeds. `kl+blocks`: KL on the logits (T = 2) plus every block's output tokens; `kl`: the logits only. "
            "Seconds: the distillation stage alone.")
    table_md = md(["model / data", "run", "method", "variant", "ρ", "settings", "seeds", "refined", "distilled",
                   "gap", "gain", "step kept", "seconds"], rows)
    return "\n".join([head, "", *[f"- {s}" for s in sources], "", table_md])
