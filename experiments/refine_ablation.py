"""Label-free refinement: how many steps, which target, which batch and learning rate.

The protocol of ``training_free.py`` (a trained model, every MLP replaced at a whole-model
reduction ρ, nothing trained with labels, 256 calibration images per block and seed), with each
replacement refined for ``n`` Adam steps to reproduce the original MLP's outputs on the
calibration tokens (a :class:`refinement.Refinement`, named ``-ref<n>``; :class:`jaxbsd.Refine`), the
best step on 20 % held-out tokens kept:

* ``--study steps`` (default): ``n`` ∈ {0, 50, 100, 300, 1000} for the warm-started B-spline
  decoupling and for pruning, at ρ = 0.5, back to front (the order of every study);
* ``--study main``: the training-free study with and without refinement (300 steps) for the
  warm-started B-spline decoupling, pruning and ``auto`` — on DeiT/USPS, whose decouplings are the
  slowest to run, at the budgets given (default ρ ∈ {0.1, 0.2, 0.35, 0.5}); the ViT/Fashion-MNIST pair has
  every method in ``training_free.py``'s own result;
* ``--study targets``: the two targets at 300 steps, **front to back**: ``-ref300`` trains towards
  the original MLP applied to the inputs the compressed model feeds it (``"local"``),
  ``-refc300`` towards the original model's own MLP outputs on the same images
  (``"consistent"``). Back to front, no MLP upstream of the one being replaced has changed yet,
  so the two targets are the same tokens and give identical results; front to back, every
  upstream MLP is already compressed, and the targets differ (with the consistent target also
  the default minibatch loop, at 300 and 1000 steps);
* ``--study batch``: full-batch steps (``-ref<n>``, every training token at every step) against
  minibatches of 512 and 256 tokens (``-ref<n>b512``, ``-ref<n>b256``; with 512, also 150 steps
  and the learning rate 2e-3, ``lr20``), at ρ = 0.5 back to front, for the warm-started B-spline
  decoupling and pruning: what the cheaper loop costs in accuracy (on the ViT also 1000 minibatch
  steps, still cheaper than 300 full-batch ones).

Usage::

    python experiments/refine_ablation.py                       # steps, ViT/Fashion-MNIST
    python experiments/refine_ablation.py --study targets
    python experiments/refine_ablation.py --study main          # DeiT/USPS, ρ ∈ {0.1, 0.2, 0.35, 0.5}
    python experiments/refine_ablation.py --study batch         # ViT/Fashion-MNIST (--model deit: DeiT/USPS)
    python experiments/refine_ablation.py --quick               # CI: ~2 min on 2 cores

Writes ``<out>/refine_steps_<model>_<dataset>.json`` (or ``refine_targets_…``; + ``.csv``,
``.png``), resuming unit by unit like ``training_free.py``; verdicts are paired against ``bsd``
where it is run, else read the table.
"""

from __future__ import annotations

import json
import pathlib
import sys

import compression_study
import training_free
from refinement import Refinement, Setting

BASES = (Setting("bsd-warm"), Setting("prune"))
BSD_WARM, PRUNE = BASES
STEPS = (50, 100, 300, 1000)
STEP_METHODS = (*BASES, *(m.with_refinement(n) for m in BASES for n in STEPS))
TARGET_METHODS = (*BASES, *(m.with_refinement(300, target) for m in BASES for target in ("local", "consistent")),
                  # the default loop (minibatches of 512), at 300 and 1000 steps, consistent target
                  *(m.with_refinement(n, "consistent", 512) for n in (300, 1000) for m in BASES))

STEPS_VIT = dict(training_free.FULL_VIT, budgets=(0.5,), methods=STEP_METHODS)
STEPS_DEIT = dict(training_free.FULL, budgets=(0.5,), methods=STEP_METHODS)
MAIN_METHODS = (*BASES, Setting("auto"), *(m.with_refinement(300) for m in (*BASES, Setting("auto"))))
MAIN_DEIT = dict(training_free.FULL, budgets=(0.1, 0.2, 0.35, 0.5), methods=MAIN_METHODS)
MAIN_VIT = dict(training_free.FULL_VIT, budgets=(0.2, 0.35, 0.5), methods=MAIN_METHODS)
TARGETS_VIT = dict(STEPS_VIT, methods=TARGET_METHODS, order="front-to-back")
TARGETS_DEIT = dict(STEPS_DEIT, methods=TARGET_METHODS, order="front-to-back")
BATCH_METHODS = (*BASES, *(m.with_refinement(300, batch=b) for b in (None, 512, 256) for m in BASES),
                 # half the steps, and twice the learning rate (2e-3), with minibatches of 512
                 *(Setting(m.base, r) for r in (Refinement(150, batch=512), Refinement(150, batch=512, learning_rate=2e-3),
                                                Refinement(300, batch=512, learning_rate=2e-3)) for m in BASES))
BATCH_VIT = dict(STEPS_VIT, methods=(*BATCH_METHODS, *(m.with_refinement(1000, batch=512) for m in BASES)))
BATCH_DEIT = dict(STEPS_DEIT, methods=BATCH_METHODS)
QUICK = dict(training_free.QUICK, budgets=(0.2,), seeds=1, methods=(PRUNE, PRUNE.with_refinement(20), PRUNE.with_refinement(20, "consistent")),
             order="front-to-back")


