"""Ablation on one transformer block (paper §6.3, Figures ablation_acc/Jac/F, compression_ablation).

Block 1 (index 0) of the paper's ViT (embedding 64, MLP 256, 8 heads, depth 3) is decoupled on
Fashion-MNIST and on MNIST (the real 10k test split of MNIST, split 80/20 by ``load_dataset``),
with

* λ ∈ {1e-6, 0.01, 0.25}, rank r ∈ {32, 48, 64, 82, 98, 114};
* (R-)CMTF-PD with polynomial degree d ∈ {3, 4, 5, 6} and (R-)CMTF-BSD with ν ∈ {4, 5, 6, 7}
  and spline degree d ∈ {1, 2, 3} (so every internal function has 4–7 coefficients);
* the robust solver (normalization + Tikhonov, ``R-CMTF``) and the plain one
  (``CMTFConfig(robust=False)``, ``CMTF``);
* 5 runs per configuration: 5 random restarts of one solve from the same key; each restart is
  reported as its own run (``res.restart_model(k)``).

Every run shares one Jacobian: S = 128 MLP input tokens drawn from 256 random training images,
the structured Jacobian ``jb.solver.jacobians.mlp_jacobian`` (never materialized) and ``F = mlp(X)``,
all in float64. A run's model replaces block 0's MLP (``DecoupledMLP.from_decoupled``, cast to
the network's float32) and the ViT's test accuracy is measured **without fine-tuning**;
Error(𝒥) and Error(F) are the solver's (``res.restarts.error_J/F``), savings are those of the
MLP, ``SP = 100 (1 − P_BSD / P_FC)`` with the paper's ``P_FC = 2 δ m²`` (biases not counted;
``savings_with_bias`` counts them).

Budget (2 shared CPU cores). The full grid is 2 data sets × 3 λ × 6 ranks × 16 bases × 2 variants
= 1152 solves of 5 restarts. To fit, the full mode uses ``--max-iter 100`` sweeps per restart
(the solver keeps each restart's best iterate; Error(𝒥) is within a few per cent of its
300-sweep value after 100 sweeps) and accuracy on 2000 test images (all of MNIST's held-out
2000; a fixed random 2000 of Fashion-MNIST's 10,000). The three λ of a configuration run in one
compiled program (see :func:`solve_lambdas`): 192 programs, cached on disk, so the second
data set and reruns do not compile again. Measured: see ``wall_seconds`` in the JSON; run one
data set per process (``--dataset mnist``) to keep each under an hour. Finished configurations
are appended to ``<out>/state/`` and a rerun of the same command resumes after them.

Usage::

    python experiments/ablation.py --dataset mnist           # full grid, one data set
    python experiments/ablation.py --dataset fashion-mnist
    python experiments/ablation.py --quick                    # CI: 2 λ, rank 32, 3 bases, both sets
    python experiments/ablation.py --smoke                    # tests: the smallest grid

Writes ``<out>/ablation_<dataset>.json`` (every run, per-cell means and status counts, the
command) and ``<out>/ablation_<dataset>_{accuracy,error_J,error_F,savings}.png`` (``ablation_quick_*``
and ``ablation_smoke_*`` for the small modes). Heatmaps are laid out like the paper's figures: a
row per (variant, λ), columns PD, BSD d=1, d=2, d=3; y-axis degree (PD) or ν (BSD), x-axis rank;
each cell is the mean over the runs.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import pathlib
import sys
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jaxbsd as jb
from jaxbsd.compression.blockwise import sample_tokens
from jaxbsd.data import load_dataset
from jaxbsd.solver.fingerprint import solver_fingerprint
from jaxbsd.models import count_params
from jaxbsd.models.decoupled_mlp import DecoupledMLP
from jaxbsd.models.layers import ACTIVATION_DERIVATIVES, ACTIVATIONS
from jaxbsd.evaluation import evaluate

from checkout import RESULTS, enable_compilation_cache
from output import Timer, command_line, jsonable, write_json
from trained import load_or_train, subset

jax.config.update("jax_enable_x64", True)

DATASETS = ("fashion-mnist", "mnist")
COLUMNS = ("PD", "BSD d=1", "BSD d=2", "BSD d=3")
VARIANTS = {"CMTF": False, "R-CMTF": True}  # name -> robust
METRICS = ("accuracy", "error_J", "error_F", "savings")
STATUS_NAMES = {int(s): s.name.lower() for s in jb.Status}

PAPER = {
    "model": "ViT on MNIST, 97.57 % test accuracy (paper Table ViT_details)",
    "findings": [
        "non-robust CMTF-PD: consistently poor accuracy at every setting",
        "non-robust CMTF-BSD: better than PD, especially at λ = 0.25, but a numerical issue at r = 64 "
        "and unstable results at λ = 1e-6",
        "robust R-CMTF-PD and R-CMTF-BSD: stable; best and comparable at λ = 0.25",
        "robust R-CMTF-BSD at λ = 1e-6 collapses (μ_c, μ_W overpower the F term): Error(F) high, Error(J) low",
        "savings vary mostly with the rank; degree/ν change them only slightly",
    ],
}

FULL = dict(lams=(1e-6, 0.01, 0.25), ranks=(32, 48, 64, 82, 98, 114), pd=(3, 4, 5, 6), dofs=(4, 5, 6, 7),
            spline_degrees=(1, 2, 3), restarts=5, max_iter=100, eval_images=2000, datasets=DATASETS)
QUICK = dict(lams=(1e-6, 0.25), ranks=(32,), pd=(3,), dofs=(4,), spline_degrees=(1, 3), restarts=3,
             max_iter=30, eval_images=500, datasets=DATASETS)
SMOKE = dict(lams=(1e-6, 0.25), ranks=(16,), pd=(3,), dofs=(4,), spline_degrees=(1,), restarts=2,
             max_iter=8, eval_images=200, datasets=("fashion-mnist",))


@functools.partial(jax.jit, static_argnames="restarts")
def _solve_lambdas(key, problem, lams, config, restarts):
    keys = jax.random.split(key, restarts)  # the keys decouple(key=key, restarts=...) uses

    def per_lam(lam):
        cfg = config.replace(lam=lam)
        return jax.vmap(lambda k: jb.solver.solve(k, problem, cfg))(keys)

    return jax.vmap(per_lam)(lams)


def solve_lambdas(jac, F, X, config: jb.CMTFConfig, lams: Sequence[float], *, key: jax.Array,
                  restarts: int) -> list[jb.DecouplingResult]:
    """``[decouple(jac, F, X, config.replace(lam=λ), key=key, restarts=restarts) for λ in lams]``,
    as one compiled program: λ is a traced leaf of the config, so the ablation compiles one
    program per (rank, basis, variant), vmapped over λ and over the restarts.

    Each restart uses the same key and the same :func:`jaxbsd.solve` as ``decouple``; the best
    restart is picked by :func:`jaxbsd.select_best`, as ``decouple`` does, so
    ``res.restart_model(k)``, ``res.restarts.error_J``, ``res.model`` mean what they mean there.
    """
    problem = jb.solver.problem(jac, F, X)
    lam_arr = jnp.asarray(np.asarray(lams, dtype=np.float64), dtype=problem.F.dtype)
    runs = _solve_lambdas(key, problem, lam_arr, config, restarts)
    return [jb.solver.select_best(jax.tree_util.tree_map(lambda x: x[i], runs), config.replace(lam=float(lam)))
            for i, lam in enumerate(lams)]


def bases(pd_degrees, dofs, spline_degrees) -> list[tuple[str, int, jb.Basis]]:
    """``(column, y value, basis)``: PD rows are degrees, BSD rows are ν."""
    out = [("PD", d, jb.Polynomial(d)) for d in pd_degrees]
    for d in spline_degrees:
        out += [(f"BSD d={d}", nu, jb.BSpline(d, nu)) for nu in dofs]
    return out


# --------------------------------------------------------------------------- the problem


def block0_problem(model, dataset, num_samples: int, capture_images: int, seed: int):
    """``(X, jac, F)`` of block 0's MLP in float64, at S tokens of random training images."""
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(dataset.train_images.shape[0], capture_images, replace=False))
    images = jnp.asarray(dataset.train_images[idx])
    X = sample_tokens(model, images, 0, num_samples, jax.random.key(seed)).astype(jnp.float64)
    mlp = model.blocks[0].mlp
    f64 = lambda a: jnp.asarray(a[...], jnp.float64)  # noqa: E731
    V0, b0 = f64(mlp.fc1.kernel).T, f64(mlp.fc1.bias)
    V1, b1 = f64(mlp.fc2.kernel).T, f64(mlp.fc2.bias)
    jac = jb.solver.jacobians.mlp_jacobian(X, V0, b0, V1, ACTIVATION_DERIVATIVES[mlp.activation])
    F = ACTIVATIONS[mlp.activation](X @ V0.T + b0[None, :]) @ V1.T + b1[None, :]
    return X, jac, F


