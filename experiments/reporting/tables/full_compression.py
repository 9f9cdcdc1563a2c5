"""Whole models compressed block by block, front to back against back to front (claim 2): the
ViT on Fashion-MNIST and CIFAR-10, the Swin on CIFAR-10, the fine-tuning budget, with their
figure sources."""

from __future__ import annotations

from .. import committed
from ..committed import run_seconds, source_line
from ..formats import md, pm, pval
from ..registry import source, table
from ..stats import Paired, Result


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
        return run_seconds(self.json) / 60

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


@table("fb-bf")
def fb_bf_table() -> str:
    """Claim (2): BF against FB under both capture protocols (final accuracy, per-step means in the JSON)."""
    d = committed.load("full_compression_vit_fashion-mnist.json")
    if d is None:
        return "No current result committed (`python experiments/full_compression.py`)."
    out = [f"ViT / {d['dataset']} (original {d['accuracy_original']:.2f} %; {d['plan']['runs']} seeds; "
           f"fine-tuning {d['plan']['epochs']} epoch(s) on {d['train_images']} images per step).", "",
           source_line(d), ""]
    rows = []
    for capture, tables in d["tables"].items():
        last = list(tables["FB"])[-1]
        for basis, v in d["verdicts"][capture].items():
            fb, bf = tables["FB"][last][basis], tables["BF"][last][basis]
            rows.append([capture, basis.replace("nu=", "ν="), pm(fb["mean"], fb["std"]), pm(bf["mean"], bf["std"]),
                         f"{v['mean_diff']:+.2f}", pval(v["p_ttest"]), pval(v["p_sign"]), v["verdict"]])
    out.append(md(["capture", "basis", "FB final %", "BF final %", "BF − FB", "t-test p", "sign p", "verdict"],
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


@table("vit-cifar10", "vit")
@table("swin-cifar10", "swin")
def cifar10_table(model: str) -> str:
    """``model`` / CIFAR-10 per step, ours beside the paper's appendix table (and, where it was run,
    the same at the paper's fine-tuning budget)."""
    d = committed.load(f"full_compression_{model}_cifar10.json")
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
           "images), mean ± std over runs.", "", source_line(d), ""]
    rows = []
    for order in ("FB", "BF"):
        for label, cells in d["tables"][capture][order].items():
            row = [order, label]
            for basis in bases:
                c, p = cells[basis], paper.get(order, {}).get(label, {}).get(basis)
                row.append(pm(c["mean"], c["std"]) + ("" if p is None else f" ({p[0]:.2f})"))
            rows.append(row)
    out.append(md(["order", "step", *(b.replace("nu=", "ν=") for b in bases)], rows))
    out += ["", "Final accuracy, BF − FB paired over seeds (ours; the paper's difference in brackets):", ""]
    rows = []
    last = list(d["tables"][capture]["FB"])[-1]
    for basis, v in d["verdicts"][capture].items():
        paper_diff = _paper_final(d, capture, basis)[2]
        rows.append([basis.replace("nu=", "ν="), f"{v['mean_diff']:+.2f}"
                     + ("" if paper_diff is None else f" ({paper_diff:+.2f})"),
                     pval(v["p_ttest"]), pval(v["p_sign"]), v["verdict"]])
    if (v := d.get("pooled_verdicts", {}).get(capture)) and len(bases) > 1:
        rows.append([f"all bases ({v['pairs']} pairs)", f"{v['mean_diff']:+.2f}", pval(v["p_ttest"]),
                     pval(v["p_sign"]), v["verdict"]])
    out.append(md(["basis", "BF − FB", "t-test p", "sign p", "verdict"], rows))
    budget = committed.load(f"full_compression_paper_budget_{model}_cifar10.json")
    if budget is not None:
        cap = capture if capture in budget["tables"] else next(iter(budget["tables"]))
        rows = []
        for basis, v in budget["verdicts"][cap].items():
            fb, bf = budget["tables"][cap]["FB"][last][basis], budget["tables"][cap]["BF"][last][basis]
            ours = {o: d["tables"][capture][o][last].get(basis) for o in ("FB", "BF")}
            one = len(v["seeds"]) == 1  # no spread to show
            rows.append([basis.replace("nu=", "ν="), ", ".join(str(s) for s in v["seeds"]),
                         *(f"{c['mean']:.2f}" if one else pm(c["mean"], c["std"]) for c in (fb, bf)),
                         f"{v['mean_diff']:+.2f}",
                         *("—" if ours[o] is None else f"{ours[o]['mean']:.2f}" for o in ("FB", "BF"))])
        out += ["", f"The paper's fine-tuning budget ({budget['plan']['epochs']} epochs on "
                f"{budget['train_images']:,} images per step), final accuracy:", "", source_line(budget), "",
                md(["basis", "seeds", "FB final %", "BF final %", "BF − FB", "FB, our budget", "BF, our budget"],
                   rows)]
    return "\n".join(out)


@table("headline-swin-cifar10", "swin")
def cifar10_verdicts(model: str) -> str:
    """Final accuracy per basis, FB and BF, ours beside the paper's appendix values, and the
    paired BF − FB verdict per basis and pooled (the README's short form of :func:`cifar10_table`)."""
    d = committed.load(f"full_compression_{model}_cifar10.json")
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
                     f"{v['verdict']} (p = {pval(v['p_ttest'])})"])
    if (v := d.get("pooled_verdicts", {}).get(capture)) and len(rows) > 1:
        rows.append([f"all bases ({v['pairs']} pairs)", "", "", f"{v['mean_diff']:+.2f}",
                     f"{v['verdict']} (p = {pval(v['p_ttest'])})"])
    title = (f"{_MODEL_TITLES.get(model, model)} / CIFAR-10, final (original {d['accuracy_original']:.2f} %, "
             f"paper {paper.get('original', float('nan')):.2f} %)")
    return md([title, "FB % (paper)", "BF % (paper)", "BF − FB (paper)", "verdict (3 seeds)"], rows)


