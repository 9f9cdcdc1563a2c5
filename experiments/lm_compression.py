"""B-spline decoupling on a character language model with gated (SwiGLU) MLPs.

The trained LM (``checkpoints/lm-pystdlib``: d = 128, 4 decoder blocks, SwiGLU MLPs 128 → 384 →
128 without biases; ``experiments/results/training_lm_pystdlib.json``) has every gated MLP
(``blocks.N.mlp``) replaced back to front by ``jb.compress_model`` at a target reduction ρ of the
*whole model's* parameters (the compressed model keeps at most ``(1 − ρ)·P``; ranks planned up
front, the same for every block), by four methods:

* ``bsd``: R-CMTF-BSD decoupling (cubic B-splines, ν = 4, λ = 0.25) of the structured gated
  Jacobian, ``S = max(128, 2r)`` sampled tokens per block;
* ``svd``: truncated SVD of the three kernels (gate, up, down);
* ``drone``: data-aware low rank of the three kernels from their real inputs;
* ``prune``: keep the hidden units with the largest gated activations and refit ``down``.

A seed sets the calibration windows (``calib_windows`` windows of ``context`` characters drawn
from the train split) and the solver key; runs with one seed are paired across methods. Every
unit (method, ρ, seed) gives two runs: **training-free** (test bits per character right after
the last replacement) and **fine-tuned** (then a short fine-tuning of the whole model with
``jaxbsd.training.train_lm``, the recipe in ``plan["finetune"]``, the same for every method).
Bits per character are measured on a fixed subset of the test modules: ``test_segments``
evenly spaced contiguous pieces, ``test_chars`` characters in all (recorded with their starts).

**Fit of one gated MLP against a plain one.** A second section decouples ONE MLP (the last
block's) at fixed ranks with the same solver and reports Error(J), Error(F) and the output error,
for the gated LM and for a control LM whose MLPs are ordinary two-layer GELU MLPs of the same
shape (:func:`build_lm`, ``mlp="plain"``), trained with the same recipe:
``checkpoints/lm-plain-pystdlib``, trained and cached on first use). A gated product
``a(g·x)·(u·x)`` is not a sum of univariate functions of single projections, so the decoupling
(a sum of r univariate functions of r projections) fits it worse at equal rank; the section
measures by how much, and its ``finding`` says it in numbers.

Usage::

    python experiments/lm_compression.py           # 3 ρ × 4 methods × 3 seeds, both settings
    python experiments/lm_compression.py --quick   # CI: a tiny LM trained in seconds, 1 ρ, 2 seeds

Writes ``<out>/lm_compression.json`` (every run, the summary rows, paired verdicts against bsd,
the fit comparison, command, provenance with the solver fingerprint, wall time), ``.csv`` and
``.png`` (test bpc against parameters, error bars = std over seeds); ``lm_compression_quick``
in quick mode. Resume: every (method, ρ, seed) unit and every fit unit is saved under
``<out>/state/<prefix>/protocol-<key>/<unit>/unit.json`` once finished and not recomputed.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import pathlib
import sys


import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxbsd as jb
from jaxbsd.compression.methods import DEFAULT_CONFIG
from jaxbsd.compression.surgery import get_submodule
from jaxbsd.data import load_text_dataset
from jaxbsd.models import LMConfig, build_model, config_for_dataset, count_params
from jaxbsd.models.layers import MLP
from jaxbsd.evaluation import evaluate_lm
from jaxbsd.checkpoint import load_checkpoint, save_checkpoint
from jaxbsd.training import TrainConfig, train_lm

from checkout import RESULTS, ROOT, enable_compilation_cache, rel_path
from compression_study import apply_overrides, method_name
from output import Timer, command_line, machine, read_json, write_json
from refinement import Setting
from units import protocol_key, resume_unit, save_infeasible, save_unit
from verdicts import mean_std, paired_verdict

METHODS = tuple(map(Setting, ("bsd", "svd", "drone", "prune")))
REFERENCE = "bsd"
SETTINGS = ("training-free", "fine-tuned")
TRAINING_JSON = RESULTS / "training_lm_pystdlib.json"

#: Fine-tuning after the last replacement, every method: Adam, constant lr 1e-4, 100 steps of
#: 16 windows of 128 characters (~205k characters, 5.5 % of one epoch); validation bpc on the
#: first ``val_chars`` validation characters (recorded, not used to select anything).
FINETUNE = dict(steps=100, lr=1e-4, batch_size=16, schedule="constant", weight_decay=0.0, eval_batch_size=64)

FULL = dict(
    checkpoint="checkpoints/lm-pystdlib", plain_checkpoint="checkpoints/lm-plain-pystdlib", tiny=None, limit=None,
    budgets=(0.1, 0.2, 0.35), methods=METHODS, seeds=3, blocks=None, calib_windows=32, test_chars=100_000,
    test_segments=20, val_chars=8192, max_iter=300, finetune=FINETUNE,
    fit=dict(ranks=(16, 64, 128), seeds=3),
)
#: CI: a tiny LM (d = 32, 2 blocks, MLP 96, context 32) and its plain twin, each trained for 150
#: steps on the first 200k characters of every split (seconds), then 1 ρ, 2 methods, 2 seeds,
#: 10 sweeps, 10 fine-tuning steps, and the fit comparison at rank 4.
QUICK = dict(
    FULL, checkpoint=None, plain_checkpoint=None, limit=200_000,
    tiny=dict(config=dict(context=32, dim=32, depth=2, num_heads=2, mlp_dim=96),
              recipe=dict(epochs=1, steps=150, lr=3e-3, batch_size=16, schedule="cosine", warmup_epochs=0.01,
                          weight_decay=0.1, eval_batch_size=64)),
    budgets=(0.2,), methods=(Setting("bsd"), Setting("prune")), seeds=2, calib_windows=8, test_chars=8192, test_segments=4,
    val_chars=1024, max_iter=10, finetune=dict(FINETUNE, steps=10), fit=dict(ranks=(4,), seeds=2),
)


# --------------------------------------------------------------------------- helpers (tested)


def calibration_windows(ids: np.ndarray, count: int, context: int, seed: int) -> np.ndarray:
    """``count`` windows of ``context`` consecutive ids of ``ids`` at random starts drawn with
    ``seed`` (``numpy.random.default_rng``): ``(N,) -> (count, context)`` int32, a model input.

    Raises:
      ValueError: ``count`` or ``context`` not a positive int, or ``ids`` shorter than ``context``.
    """
    ids = np.asarray(ids)
    for name, v in (("count", count), ("context", context)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if ids.ndim != 1 or len(ids) < context:
        raise ValueError(f"ids must be a 1-D stream of at least context = {context} ids, got shape {ids.shape}")
    starts = np.random.default_rng(seed).integers(0, len(ids) - context + 1, size=count)
    return ids[starts[:, None] + np.arange(context)[None, :]].astype(np.int32)


def test_subset(ids: np.ndarray, chars: int, segments: int) -> tuple[np.ndarray, list[int]]:
    """A fixed subset of a test stream: ``segments`` contiguous pieces of ``chars // segments``
    ids at evenly spaced starts (first at 0, last ending at the end), concatenated.

    Returns ``(subset ids, starts)``. The subset is the whole stream when it is no longer than
    ``chars``.

    Raises:
      ValueError: ``chars`` < 2 or ``segments`` not in ``[1, chars // 2]``.
    """
    ids = np.asarray(ids)
    if isinstance(chars, bool) or not isinstance(chars, (int, np.integer)) or chars < 2:
        raise ValueError(f"chars must be an int >= 2, got {chars!r}")
    if isinstance(segments, bool) or not isinstance(segments, (int, np.integer)) or not 1 <= segments <= chars // 2:
        raise ValueError(f"segments must be an int in [1, chars // 2 = {chars // 2}], got {segments!r}")
    if len(ids) <= chars:
        return ids, [0]
    piece = chars // segments
    starts = np.linspace(0, len(ids) - piece, segments).round().astype(int)
    return np.concatenate([ids[s:s + piece] for s in starts]), [int(s) for s in starts]


def bsd_rank(params_total: int, mlp_params: list[int], m: int, n: int, dof: int, reduction: float) -> int:
    """The rank ``jb.compress_model(reduction=ρ, allocation="uniform")`` can afford per MLP for a
    decoupling of MLPs of equal shape: ``r = ⌊(⌊(1 − ρ)P⌋ − (P − ΣP_mlp)) / (k (m + n + ν))⌋``
    (``k`` MLPs, ``r (m + n + ν)`` parameters each); used to set ``S = max(128, 2r)``.

    Raises:
      ValueError: ``reduction`` outside ``[0, 1)`` or a budget that affords no rank 1.
    """
    if not 0 <= reduction < 1:
        raise ValueError(f"reduction must lie in [0, 1), got {reduction!r}")
    budget = math.floor((1 - reduction) * params_total) - (params_total - sum(mlp_params))
    rank = budget // (len(mlp_params) * (m + n + dof))
    if rank < 1:
        raise ValueError(f"reduction {reduction}: the budget cannot be met by compressing the MLPs")
    return int(rank)


def runs_of(unit: dict) -> list[dict]:
    """The runs (one per setting) a finished unit records: method, ρ, seed, setting, status,
    test bpc, params, per-MLP rank and output error, seconds (compression, plus fine-tuning)."""
    base = {k: unit.get(k) for k in ("method", "reduction", "seed", "status", "params", "reduction_achieved",
                                     "ranks", "output_errors", "num_samples")}
    if unit["status"] != "ok":
        return [dict(base, setting=s, test_bpc=None, seconds=unit.get("seconds")) for s in SETTINGS]
    free, tuned = unit["settings"]["training-free"], unit["settings"]["fine-tuned"]
    return [dict(base, setting="training-free", test_bpc=free["test_bpc"], seconds=free["seconds"]),
            dict(base, setting="fine-tuned", test_bpc=tuned["test_bpc"], seconds=free["seconds"] + tuned["seconds"])]


def summarize(runs: list[dict], plan: dict) -> tuple[list[dict], dict]:
    """Rows per (setting, method, ρ): mean ± std of the test bpc over seeds, mean parameters;
    and per setting and ρ the paired verdict of every method against bsd ("holds": bsd's bpc is
    lower, paired t-test p < 0.05; ``mean_diff`` = method − bsd, in bits per character)."""
    rows, verdicts = [], {}
    methods = [m.name for m in plan["methods"]]
    for setting in SETTINGS:
        for reduction in plan["budgets"]:
            by = {m: {r["seed"]: r for r in runs if (r["setting"], r["method"], r["reduction"]) == (setting, m, reduction)}
                  for m in methods}
            vkey = f"{setting} {reduction!r}"
            verdicts[vkey] = {}
            for method in methods:
                ok = [r for r in by[method].values() if r["status"] == "ok"]
                row = {"setting": setting, "method": method, "name": method_name(method),
                       "reduction": reduction, "seeds": len(ok), "status": "ok" if ok else "infeasible"}
                if ok:
                    bpc = mean_std([r["test_bpc"] for r in ok])
                    errs = [e for r in ok for e in r["output_errors"].values() if e is not None]
                    row.update(bpc_mean=bpc[0], bpc_std=bpc[1], params_mean=float(np.mean([r["params"] for r in ok])),
                               reduction_achieved_mean=float(np.mean([r["reduction_achieved"] for r in ok])),
                               output_error_mean=float(np.mean(errs)) if errs else None)
                rows.append(row)
                if method == REFERENCE or REFERENCE not in by:
                    continue
                seeds = sorted(s for s in by[method] if s in by[REFERENCE] and by[method][s]["status"] == "ok"
                               and by[REFERENCE][s]["status"] == "ok")
                v = paired_verdict([by[method][s]["test_bpc"] for s in seeds],
                                          [by[REFERENCE][s]["test_bpc"] for s in seeds],
                                          better="holds", worse="does not hold")
                v["claim"] = f"B-spline has lower test bpc than {method_name(method)} ({setting}, ρ = {reduction})"
                verdicts[vkey][method] = v
                row["verdict_vs_bsd"] = v["verdict"] if v["n"] else None
    return rows, verdicts


def fit_summary(fits: list[dict]) -> tuple[list[dict], str]:
    """Rows per (MLP kind, rank): mean ± std of Error(J), Error(F) and the output error over
    seeds; and the finding: at each rank, the gated MLP's errors as multiples of the plain one's."""
    rows = []
    for kind in ("gated", "plain"):
        for rank in sorted({f["rank"] for f in fits}):
            sel = [f for f in fits if f["kind"] == kind and f["rank"] == rank]
            if not sel:
                continue
            row = {"kind": kind, "rank": rank, "seeds": len(sel), "params_mlp": sel[0]["params_mlp"],
                   "params_decoupled": sel[0]["params_decoupled"]}
            for key in ("error_J", "error_F", "output_error"):
                row[f"{key}_mean"], row[f"{key}_std"] = mean_std([f[key] for f in sel])
            rows.append(row)
    parts = []
    for rank in sorted({r["rank"] for r in rows}):
        g = next((r for r in rows if r["kind"] == "gated" and r["rank"] == rank), None)
        p = next((r for r in rows if r["kind"] == "plain" and r["rank"] == rank), None)
        if g is None or p is None:
            continue
        ratio = {k: g[f"{k}_mean"] / p[f"{k}_mean"] if p[f"{k}_mean"] else float("inf")
                 for k in ("error_J", "output_error")}
        parts.append(f"rank {rank}: Error(J) {g['error_J_mean']:.3g} (gated) vs {p['error_J_mean']:.3g} (plain GELU), "
                     f"{ratio['error_J']:.2g}x; output error {g['output_error_mean']:.3g} vs "
                     f"{p['output_error_mean']:.3g}, {ratio['output_error']:.2g}x")
    if not parts:
        return rows, "no paired fits"
    worse = all(g["error_J_mean"] > p["error_J_mean"] for g in rows if g["kind"] == "gated"
                for p in rows if p["kind"] == "plain" and p["rank"] == g["rank"])
    verdict = ("the gated product is harder to decouple at every rank: " if worse else
               "the gated product is not uniformly harder to decouple: ")
    return rows, verdict + "; ".join(parts) + " (mean over seeds, one MLP of the same shape, same solver)"


def contain_summary(fits: list[dict], contained: list[dict]) -> list[dict]:
    """Rows per rank of the plain twin's MLP: each fit method's output error (mean ± std over
    seeds), parameters and (``contain``) the sweeps kept; with the paired ratio of the contained
    decoupling's output error to pruning's (per seed, the largest)."""
    rows = []
    for rank in sorted({f["rank"] for f in contained}):
        runs = {m: {f["seed"]: f for f in [*fits, *contained] if f["kind"] == "plain" and f["rank"] == rank
                    and f.get("method", "bsd") == m} for m in FIT_METHODS}
        row = {"rank": rank, "params_mlp": next(iter(runs["prune"].values()))["params_mlp"]}
        for method, by_seed in runs.items():
            if by_seed:
                row[method] = {"params": next(iter(by_seed.values()))["params_decoupled"],
                               "seeds": len(by_seed), **dict(zip(("output_error_mean", "output_error_std"),
                                                               mean_std([f["output_error"] for f in by_seed.values()])))}
        seeds = set(runs["contain"]) & set(runs["prune"])
        row["worst_ratio"] = max((runs["contain"][s]["output_error"] / runs["prune"][s]["output_error"] for s in seeds),
                                 default=None)
        row["sweeps_kept"] = sorted({runs["contain"][s].get("sweep_kept") for s in runs["contain"]} - {None})
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- models


def recipe_of_checkpoint() -> TrainConfig:
    """The training recipe of ``checkpoints/lm-pystdlib``, as recorded in its result file."""
    return TrainConfig(**read_json(TRAINING_JSON)["train_config"])


def build_lm(config: LMConfig, mlp: str, seed: int = 0):
    """An untrained LM of ``config`` whose MLPs are ``"gated"`` (the model's own SwiGLU) or
    ``"plain"``: every ``blocks.N.mlp`` replaced by a two-layer GELU MLP of the same shape,
    ``fc2(gelu(fc1(x)))`` with biases (:class:`jaxbsd.models.layers.MLP`, ``dim → mlp_dim → dim``).

    (Surgery rather than a config option: the LM's config and its recorded checkpoints stay as
    they are; a plain checkpoint loads with ``load_checkpoint(path, model=build_lm(config, "plain"))``.)
    """
    if mlp not in ("gated", "plain"):
        raise ValueError(f"mlp must be 'gated' or 'plain', got {mlp!r}")
    model = build_model("lm", config, seed=seed)
    if mlp == "plain":
        rngs = nnx.Rngs(seed + 2)
        for block in model.blocks:
            block.mlp = MLP(config.dim, config.mlp_dim, activation="gelu", rngs=rngs)
    return model


def load_lm(path: pathlib.Path, mlp: str):
    """The LM saved at ``path`` by :func:`load_or_train_lm` (``mlp`` as there)."""
    if mlp == "gated":
        return load_checkpoint(path)[0]
    from jaxbsd.checkpoint import read_checkpoint_header

    config = LMConfig(**read_checkpoint_header(path)["config"])
    return load_checkpoint(path, model=build_lm(config, mlp))[0]


def load_or_train_lm(path: pathlib.Path, config: LMConfig, mlp: str, recipe: TrainConfig, dataset, log) -> tuple:
    """The LM at ``path``, else one of ``config`` with ``mlp`` MLPs (:func:`build_lm`) trained
    with ``recipe`` (``train_lm``) and saved there. Returns ``(model, info)``."""
    if path.exists():
        model = load_lm(path, mlp)
        return model, {"checkpoint": rel_path(path), "trained_now": False, "mlp": mlp}
    log(f"training {rel_path(path)} ({mlp} MLPs): {recipe}")
    model = build_lm(config, mlp, seed=recipe.seed)
    timer = Timer()
    history = train_lm(model, dataset, recipe, progress=False)
    save_checkpoint(path, model, {"dataset": dataset.name, "train": recipe.to_dict(), "history": history, "mlp": mlp,
                                  "written_by": "experiments/lm_compression.py"})
    log(f"  trained in {timer():.0f} s: validation {history[-1]['val_bpc']:.4f} bpc")
    return model, {"checkpoint": rel_path(path), "trained_now": True, "mlp": mlp, "recipe": recipe.to_dict(),
                   "validation_bpc": history[-1]["val_bpc"], "seconds": timer()}


def models_for(plan: dict, dataset, out: pathlib.Path, log) -> tuple[dict, dict]:
    """The gated LM and its plain-MLP twin for ``plan``: ``({"gated": path, "plain": path}, info)``."""
    if plan["tiny"]:
        recipe = TrainConfig(**plan["tiny"]["recipe"])
        base = config_for_dataset("lm", dataset, **plan["tiny"]["config"])
        paths = {"gated": out / "checkpoints" / "lm-quick", "plain": out / "checkpoints" / "lm-plain-quick"}
    else:
        recipe = recipe_of_checkpoint()
        base = config_for_dataset("lm", dataset)
        paths = {"gated": ROOT / plan["checkpoint"], "plain": ROOT / plan["plain_checkpoint"]}
    info = {kind: load_or_train_lm(paths[kind], base, kind, recipe, dataset, log)[1] for kind in paths}
    return paths, info


# --------------------------------------------------------------------------- units


def samples_for(params_total: int, mlp_params: list[int], config, reduction: float, plan: dict) -> int:
    """S = max(128, 2r) for the decoupling's rank at ``reduction`` (:func:`bsd_rank`; the same S for
    every method), at most the calibration's tokens."""
    try:
        rank = bsd_rank(params_total, mlp_params, config.dim, config.dim, 4, reduction)
    except ValueError:
        rank = 1  # infeasible: compress_model says so in the unit
    return min(max(128, 2 * rank), plan["calib_windows"] * config.context)


def refine_of(setting: Setting) -> tuple[str, jb.Refine | None]:
    """``(base method, its Refine or None)`` of a study's method setting."""
    r = setting.refine
    return setting.base, (jb.Refine(steps=r.steps, target=r.target, batch_size=r.batch,
                                    learning_rate=r.learning_rate or jb.Refine.learning_rate) if r.steps else None)


def solver_config(plan: dict) -> jb.CMTFConfig:
    """The decoupling's template: cubic B-splines, ν = 4, λ = 0.25, ``plan["max_iter"]`` sweeps."""
    return DEFAULT_CONFIG.replace(lam=0.25, max_iter=plan["max_iter"])


def paper_basis(base: str) -> dict:
    """The options that keep ``bsd`` and ``auto``'s decoupling in the paper's basis on every MLP
    (``contain=False``: this study measures the paper's method; ``compress_model``'s own
    ``"bsd"`` solves a two-layer MLP as the decoupling that contains its pruned form)."""
    return {"contain": False} if base in ("bsd", "auto") else {}


def _method(value: str) -> Setting:
    """argparse type of ``--methods``: the :class:`Setting` a name stands for, its base one of
    :data:`METHODS` (``bsd-ref300``: ``bsd`` refined)."""
    setting = Setting.parse(value)
    if Setting(setting.base) not in METHODS:
        raise argparse.ArgumentTypeError(f"invalid method {value!r} (choose from {', '.join(map(str, METHODS))}, "
                                         "each optionally with -ref<n>)")
    return setting


def run_unit(setting: Setting, reduction: float, seed: int, *, ctx: dict, plan: dict, log) -> dict:
    """One (setting, ρ, seed) unit: compress every listed MLP back to front, test bpc; fine-tune,
    test bpc again. Its saved record if it finished before under the same tag."""
    method = setting.name
    name = f"{method}-rho{int(round(1000 * reduction)):04d}-seed{seed}"
    state = ctx["protocol_dir"] / name
    finetune = TrainConfig(**plan["finetune"], seed=seed)
    base, refine = refine_of(setting)
    # the settings added with minibatches are left out of the tag at their full-batch values, so the
    # units saved before they existed keep their tags
    refine_tag = refine and {k: v for k, v in refine.to_dict().items()
                             if k not in ("batch_size", "eval_every") or v is not None}
    tag = json.dumps({"method": method, "reduction": reduction, "seed": seed, "max_iter": plan["max_iter"],
                      "num_samples": ctx["num_samples"][reduction], "finetune": finetune.to_dict(),
                      **({"refine": refine_tag} if refine else {})}, sort_keys=True)
    if (done := resume_unit(state, tag, name, log)) is not None:
        return done
    timer = Timer()
    model = load_checkpoint(ctx["model_path"])[0]
    record = {"method": method, "reduction": reduction, "seed": seed, "params_original": ctx["params_original"],
              "num_samples": ctx["num_samples"][reduction], "machine": machine()}
    calib = jnp.asarray(calibration_windows(ctx["data"].train, plan["calib_windows"], ctx["context"], seed))
    try:
        model, report = jb.compress_model(model, calib, mlps=ctx["mlps"], reduction=reduction, method=jb.get_method(base, config=solver_config(plan) if base in ("bsd", "auto") else None, **paper_basis(base), num_samples=ctx["num_samples"][reduction]), key=jax.random.key(seed), refine=refine)
    except ValueError as err:
        return save_infeasible(err, record, state / "unit.json", tag, name, timer(), log)
    free_bpc = evaluate_lm(model, ctx["test_ids"])
    seconds_free = timer()
    tune_timer = Timer()
    history = train_lm(model, ctx["finetune_data"], finetune, progress=False)
    tuned_bpc = evaluate_lm(model, ctx["test_ids"])
    record.update(
        status="ok", params=report.params_after, reduction_achieved=report.reduction,
        ranks={r.path: r.rank for r in report.mlps}, output_errors={r.path: r.output_error for r in report.mlps},
        mlps=[{k: getattr(r, k) for k in ("path", "rank", "params_after", "error_J", "error_F", "output_error",
                                          "jacobian", "spec", "seconds", "refine")} for r in report.mlps],
        settings={"training-free": {"test_bpc": free_bpc, "seconds": seconds_free},
                  "fine-tuned": {"test_bpc": tuned_bpc, "seconds": tune_timer(),
                                 "train_bpc": history[-1]["train_bpc"], "val_bpc": history[-1]["val_bpc"]}},
        seconds=timer(),
    )
    save_unit(state / "unit.json", tag, record)
    log(f"  {name}: {free_bpc:.4f} bpc training-free, {tuned_bpc:.4f} after fine-tuning, {record['params']} "
        f"parameters ({100 * report.reduction:.2f} % fewer), ranks {sorted(set(record['ranks'].values()))}, "
        f"{timer():.0f} s")
    return record


#: The fit section's methods: the paper's decoupling (``bsd``), and on the plain twin, where a pruned MLP
#: can be written as a decoupling, ``compress_model``'s ``"bsd"`` (``contain``: it contains pruning) and ``prune``.
FIT_METHODS = {"bsd": "the paper's decoupling", "contain": "the decoupling that contains pruning", "prune": "pruning"}


def fit_method(method: str, plan: dict, samples: int):
    """The method object of a fit unit (:data:`FIT_METHODS`)."""
    if method == "prune":
        return jb.get_method("prune")
    return jb.get_method("bsd", config=solver_config(plan), contain=method == "contain", num_samples=samples)


def fit_unit(kind: str, rank: int, seed: int, *, ctx: dict, plan: dict, log, method: str = "bsd") -> dict:
    """Compress one MLP (``ctx["fit_mlp"]``) of the ``kind`` LM at ``rank`` with ``method`` (a key of
    :data:`FIT_METHODS`; the same ``rank``: the same parameters for ``contain`` and ``prune``); its errors."""
    name = f"fit-{kind}-r{rank}-seed{seed}" + ("" if method == "bsd" else f"-{method}")
    state = ctx["protocol_dir"] / name
    samples = min(max(128, 2 * rank), plan["calib_windows"] * ctx["context"])
    identity = {"kind": kind, "rank": rank, "seed": seed, "max_iter": plan["max_iter"], "num_samples": samples}
    tag = json.dumps(identity if method == "bsd" else {**identity, "method": method}, sort_keys=True)
    if (done := resume_unit(state, tag, name, log)) is not None:
        return done
    timer = Timer()
    model = load_lm(ctx["paths"][kind], kind)
    calib = jnp.asarray(calibration_windows(ctx["data"].train, plan["calib_windows"], ctx["context"], seed))
    params_mlp = count_params(get_submodule(model, ctx["fit_mlp"]))
    _, report = jb.compress_model(model, calib, mlps=[ctx["fit_mlp"]], ranks={ctx["fit_mlp"]: rank},
                                  method=fit_method(method, plan, samples), key=jax.random.key(seed),
                                  refine=None)  # the fit of the replacement itself
    r = report.mlps[0]
    record = {"kind": kind, "rank": rank, "seed": seed, "mlp": ctx["fit_mlp"], "num_samples": samples,
              "params_mlp": params_mlp, "params_decoupled": r.params_after, "error_J": r.error_J, "error_F": r.error_F,
              "output_error": r.output_error, "jacobian": r.jacobian, "spec": r.spec, "seconds": timer(),
              "machine": machine(), **({} if method == "bsd" else {"method": method, "sweep_kept": r.sweep_kept})}
    save_unit(state / "unit.json", tag, record)
    log(f"  {name}: Error(J) {r.error_J:.4g}, Error(F) {r.error_F:.4g}, output error {r.output_error:.4g} "
        f"({r.jacobian} Jacobian), {timer():.0f} s")
    return record


# --------------------------------------------------------------------------- outputs


def format_table(rows: list[dict], bpc_original: float, params_original: int) -> str:
    lines = [f"original: {bpc_original:.4f} bpc, {params_original} parameters",
             f"{'setting':<15}{'method':<11}{'ρ':>6}{'test bpc (mean ± std)':>24}{'params':>10}{'out. err':>10}"
             f"{'seeds':>6}   B-spline lower bpc"]
    for r in rows:
        head = f"{r['setting']:<15}{r['name']:<11}{r['reduction']:>6.2f}"
        if r["status"] != "ok":
            lines.append(head + f"{'infeasible':>24}")
            continue
        err = f"{r['output_error_mean']:.3g}" if r["output_error_mean"] is not None else "—"
        lines.append(head + f"{r['bpc_mean']:>15.4f} ± {r['bpc_std']:<6.4f}{r['params_mean']:>10.0f}{err:>10}"
                     f"{r['seeds']:>6}   {r.get('verdict_vs_bsd') or ''}")
    return "\n".join(lines)


def write_csv(rows: list[dict], path: pathlib.Path) -> None:
    """The summary rows as CSV: one line per (setting, method, ρ)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["setting", "method", "reduction_target", "bpc_mean", "bpc_std", "params_mean", "output_error_mean",
                    "seeds", "verdict_vs_bsd"])
        for r in rows:
            ok = r["status"] == "ok"
            w.writerow([r["setting"], r["method"], r["reduction"],
                        *([f"{r['bpc_mean']:.4f}", f"{r['bpc_std']:.4f}", f"{r['params_mean']:.0f}",
                           "" if r["output_error_mean"] is None else f"{r['output_error_mean']:.4g}"]
                          if ok else ["infeasible", "", "", ""]), r["seeds"], r.get("verdict_vs_bsd") or ""])


def plot(rows: list[dict], path: pathlib.Path, bpc_original: float, params_original: int, title: str) -> None:
    """Test bpc against parameters, one panel per setting, error bars = std over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"bsd": "tab:green", "svd": "tab:blue", "drone": "tab:orange", "prune": "tab:red"}
    fig, axes = plt.subplots(1, len(SETTINGS), figsize=(10, 4), sharey=True)
    for ax, setting in zip(axes, SETTINGS):
        for method in dict.fromkeys(r["method"] for r in rows):
            ok = sorted((r for r in rows if (r["setting"], r["method"]) == (setting, method) and r["status"] == "ok"),
                        key=lambda r: r["params_mean"])
            if ok:
                ax.errorbar([r["params_mean"] for r in ok], [r["bpc_mean"] for r in ok],
                            yerr=[r["bpc_std"] for r in ok], color=colors.get(method), marker="o", ms=4, capsize=3,
                            lw=1, label=method_name(method))
        ax.axhline(bpc_original, color="k", lw=0.8, ls="--", label=f"original ({params_original:,} params)")
        ax.set_title(setting, fontsize=9)
        ax.set_xlabel("parameters of the compressed model")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test bits per character")
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------- study


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI size: a tiny LM trained in seconds, 1 ρ, 2 seeds")
    parser.add_argument("--budgets", type=float, nargs="+", default=None, help="target reductions ρ (full: 0.1 0.2 0.35)")
    parser.add_argument("--methods", nargs="+", type=_method, default=None,
                        help="methods (full: all four); any may end in -ref<n> (refined, n steps)")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per (method, ρ) and per fit (full: 3)")
    parser.add_argument("--max-iter", type=int, default=None, help="R-CMTF sweeps per MLP (full: 300)")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args(argv)
    plan = apply_overrides(QUICK if args.quick else FULL, args, ("budgets", "methods", "seeds", "max_iter"))
    if args.seeds is not None:
        plan["fit"] = dict(plan["fit"], seeds=args.seeds)
    prefix = "lm_compression_quick" if args.quick else "lm_compression"
    args.out.mkdir(parents=True, exist_ok=True)
    command = command_line("lm_compression.py", argv)
    enable_compilation_cache()
    timer = Timer()

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    data = load_text_dataset("pystdlib", limit=plan["limit"])
    paths, model_info = models_for(plan, data, args.out, log)
    model = load_checkpoint(paths["gated"])[0]
    context = model.config.context
    test_ids, test_starts = test_subset(data.test, plan["test_chars"], plan["test_segments"])
    bpc_original = evaluate_lm(model, test_ids)
    model_info["plain"]["test_bpc"] = evaluate_lm(load_lm(paths["plain"], "plain"), test_ids)  # same subset
    params_original = count_params(model)
    order = list(range(model.config.depth))[::-1]
    if plan["blocks"]:
        order = order[: plan["blocks"]]
    mlps = [f"blocks.{i}.mlp" for i in order]
    mlp_params = [count_params(model.blocks[i].mlp) for i in order]
    num_samples = {rho: samples_for(params_original, mlp_params, model.config, rho, plan) for rho in plan["budgets"]}
    log(f"lm: {params_original} parameters ({sum(mlp_params)} in the compressed MLPs {mlps}), test "
        f"{bpc_original:.4f} bpc on {len(test_ids)} characters (plain-MLP twin: {model_info['plain']['test_bpc']:.4f}); "
        f"S per ρ {num_samples}")
    protocol = {"checkpoint": model_info["gated"]["checkpoint"], "plain": model_info["plain"]["checkpoint"],
                "limit": plan["limit"], "mlps": mlps, "calib_windows": plan["calib_windows"],
                "test": [plan["test_chars"], plan["test_segments"]], "val_chars": plan["val_chars"]}
    key = protocol_key(protocol)
    ctx = {"protocol_dir": args.out / "state" / prefix / f"protocol-{key}", "model_path": paths["gated"],
           "paths": paths, "data": data, "context": context, "mlps": mlps, "num_samples": num_samples,
           "params_original": params_original, "test_ids": test_ids, "fit_mlp": mlps[0],
           "finetune_data": dataclasses.replace(data, validation=data.validation[: plan["val_chars"]])}
    units = [run_unit(setting, rho, seed, ctx=ctx, plan=plan, log=log)
             for rho in plan["budgets"] for setting in plan["methods"] for seed in range(plan["seeds"])]
    runs = [run for u in units for run in runs_of(u)]
    rows, verdicts = summarize(runs, plan)
    fits = [fit_unit(kind, rank, seed, ctx=ctx, plan=plan, log=log)
            for kind in ("gated", "plain") for rank in plan["fit"]["ranks"] for seed in range(plan["fit"]["seeds"])]
    fit_rows, finding = fit_summary(fits)
    # Where containment applies (the plain twin's two-layer GELU MLP): compress_model's "bsd" and pruning.
    contained = [fit_unit("plain", rank, seed, ctx=ctx, plan=plan, log=log, method=method)
                 for method in ("contain", "prune") for rank in plan["fit"]["ranks"]
                 for seed in range(plan["fit"]["seeds"])]
    table = format_table(rows, bpc_original, params_original)
    print(table)
    print(finding)
    payload = {
        "command": command, "mode": "quick" if args.quick else "full",
        "plan": {k: list(v) if isinstance(v, tuple) else v for k, v in plan.items()},
        "protocol": (f"character LM on pystdlib; every method compresses the gated MLPs {mlps} back to front with "
                     "jb.compress_model under the budget rule params <= (1 - rho) * P (P = all nnx.Param scalars; "
                     f"uniform ranks planned up front) from {plan['calib_windows']} calibration windows of {context} "
                     "characters drawn from the train split per seed; S = max(128, 2r) tokens (r: the decoupling's "
                     "rank at that rho), the same S for every method; bsd: cubic B-splines, nu = 4, lambda = 0.25, "
                     f"{plan['max_iter']} sweeps. training-free: test bpc right after the last replacement; "
                     f"fine-tuned: then train_lm for {plan['finetune']['steps']} steps (Adam, lr "
                     f"{plan['finetune']['lr']}, {plan['finetune']['schedule']}, batch {plan['finetune']['batch_size']} "
                     f"windows of {context}, seed = the unit's seed). A seed sets the calibration windows, the "
                     "solver key and the fine-tuning order."),
        "protocol_key": key,
        "test_subset": {"characters": int(len(test_ids)), "segments": plan["test_segments"], "starts": test_starts,
                        "of": int(len(data.test))},
        "finetune_recipe": {**TrainConfig(**plan["finetune"]).to_dict(), "seed": "the unit's seed",
                            "validation_characters": plan["val_chars"]},
        "verdict_rule": ("per setting and rho, paired over seeds against bsd: 'holds' if bsd's mean test bpc is lower "
                         "and the paired t-test gives p < 0.05, 'does not hold' if higher with p < 0.05, else 'within "
                         "noise'; mean_diff = method - bsd (bits per character); the sign test is reported beside it"),
        "model": model_info["gated"], "plain_model": model_info["plain"], "bpc_original": bpc_original,
        "params_original": params_original, "context": context, "mlps": mlps, "num_samples": {repr(k): v for k, v in num_samples.items()},
        "rows": rows, "verdicts": verdicts, "table": table,
        "fit": {"mlp": ctx["fit_mlp"], "ranks": list(plan["fit"]["ranks"]), "seeds": plan["fit"]["seeds"],
                "rows": fit_rows, "finding": finding, "runs": fits,
                "contain": {"rows": contain_summary(fits, contained), "runs": contained},
                "what": ("one MLP decoupled at fixed ranks (same solver, S = max(128, 2r) tokens from the same "
                         "calibration windows) in the gated LM and in a plain-GELU-MLP LM of the same shape trained "
                         "with the same recipe; errors from the compress report: Error(J), Error(F) on the S "
                         "samples, output error on the calibration tokens")},
        "machines": sorted({u["machine"] for u in [*units, *fits, *contained] if u.get("machine")}),
        "runs": runs, "units": units, "wall_seconds": timer(),
        # each unit's own time once (a fine-tuned run's seconds include its training-free part)
        "run_seconds_total": sum(u.get("seconds") or 0 for u in [*units, *fits, *contained]),
    }
    write_json(args.out / f"{prefix}.json", payload)
    write_csv(rows, args.out / f"{prefix}.csv")
    plot(rows, args.out / f"{prefix}.png", bpc_original, params_original,
         f"character LM (pystdlib), gated MLPs compressed back to front: test bpc against parameters "
         f"(mean ± std over {plan['seeds']} seeds)")
    print(f"wrote {args.out / (prefix + '.json')}, .csv and .png ({timer():.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