# --------------------------------------------------------------------------- fast accuracy


@nnx.jit
def _block0_residual(model, images):
    """State after block 0's attention branch, ``(B, T, m)`` (the MLP's residual input)."""
    return model.blocks[0].attention_residual(model.embed(images))


@nnx.jit
def _correct_from_residual(model, x, labels):
    """Correct predictions of the ViT given block 0's post-attention state ``x``.

    Same as ``model(images)`` in eval mode (stochastic depth off), but the embedding and
    block 0's attention (which compression does not touch) are computed once per data set.
    """
    block = model.blocks[0]
    x = x + block.mlp(block.norm2(x))
    for b in model.blocks[1:]:
        x = b(x)
    logits = model.head(model.norm(x)[:, 0])
    return jnp.sum(jnp.argmax(logits, axis=-1) == labels), jnp.all(jnp.isfinite(logits))


class FastAccuracy:
    """Test accuracy of the ViT with block 0's MLP replaced, reusing the untouched front part."""

    def __init__(self, model, images, labels, batch: int = 1000):
        model.eval()
        self.model = model
        self.batch = min(batch, images.shape[0])
        n = images.shape[0] - images.shape[0] % self.batch  # whole batches: one compilation
        if n == 0:
            raise ValueError(f"need at least {self.batch} evaluation images")
        self.n = n
        self.x = [_block0_residual(model, jnp.asarray(images[i:i + self.batch])) for i in range(0, n, self.batch)]
        self.y = [jnp.asarray(labels[i:i + self.batch]) for i in range(0, n, self.batch)]

    def __call__(self, mlp) -> tuple[float, bool]:
        old = self.model.blocks[0].mlp
        self.model.blocks[0].mlp = mlp
        try:
            out = [_correct_from_residual(self.model, x, y) for x, y in zip(self.x, self.y)]
        finally:
            self.model.blocks[0].mlp = old
        correct = sum(int(c) for c, _ in out)
        return correct / self.n, all(bool(f) for _, f in out)