#: What each study varies: the x axis of its plot.
VARIABLE = {"steps": "refinement steps (full batch, local target)", "targets": "refinement (target, steps, batch)",
            "batch": "refinement (steps, tokens per step, learning rate)"}


def _variant(setting: Setting, study: str) -> str:
    """The x-axis label of a setting's refinement (``"none"`` for the method as built)."""
    r = setting.refine
    if not r.steps:
        return "none" if study != "steps" else "0"
    if study == "steps":
        return str(r.steps)
    parts = [r.target] if study == "targets" else []
    parts += [f"{r.steps} steps", "full batch" if r.batch is None else f"batch {r.batch}"]
    if study == "batch":
        parts.append(f"lr {r.learning_rate or 1e-3:g}")
    return "\n".join(parts)


def _order(setting: Setting):
    r = setting.refine
    return (r.steps > 0, r.target, r.batch is not None, r.batch or 0, r.steps, r.learning_rate or 1e-3)


def plot_study(rows: list[dict], path: pathlib.Path, acc_original: float, params_original: int, title: str,
               study: str) -> None:
    """The refinement study's plot: accuracy (mean ± std over seeds) against what the study varies
    (steps; the target, steps and batch; the steps, batch and learning rate), one series per base
    method with its own colour and marker, the original model's accuracy as a dashed line, the
    legend below the axes (it covers no point) and room for every label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    settings = {r["method"]: Setting.parse(r["method"]) for r in ok}  # the rows name their settings
    bases = list(dict.fromkeys(settings[r["method"]].base for r in ok))
    labels = list(dict.fromkeys(_variant(settings[r["method"]], study)
                                for r in sorted(ok, key=lambda r: _order(settings[r["method"]]))))
    styles = [("tab:green", "o"), ("tab:red", "s"), ("tab:purple", "^"), ("tab:blue", "D"), ("tab:orange", "v")]
    width = max(6.4, 1.0 * len(labels) + 2)
    fig, ax = plt.subplots(figsize=(width, 4.6))
    for k, base in enumerate(bases):
        mine = {_variant(settings[r["method"]], study): r for r in ok if settings[r["method"]].base == base}
        xs = [i + (k - (len(bases) - 1) / 2) * 0.12 for i, lab in enumerate(labels) if lab in mine]
        got = [mine[lab] for lab in labels if lab in mine]
        colour, marker = styles[k % len(styles)]
        ax.errorbar(xs, [r["accuracy_mean"] for r in got], yerr=[r["accuracy_std"] for r in got], color=colour,
                    marker=marker, ms=6, capsize=3, lw=1.2, label=compression_study.method_name(Setting(base)))
    ax.axhline(acc_original, color="k", lw=0.8, ls="--", label=f"original ({params_original:,} parameters)")
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_xlim(-0.5, len(labels) - 0.5)
    ax.set_xlabel(VARIABLE[study])
    ax.set_ylabel("top-1 test accuracy (%)")
    ax.set_title(title, fontsize=9, wrap=True)
    ax.grid(alpha=0.3)
    fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncol=len(bases) + 1, fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def replot(path: pathlib.Path, study: str) -> None:
    """Redraw ``<path>.png`` from the committed ``<path>`` (a study's JSON), computing nothing."""
    result = json.loads(pathlib.Path(path).read_text())
    seeds = max((r.get("seeds") or 0) for r in result["rows"])
    kind, _, name = pathlib.Path(path).stem.removeprefix(f"refine_{study}_").partition("_")
    plot_study(result["rows"], pathlib.Path(path).with_suffix(".png"), result["accuracy_original"],
               result["params_original"], f"{kind} on {name}, training-free, ρ = "
               f"{', '.join(f'{b:g}' for b in sorted({r['reduction'] for r in result['rows']}))}: accuracy against "
               f"the refinement (mean ± std over {seeds} seeds, population std)", study)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    study = "steps"
    if "--study" in argv:
        i = argv.index("--study")
        study = argv[i + 1]
        del argv[i: i + 2]
    if "--replot" in argv:  # python experiments/refine_ablation.py --study batch --replot RESULT.json
        replot(pathlib.Path(argv[argv.index("--replot") + 1]), study)
        return 0
    plotter = None
    if study in VARIABLE:  # the study's own plot instead of accuracy against parameters
        def plotter(rows, path, acc, params, title):
            plot_study(rows, path, acc, params, title, study)
    presets = {"steps": (STEPS_VIT, STEPS_DEIT), "targets": (TARGETS_VIT, TARGETS_DEIT), "main": (MAIN_VIT, MAIN_DEIT),
               "batch": (BATCH_VIT, BATCH_DEIT)}
    if study not in presets:
        raise SystemExit(f"--study must be one of {sorted(presets)}, got {study!r}")
    vit, deit = presets[study]
    default = deit if study == "main" else vit
    return training_free.main(argv, presets={"deit": deit, "vit": vit, "quick": QUICK, "default": default},
                              stem=f"refine_{study}", doc=__doc__, script=f"refine_ablation.py --study {study}",
                              plotter=plotter)


if __name__ == "__main__":
    sys.exit(main())
