"""The paper's synthetic example (§6.2, Table "synthetic_example", Figure "synthetic_example").

f(x) = [sin(0.2π(x1 + x2) + 2.5), tanh(x1 + x2) − 5], x ∈ [−5, 5]², rank 3, λ = 0.25.
Methods: R-CMTF-PD d = 10 and R-CMTF-BSD ν = 11 with d = 10, 1, 3.

Protocol (the paper gives the metric, not the sampling): S = 200 sampling points uniform in
[−5, 5]², 3 data draws (seeds 0, 1, 2), robust solver, up to 2000 sweeps per restart.

Metrics, per output i, in percent (``jb.solver.metrics.relative_rmse``):

* ``e_S`` — **the paper's e_i**, on the S sampling points (§6.2 defines e_i over them);
* ``e_heldout`` — on 1000 fresh points uniform in the same square [−5, 5]²;
* ``e_outside`` — on 1000 points outside it, uniform in [−7.5, 7.5]² \\ [−5, 5]²
  (extrapolation: the spline continues its boundary polynomial pieces).

Restart strategies, at the same total budget of sweeps per solve:

* ``best-of-8``: 8 random restarts × 2000 sweeps, the best by training objective (16,000 sweeps);
* ``short-then-continue``: 24 random restarts × 500 sweeps, then the best of them continued to
  4000 sweeps (24 × 500 + 4000 = 16,000: the continuation replays its first 500 sweeps, since a
  restart is a pure function of its key, and counts them again).

Every restart's status and iteration count go into the JSON.

Usage::

    python experiments/synthetic.py            # full protocol
    python experiments/synthetic.py --quick    # 1 draw, budget 1200 sweeps (CI)

Writes ``<out>/synthetic.json`` and ``synthetic.png`` (``synthetic_quick.*`` in quick mode): rows
f1, f2, a column per method, true and fitted outputs against x1 + x2 with the training range.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jaxbsd as jb

from checkout import RESULTS
from output import Timer, command_line, write_json

jax.config.update("jax_enable_x64", True)

METHODS = {
    "R-CMTF-PD d=10": jb.Polynomial(10),
    "R-CMTF-BSD nu=11 d=10": jb.BSpline(10, 11),
    "R-CMTF-BSD nu=11 d=1": jb.BSpline(1, 11),
    "R-CMTF-BSD nu=11 d=3": jb.BSpline(3, 11),
}
PAPER = {  # Table synthetic_example: (e1, e2, mean) in percent, on the sampling points
    "R-CMTF-PD d=10": (0.39, 13.68, 7.04),
    "R-CMTF-BSD nu=11 d=10": (0.25, 13.64, 6.95),
    "R-CMTF-BSD nu=11 d=1": (9.78, 4.55, 7.17),
    "R-CMTF-BSD nu=11 d=3": (2.63, 1.66, 2.15),
}
STRATEGIES = ("best-of-8", "short-then-continue")
METRICS = ("e_S", "e_heldout", "e_outside")
STATUS_NAMES = {int(s): s.name.lower() for s in jb.Status}
FULL = dict(draws=3, sweeps=2000, restarts=8, short_restarts=24, short_sweeps=500)
QUICK = dict(draws=1, sweeps=300, restarts=4, short_restarts=12, short_sweeps=75)


def target(x: jax.Array) -> jax.Array:
    """The paper's system, ``(2,) -> (2,)``."""
    s = x[0] + x[1]
    return jnp.stack([jnp.sin(0.2 * jnp.pi * s + 2.5), jnp.tanh(s) - 5])


def draw_points(key: jax.Array, train: int, test: int):
    """Sampling points, held-out points in the same square, and points outside it."""
    k_train, k_test, k_out = jax.random.split(key, 3)
    X = jax.random.uniform(k_train, (train, 2), minval=-5.0, maxval=5.0)
    X_heldout = jax.random.uniform(k_test, (test, 2), minval=-5.0, maxval=5.0)
    ring = np.asarray(jax.random.uniform(k_out, (8 * test, 2), minval=-7.5, maxval=7.5))
    ring = ring[np.max(np.abs(ring), axis=1) > 5.0][:test]
    return X, X_heldout, jnp.asarray(ring)


_solve_one = jax.jit(jb.solver.solve)


def solve(strategy: str, J, F, X, basis: jb.Basis, key: jax.Array, budget: dict):
    """``(model, restarts)`` for one strategy: the chosen model and every restart's
    ``{status, iterations, objective, continued}``."""
    config = jb.CMTFConfig(rank=3, basis=basis, lam=0.25, max_iter=budget["sweeps"])
    if strategy == "best-of-8":
        res = jb.decouple(J, F, X, config, key=key, restarts=budget["restarts"])
        return res.model, _restarts(res.restarts)
    # short-then-continue
    short = dataclasses.replace(config, max_iter=budget["short_sweeps"])
    res = jb.decouple(J, F, X, short, key=key, restarts=budget["short_restarts"])
    keys = jax.random.split(key, budget["short_restarts"])  # the keys decouple used
    total = budget["restarts"] * budget["sweeps"]
    long_iters = total - budget["short_restarts"] * budget["short_sweeps"]
    problem = jb.solver.problem(J, F, X)
    best = int(res.best_restart)
    cont = _solve_one(keys[best], problem, dataclasses.replace(config, max_iter=long_iters))
    records = _restarts(res.restarts)
    records.append({**_restarts(jax.tree_util.tree_map(lambda x: x[None], cont))[0], "continued_from": best})
    s = cont.state
    model = jb.Decoupled(W0=s.W0, W1=s.W1, coef=s.coef, knots=s.knots, basis=basis)
    return model, records