# --------------------------------------------------------------------------- one data set


def protocol_key(protocol: dict) -> str:
    return hashlib.sha256(json.dumps(protocol, sort_keys=True).encode()).hexdigest()[:16]


def run_dataset(name: str, grid: dict, args, log) -> dict:
    timer = Timer()
    dataset = load_dataset(name)
    model, source = load_or_train(
        "vit", name, checkpoint=args.checkpoint if len(grid["datasets"]) == 1 else None,
        quick_dir=args.out / "checkpoints" if (args.quick or args.smoke) else None, log=log)
    model.eval()
    n_eval = min(grid["eval_images"], dataset.test_images.shape[0])
    test = subset(dataset, test=n_eval, seed=args.seed)
    fast = FastAccuracy(model, test.test_images, test.test_labels, batch=min(1000, n_eval))
    original_mlp = model.blocks[0].mlp
    acc_original, _ = fast(original_mlp)
    acc_check = evaluate(model, test.test_images[:fast.n], test.test_labels[:fast.n])
    if abs(acc_original - acc_check) > 1e-9:
        raise RuntimeError(f"fast accuracy {acc_original} != evaluate() {acc_check}")
    acc_full_test = evaluate(model, dataset.test_images, dataset.test_labels)
    X, jac, F = block0_problem(model, dataset, args.samples, args.capture_images, args.seed)
    m, hidden, n = X.shape[1], original_mlp.hidden, F.shape[1]
    p_fc = jb.solver.metrics.params_fc(m, hidden, n)
    p_fc_bias = count_params(original_mlp)
    log(f"{name}: ViT test accuracy {100 * acc_full_test:.2f} % (on the {fast.n} evaluation images "
        f"{100 * acc_original:.2f} %); block-0 MLP {m}->{hidden}->{n}: {p_fc} weights, {p_fc_bias} with biases")

    protocol = {"dataset": name, "checkpoint": source["checkpoint"], "samples": args.samples,
                "capture_images": args.capture_images, "seed": args.seed, "restarts": grid["restarts"],
                "max_iter": grid["max_iter"], "tol": args.tol, "eval_images": fast.n,
                # finished configurations are reused only if computed by a solver with the same
                # numbers (jaxbsd.solver.fingerprint; a bit-identical fingerprint, the cautious reading)
                "solver_fingerprint": solver_fingerprint()}
    state = args.out / "state" / f"{args.prefix}_{name}.jsonl"
    key = protocol_key(protocol)
    done: dict[str, list[dict]] = {}
    if state.exists():
        for line in state.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by an interruption
            if rec.get("protocol") == key:
                done[rec["config"]] = rec["runs"]
        if done:
            log(f"{name}: resuming, {len(done)} configurations already done ({state})")
    state.parent.mkdir(parents=True, exist_ok=True)

    configs = [(variant, rank, col, y, basis) for variant in VARIANTS for rank in grid["ranks"]
               for col, y, basis in bases(grid["pd"], grid["dofs"], grid["spline_degrees"])]
    runs: list[dict] = []
    missing: list[str] = []  # configurations not run (--write-partial)
    solve_key = jax.random.key(args.seed + 1)
    for i, (variant, rank, col, y, basis) in enumerate(configs, start=1):
        cfg_id = f"{variant}|r={rank}|{basis!r}"
        if cfg_id in done:
            runs += done[cfg_id]
            continue
        if args.write_partial:
            missing.append(cfg_id)
            continue
        t0 = Timer()
        config = jb.CMTFConfig(rank=rank, basis=basis, robust=VARIANTS[variant], max_iter=grid["max_iter"],
                               tol=args.tol)
        results = solve_lambdas(jac, F, X, config, grid["lams"], key=solve_key, restarts=grid["restarts"])
        p_bsd = jb.solver.metrics.params_bsd(m, n, rank, basis.num_coef)
        new_runs = []
        for lam, res in zip(grid["lams"], results):
            err_J = np.asarray(res.restarts.error_J)
            err_F = np.asarray(res.restarts.error_F)
            status = np.asarray(res.restarts.status)
            iters = np.asarray(res.restarts.iterations)
            for k in range(grid["restarts"]):
                module = DecoupledMLP.from_decoupled(res.restart_model(k), dtype=jnp.float32)
                acc, finite = fast(module)
                new_runs.append({
                    "dataset": name, "variant": variant, "robust": VARIANTS[variant], "lam": lam,
                    "rank": rank, "column": col, "y": y, "basis": basis.to_dict(), "run": k,
                    "accuracy": 100 * acc, "error_J": float(err_J[k]), "error_F": float(err_F[k]),
                    "status": STATUS_NAMES.get(int(status[k]), str(int(status[k]))),
                    "iterations": int(iters[k]), "finite_logits": finite,
                    "params_bsd": p_bsd, "savings": jb.solver.metrics.savings_percentage(p_bsd, p_fc),
                    "savings_with_bias": jb.solver.metrics.savings_percentage(p_bsd, p_fc_bias),
                    "best_restart": int(res.best_restart) == k,
                })
        # Every configuration compiles its own solver and evaluation programs; without this an
        # hour-long grid exhausts the process's memory mappings (LLVM "Cannot allocate memory"
        # after ~95 configurations here). Programs come back from the on-disk cache if needed.
        jax.clear_caches()
        seconds = t0()
        for r in new_runs:
            r["seconds_config"] = seconds
        with open(state, "a") as f:
            f.write(json.dumps(jsonable({"protocol": key, "config": cfg_id, "runs": new_runs})) + "\n")
        runs += new_runs
        accs = {lam: np.mean([r["accuracy"] for r in new_runs if r["lam"] == lam]) for lam in grid["lams"]}
        log(f"[{name} {i}/{len(configs)}] {variant:6s} r={rank:3d} {col:8s} {'ν' if col != 'PD' else 'd'}={y}: "
            + "  ".join(f"λ={lam:g} acc {a:.2f}" for lam, a in accs.items()) + f"  ({seconds:.1f} s)")
        if i == 1:  # one end-to-end check that the fast path equals evaluate() on the edited model
            module = DecoupledMLP.from_decoupled(results[-1].restart_model(0), dtype=jnp.float32)
            model.blocks[0].mlp = module
            try:
                ref = evaluate(model, test.test_images[:fast.n], test.test_labels[:fast.n])
            finally:
                model.blocks[0].mlp = original_mlp
            if abs(100 * ref - new_runs[-grid["restarts"]]["accuracy"]) > 1e-6:
                raise RuntimeError("fast accuracy disagrees with jaxbsd.evaluation.evaluate on a decoupled block")

    return {
        "dataset": name,
        "model": source,
        "accuracy_original_eval_subset": 100 * acc_original,
        "accuracy_original_full_test": 100 * acc_full_test,
        "eval_images": fast.n,
        "test_images": int(dataset.test_images.shape[0]),
        "train_images": int(dataset.train_images.shape[0]),
        "mlp": {"in": m, "hidden": hidden, "out": n, "params_fc": p_fc, "params_fc_with_bias": p_fc_bias},
        "protocol": protocol,
        "runs": runs,
        "configurations": {"done": len(configs) - len(missing), "total": len(configs), "missing": missing},
        "grids": summarize(runs, grid),
        "wall_seconds": timer(),
    }


