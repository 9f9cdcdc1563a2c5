"""The README's one-screen decision: your situation, the method and the flag, and what it costs.

Every figure is read from a committed result through the same objects the pages' figures use (the
kinds the table modules register for each source); the full evidence is on ``docs/which-method.md``.
"""

from __future__ import annotations

from .. import committed
from ..formats import md
from ..registry import table
from . import result


def _minilm_cost(share: float) -> str:
    """Seconds of one MiniLM MLP's pruning at ``share`` (its fastest round), and today's decoupling
    as a multiple of it (``benchmarks/minilm.json``; minima, the least disturbed by the machine's load)."""
    d = committed.read_json(committed.BENCHMARKS / "minilm.json")
    rows = [r["details"] for r in d["rows"] if r["details"].get("share") == share and r["details"].get("x_prune_min")]
    old = next(r for r in rows if r["method"] == "bsd")
    new = next((r for r in rows if r["method"] == "bsd-aug" and r.get("budget_rank")), None)
    return (f"{old['prune']['seconds_min']:.1f} s an MLP; `bsd` {new['x_prune_min']:.1f}×, "
            f"old {old['x_prune_min']:.0f}×" if new else
            f"{old['prune']['seconds_min']:.1f} s an MLP; a decoupling {old['x_prune_min']:.0f}×")


@table("headline-which-method")
def which_method_short() -> str:
    """Situation → method and flag → what the committed results say → what it costs."""
    tf_deit, tf_vit, minilm, lm, dst_vit = (result(n) for n in ("tf_deit", "tf_vit", "minilm", "lm", "dst_vit"))
    light = [tf_deit.vs("prune", "bsd", r).diff for r in (0.1, 0.2)]
    gated = [v.diff for m in ("prune", "drone") for v in lm.gaps("bsd", m, "training-free")]
    rows = [
        ["a pretrained encoder (MiniLM)", "`prune` or `bsd`",
         f"s = 0.5 refined: cosine {minilm.mean('prune-ref', 0.5):.3f}; `bsd` "
         + (f"{minilm.mean('bsd-aug-ref', 0.5):.3f} ({minilm.vs('bsd-aug-ref', 'prune-ref', 0.5, digits=4).verdict}), "
            if minilm.seeds('bsd-aug-ref', 0.5) else "")
         + f"old `bsd` {minilm.mean('bsd-ref', 0.5):.3f}", _minilm_cost(0.5)],
        ["a ViT, light (ρ ≤ 0.2)", "`prune` or `bsd`",
         "DeiT/USPS unrefined, `bsd` − pruning: "
         + ", ".join(tf_deit.vs('bsd-aug', 'prune', r).d for r in (0.1, 0.2))
         + f" ({' / '.join(sorted({tf_deit.vs('bsd-aug', 'prune', r).verdict for r in (0.1, 0.2)}))}); "
         f"old `bsd` {min(light):.2f}–{max(light):.2f} below",
         "one refit an MLP"],
        ["a ViT, ρ = 0.5", "`bsd`",
         f"ViT/Fashion-MNIST unrefined: `bsd` {tf_vit.mean('bsd-aug', 0.5):.2f} %, pruning {tf_vit.mean('prune', 0.5):.2f} % "
         f"({tf_vit.vs('bsd-aug', 'prune', 0.5).verdict}); refined {tf_vit.mean('bsd-aug-ref300', 0.5):.2f} % and "
         f"{tf_vit.mean('prune-ref300', 0.5):.2f} %", "pruning, then the sweeps that help"],
        ["gated MLPs (SwiGLU)", "`prune`, `drone`",
         f"B-splines {min(gated):.2f}–{max(gated):.2f} bits per character behind (the LM, unrefined)", "as pruning"],
        ["what is left", "`distill=jb.Distill()`",
         f"ViT, refined pruning at ρ = 0.5: {dst_vit.gap_refined('prune-ref300', 0.5, 'kl+blocks'):.2f} → "
         f"{dst_vit.gap('prune-ref300', 0.5, 'kl+blocks'):.2f} points below the original", "steps on unlabeled images"],
        ["the paper's experiments", "`bsd` (`jaxbsd compress`)", "its plain B-splines ([results](docs/results.md))",
         "[the benchmarks](docs/performance.md)"],
    ]
    return md(["your situation", "use", "what the committed results say", "cost"], rows)