def _restarts(runs) -> list[dict]:
    return [{"status": STATUS_NAMES[int(s)], "iterations": int(i), "objective": float(o)}
            for s, i, o in zip(np.asarray(runs.status), np.asarray(runs.iterations), np.asarray(runs.objective))]


def run(budget: dict, train: int, test: int, seed: int, log=print):
    """``{strategy: {method: {metric: (draws, 2), ...}}}`` and the first draw's models."""
    results = {s: {name: {m: [] for m in METRICS} | {"restarts": [], "seconds": []} for name in METHODS}
               for s in STRATEGIES}
    first_models = {}
    for draw in range(budget["draws"]):
        k_points, k_solve = jax.random.split(jax.random.key(seed + draw))
        X, X_heldout, X_outside = draw_points(k_points, train, test)
        J, F = jb.solver.sample(target, X)
        truth = {"e_S": (X, F), "e_heldout": (X_heldout, jax.vmap(target)(X_heldout)),
                 "e_outside": (X_outside, jax.vmap(target)(X_outside))}
        for strategy in STRATEGIES:
            for name, basis in METHODS.items():
                timer = Timer()
                model, restarts = solve(strategy, J, F, X, basis, k_solve, budget)
                r = results[strategy][name]
                for metric, (points, values) in truth.items():
                    r[metric].append(np.asarray(jb.solver.metrics.relative_rmse(values, model(points))).tolist())
                r["seconds"].append(timer())
                r["restarts"].append(restarts)
                if draw == 0 and strategy == STRATEGIES[0]:
                    first_models[name] = (model, np.asarray(X))
                log(f"draw {draw} {strategy:20s} {name:24s} e_S {np.mean(r['e_S'][-1]):6.2f} %  "
                    f"heldout {np.mean(r['e_heldout'][-1]):6.2f} %  outside {np.mean(r['e_outside'][-1]):8.2f} %")
    for strategy in STRATEGIES:
        for name, r in results[strategy].items():
            for metric in METRICS:
                e = np.asarray(r[metric])  # (draws, 2)
                r[f"{metric}_mean"] = e.mean(axis=0).tolist()  # per output, over draws
                r[f"{metric}_avg"] = float(e.mean())  # the paper's "mean" column
                r[f"{metric}_avg_std"] = float(e.mean(axis=1).std())  # spread over draws
            r["paper"] = dict(zip(("e1", "e2", "mean"), PAPER[name]))
            statuses = [rec["status"] for draw in r["restarts"] for rec in draw]
            r["status_counts"] = {s: statuses.count(s) for s in sorted(set(statuses))}
    return results, first_models


def table(results, metric: str = "e_S") -> str:
    lines = [f"{'strategy':<20}{'method':<24}{'e1 %':>9}{'paper':>8}{'e2 %':>9}{'paper':>8}{'mean %':>9}{'paper':>8}"]
    for strategy, by_method in results.items():
        for name, r in by_method.items():
            p = PAPER[name]
            e1, e2 = r[f"{metric}_mean"]
            lines.append(f"{strategy:<20}{name:<24}{e1:>9.2f}{p[0]:>8.2f}{e2:>9.2f}{p[1]:>8.2f}"
                         f"{r[f'{metric}_avg']:>9.2f}{p[2]:>8.2f}")
    return "\n".join(lines)


def plot(models, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = jnp.linspace(-12, 12, 480)
    grid = jnp.stack([s / 2, s / 2], axis=1)  # points with x1 = x2, so x1 + x2 = s
    true = jax.vmap(target)(grid)
    fig, axes = plt.subplots(2, len(models), figsize=(4 * len(models), 6), sharex=True)
    for col, (name, (model, X)) in enumerate(models.items()):
        fit = model(grid)
        lo, hi = float(np.min(X.sum(axis=1))), float(np.max(X.sum(axis=1)))
        for row in range(2):
            ax = axes[row, col]
            ax.axvspan(lo, hi, color="0.92", label="sampled x1 + x2")
            ax.plot(s, true[:, row], "k-", label="f")
            ax.plot(s, fit[:, row], "r--", label="decoupled")
            if row == 0:
                ax.set_title(name, fontsize=9)
            ax.set_ylabel(f"f{row + 1}")
            if row == 1:
                ax.set_xlabel("x1 + x2")
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 draw, 1200 sweeps per solve")
    parser.add_argument("--draws", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args(argv)
    budget = dict(QUICK if args.quick else FULL)
    if args.draws is not None:
        budget["draws"] = args.draws
    command = command_line("synthetic.py", argv)
    timer = Timer()
    results, models = run(budget, 200, 1000, args.seed, log=lambda m: print(m, file=sys.stderr, flush=True))
    for metric in METRICS:
        print(f"\n{metric}:\n" + table(results, metric))
    args.out.mkdir(parents=True, exist_ok=True)
    payload = {
        "command": command,
        "mode": "quick" if args.quick else "full",
        "protocol": {"train": 200, "heldout": 1000, "outside": 1000, "outside_box": [-7.5, 7.5],
                     "rank": 3, "lam": 0.25, "seed": args.seed, **budget},
        "metrics": {"e_S": "paper's e_i on the S sampling points", "e_heldout": "fresh points in [-5, 5]^2",
                    "e_outside": "points in [-7.5, 7.5]^2 outside [-5, 5]^2"},
        "results": results,
        "wall_seconds": timer(),
    }
    name = "synthetic_quick" if args.quick else "synthetic"
    json_path = write_json(args.out / f"{name}.json", payload)
    plot(models, args.out / f"{name}.png")
    print(f"wrote {json_path} and {args.out / (name + '.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