# --------------------------------------------------------------------------- summaries


def _cell_runs(runs, variant, lam, col, y, rank):
    return [r for r in runs if r["variant"] == variant and r["lam"] == lam and r["column"] == col
            and r["y"] == y and r["rank"] == rank]


def summarize(runs: list[dict], grid: dict) -> dict:
    """``grids[metric][variant][λ][column]`` = rows (y values) × columns (ranks) of means, plus
    ``counts[variant][λ][column][status]`` grids and the axes."""
    ys = {"PD": list(grid["pd"]), **{f"BSD d={d}": list(grid["dofs"]) for d in grid["spline_degrees"]}}
    out = {"ranks": list(grid["ranks"]), "lams": list(grid["lams"]), "y": ys, "columns": list(ys),
           "variants": list(VARIANTS)}
    for metric in METRICS:
        out[metric] = {}
        for variant in VARIANTS:
            out[metric][variant] = {}
            for lam in grid["lams"]:
                out[metric][variant][repr(lam)] = {
                    col: [[_mean([r[metric] for r in _cell_runs(runs, variant, lam, col, y, rank)])
                           for rank in grid["ranks"]] for y in ys[col]]
                    for col in ys
                }
    out["counts"] = {}
    for variant in VARIANTS:
        out["counts"][variant] = {}
        for lam in grid["lams"]:
            out["counts"][variant][repr(lam)] = {}
            for col in ys:
                cells = {}
                for status in [*STATUS_NAMES.values(), "nonfinite_logits"]:
                    cells[status] = [[sum(1 for r in _cell_runs(runs, variant, lam, col, y, rank)
                                          if (r["status"] == status if status != "nonfinite_logits"
                                              else not r["finite_logits"]))
                                      for rank in grid["ranks"]] for y in ys[col]]
                out["counts"][variant][repr(lam)][col] = cells
    bad = [r for r in runs if r["status"] in ("diverged", "nonfinite") or not r["finite_logits"]]
    out["bad_runs"] = len(bad)
    out["status_totals"] = {s: sum(1 for r in runs if r["status"] == s) for s in STATUS_NAMES.values()}
    return out