@table("budget-study")
def budget_study_table() -> str:
    """Our fine-tuning budget against the paper's (ViT/Fashion-MNIST, BF, cubic)."""
    d = committed.load("full_compression_budget_study.json")
    if d is None:
        return "No current result committed (`python experiments/full_compression.py --budget-study`)."
    rows = [[label, str(r["epochs"]), f"{r['train_images']:,}", pm(r["mean"], r["std"]),
             ", ".join(f"{a:.2f}" for a in r["final_accuracy"])] for label, r in d["results"].items()]
    v = d["difference"]
    return "\n".join([f"ViT / Fashion-MNIST, BF, {d['study']['basis'].replace('nu=', 'ν=')} (original "
                      f"{d['accuracy_original']:.2f} %), seeds {d['seeds']}.", "", source_line(d), "",
                      md(["budget", "epochs per step", "images", "final %", "per seed"], rows), "",
                      f"Paper − ours: {v['mean_diff']:+.2f} points (paired t-test p = {pval(v['p_ttest'])}, "
                      f"sign test p = {pval(v['p_sign'])}): **{v['verdict']}**."])


@table("headline-compression")
def headline_compression() -> str:
    """Claim (2): final accuracy of back-to-front minus front-to-back, cubic B-splines, ours and the paper's."""
    rows = []
    for name, title in (("full_compression_vit_fashion-mnist.json", "ViT / Fashion-MNIST"),
                        ("full_compression_vit_cifar10.json", "ViT / CIFAR-10"),
                        ("full_compression_swin_cifar10.json", "Swin / CIFAR-10")):
        d = committed.load(name)
        if d is None:
            continue
        capture = _main_capture(d)
        basis = next((b for b in d["verdicts"][capture] if "d=3" in b and "BSD" in b), next(iter(d["verdicts"][capture])))
        v = d["verdicts"][capture][basis]
        paper_diff = _paper_final(d, capture, basis)[2]
        rows.append([title, basis.replace("nu=", "ν="), f"{v['mean_diff']:+.2f} (p = {pval(v['p_ttest'])})",
                     v["verdict"], "—" if paper_diff is None else f"{paper_diff:+.2f}"])
    if not rows:
        return "_No full-compression result committed._"
    return md(["model / data", "basis", "BF − FB final, points", "verdict (3 seeds)", "paper"], rows)


source("fc_vit_fmnist", "full_compression_vit_fashion-mnist.json", FullCompression)
source("fc_vit_c10", "full_compression_vit_cifar10.json", FullCompression)
source("fc_swin_c10", "full_compression_swin_cifar10.json", FullCompression)
source("fc_vit_c10_paper_budget", "full_compression_paper_budget_vit_cifar10.json", FullCompression)
source("budget_study", "full_compression_budget_study.json", Result)