def _mean(values):
    v = [x for x in values if x is not None and np.isfinite(x)]
    return float(np.mean(v)) if v else None


def budget_note(grid: dict) -> str:
    """What this run spent, in words, from the grid it actually ran (``--max-iter`` etc. included)."""
    return (f"max_iter {grid['max_iter']} sweeps per restart (solver keeps its best iterate), "
            f"{grid['restarts']} restarts, accuracy on a fixed random subset of {grid['eval_images']} test "
            "images; everything else as in the paper (S = 128, the paper's λ, ranks, degrees and ν)")


def variant_table(result: dict) -> str:
    """Mean accuracy / Error(𝒥) / Error(F) per variant, λ and column (over ranks, ν and runs)."""
    g = result["grids"]
    lines = [f"{result['dataset']}: original accuracy {result['accuracy_original_eval_subset']:.2f} % "
             f"on {result['eval_images']} test images",
             f"{'variant':<8}{'λ':>8}  " + "".join(f"{c:>22}" for c in g["columns"]),
             f"{'':<8}{'':>8}  " + "".join(f"{'acc %  E(J)   E(F)':>22}" for _ in g["columns"])]
    for variant in g["variants"]:
        for lam in g["lams"]:
            cells = []
            for col in g["columns"]:
                vals = [np.nanmean(np.asarray(g[m][variant][repr(lam)][col], dtype=float)) for m in
                        ("accuracy", "error_J", "error_F")]
                cells.append(f"{vals[0]:>8.2f} {vals[1]:>6.3f} {vals[2]:>6.3f}")
            lines.append(f"{variant:<8}{lam:>8g}  " + "".join(f"{c:>22}" for c in cells))
    return "\n".join(lines)


# --------------------------------------------------------------------------- plots


def plot_metric(result: dict, metric: str, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm, Normalize

    g = result["grids"]
    ranks, cols = g["ranks"], g["columns"]
    if metric == "savings":  # independent of λ and of the variant: one row, like the paper
        rows = [("", g["variants"][-1], g["lams"][-1])]
    else:
        rows = [(f"{v}, λ={lam:g}", v, lam) for v in g["variants"] for lam in g["lams"]]
    arrays = {(v, lam, c): np.asarray(g[metric][v][repr(lam)][c], dtype=float) for _, v, lam in rows for c in cols}
    finite = np.concatenate([a[np.isfinite(a)].ravel() for a in arrays.values()] + [np.zeros(0)])
    log_scale = metric in ("error_J", "error_F") and finite.size and finite.min() > 0
    if finite.size == 0:
        norm = Normalize(0, 1)
    elif log_scale:
        norm = LogNorm(max(finite.min(), 1e-6), max(finite.max(), finite.min() * 1.01))
    else:
        norm = Normalize(finite.min(), max(finite.max(), finite.min() + 1e-9))
    cmap = "viridis_r" if metric in ("error_J", "error_F") else "viridis"
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(3.3 * len(cols) + 1.2, 2.3 * len(rows) + 0.8),
                             squeeze=False)
    image = None
    for i, (label, v, lam) in enumerate(rows):
        for j, c in enumerate(cols):
            ax = axes[i, j]
            a = arrays[(v, lam, c)]
            image = ax.imshow(np.ma.masked_invalid(a), cmap=cmap, norm=norm, aspect="auto")
            for (yi, xi), val in np.ndenumerate(a):
                if np.isfinite(val):
                    text = f"{val:.1f}" if metric in ("accuracy", "savings") else f"{val:.2f}" if val < 10 else f"{val:.0e}"
                    ax.text(xi, yi, text, ha="center", va="center", fontsize=6, color="w")
            ax.set_xticks(range(len(ranks)), ranks, fontsize=7)
            ax.set_yticks(range(len(g["y"][c])), g["y"][c], fontsize=7)
            if i == 0:
                ax.set_title(c if c == "PD" else f"{c}", fontsize=9)
            if i == len(rows) - 1:
                ax.set_xlabel("rank r", fontsize=8)
            if j == 0:
                ax.set_ylabel(f"{label}\n{'degree d' if c == 'PD' else 'ν'}" if label else "degree d", fontsize=8)
            elif j == 1:
                ax.set_ylabel("ν", fontsize=8)
    names = {"accuracy": "mean top-1 accuracy (%), no fine-tuning", "error_J": "mean Error(J)",
             "error_F": "mean Error(F)", "savings": "savings SP of the MLP (%)"}
    fig.suptitle(f"{result['dataset']}: block 1 of the ViT, {names[metric]} over "
                 f"{result['protocol']['restarts']} runs", fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.9, 0.97))
    if image is not None:
        cax = fig.add_axes((0.915, 0.1, 0.015, 0.8))
        fig.colorbar(image, cax=cax)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="CI size: 2 λ, rank 32, PD d=3 and BSD ν=4 (degrees 1 and 3)")
    mode.add_argument("--smoke", action="store_true", help="smallest grid, one data set (tests)")
    parser.add_argument("--dataset", action="append", choices=DATASETS,
                        help="data set(s) to run (repeatable; default: both)")
    parser.add_argument("--checkpoint", default=None, help="trained ViT (only with a single --dataset)")
    parser.add_argument("--max-iter", type=int, default=None, help="sweeps per restart (full: 100)")
    parser.add_argument("--restarts", type=int, default=None, help="runs per configuration (full: 5)")
    parser.add_argument("--eval-images", type=int, default=None, help="test images for accuracy (full: 2000)")
    parser.add_argument("--tol", type=float, default=1e-10, help="solver tolerance")
    parser.add_argument("--samples", type=int, default=128, help="S, sampled tokens")
    parser.add_argument("--capture-images", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-compile-cache", action="store_true", help="do not cache compiled programs on disk")
    parser.add_argument("--write-partial", action="store_true",
                        help="run nothing: write the result of the configurations already finished (resume "
                             "state), listing the missing ones")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args(argv)
    grid = dict(SMOKE if args.smoke else QUICK if args.quick else FULL)
    for name in ("max_iter", "restarts", "eval_images"):
        if getattr(args, name) is not None:
            grid[name] = getattr(args, name)
    if args.dataset:
        grid["datasets"] = tuple(dict.fromkeys(args.dataset))
    if args.checkpoint and len(grid["datasets"]) != 1:
        parser.error("--checkpoint needs exactly one --dataset")
    args.prefix = "ablation_smoke" if args.smoke else "ablation_quick" if args.quick else "ablation"
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.no_compile_cache:
        enable_compilation_cache()
    command = command_line("ablation.py", argv)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    written = []
    for name in grid["datasets"]:
        result = run_dataset(name, grid, args, log)
        table = variant_table(result)
        print(table)
        g = result["grids"]
        print(f"{name}: status totals {g['status_totals']}; runs with diverged/non-finite status or "
              f"non-finite logits: {g['bad_runs']}")
        payload = {
            "command": command,
            "mode": "smoke" if args.smoke else "quick" if args.quick else "full",
            "grid": {k: list(v) if isinstance(v, tuple) else v for k, v in grid.items()},
            "budget_note": budget_note(grid),
            "solver_note": ("the 3 λ of a configuration share one compiled program, vmapped over λ "
                            "(a traced leaf of CMTFConfig) and over the restarts: see "
                            "experiments/ablation.py solve_lambdas"),
            "paper": PAPER,
            "table": table,
            **result,
        }
        path = args.out / f"{args.prefix}_{name}.json"
        write_json(path, payload)
        written.append(path)
        for metric in METRICS:
            png = args.out / f"{args.prefix}_{name}_{metric}.png"
            plot_metric(result, metric, png)
            written.append(png)
        log(f"{name}: {len(result['runs'])} runs in {result['wall_seconds']:.0f} s")
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
