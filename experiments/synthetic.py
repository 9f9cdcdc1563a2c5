"""The paper's synthetic example (§6.2, Table "synthetic_example", Figure "synthetic_example").

f(x) = [sin(0.2π(x1 + x2) + 2.5), tanh(x1 + x2) − 5], x ∈ [−5, 5]², rank 3, λ = 0.25.
Methods: R-CMTF-PD d = 10 and R-CMTF-BSD ν = 11 with d = 10, 1, 3.

The paper omits its protocol; ours (DESIGN.md, issue 2): S = 200 training points uniform in
[−5, 5]², 1000 fresh test points, the best of 8 restarts by training objective, ``e_i`` on the
test points, mean over 3 data draws.

Usage::

    python experiments/synthetic.py            # full protocol
    python experiments/synthetic.py --quick    # 1 draw, fewer sweeps (CI)

Writes ``experiments/results/synthetic.json`` and ``synthetic.png`` (rows f1, f2; a column per
method; true and fitted outputs against x1 + x2).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxbsd as jb
from jaxbsd.io import write_json_atomic

jax.config.update("jax_enable_x64", True)

RESULTS = pathlib.Path(__file__).resolve().parent / "results"

METHODS = {
    "R-CMTF-PD d=10": jb.Polynomial(10),
    "R-CMTF-BSD nu=11 d=10": jb.BSpline(10, 11),
    "R-CMTF-BSD nu=11 d=1": jb.BSpline(1, 11),
    "R-CMTF-BSD nu=11 d=3": jb.BSpline(3, 11),
}
PAPER = {  # Table synthetic_example: (e1, e2, mean) in percent
    "R-CMTF-PD d=10": (0.39, 13.68, 7.04),
    "R-CMTF-BSD nu=11 d=10": (0.25, 13.64, 6.95),
    "R-CMTF-BSD nu=11 d=1": (9.78, 4.55, 7.17),
    "R-CMTF-BSD nu=11 d=3": (2.63, 1.66, 2.15),
}


def target(x: jax.Array) -> jax.Array:
    """The paper's system, ``(2,) -> (2,)``."""
    s = x[0] + x[1]
    return jnp.stack([jnp.sin(0.2 * jnp.pi * s + 2.5), jnp.tanh(s) - 5])


def run(draws: int, train: int, test: int, restarts: int, max_iter: int, seed: int):
    """Returns ``{method: {"e": (draws, 2) list, ...}}`` and the models of the first draw."""
    results = {name: {"e": [], "error_J": [], "error_F": [], "seconds": []} for name in METHODS}
    first_models = {}
    for draw in range(draws):
        k_train, k_test, k_solve = jax.random.split(jax.random.key(seed + draw), 3)
        X = jax.random.uniform(k_train, (train, 2), minval=-5.0, maxval=5.0)
        X_test = jax.random.uniform(k_test, (test, 2), minval=-5.0, maxval=5.0)
        J, F = jb.sample(target, X)
        F_test = jax.vmap(target)(X_test)
        for name, basis in METHODS.items():
            config = jb.CMTFConfig(rank=3, basis=basis, lam=0.25, max_iter=max_iter)
            start = time.perf_counter()
            res = jb.decouple(J, F, X, config, key=k_solve, restarts=restarts)
            e = jb.metrics.relative_rmse(F_test, res.model(X_test))
            e.block_until_ready()
            results[name]["seconds"].append(time.perf_counter() - start)
            results[name]["e"].append(np.asarray(e).tolist())
            results[name]["error_J"].append(float(res.error_J))
            results[name]["error_F"].append(float(res.error_F))
            if draw == 0:
                first_models[name] = res.model
    for name, r in results.items():
        e = np.asarray(r["e"])
        r["e_mean"] = e.mean(axis=0).tolist()
        r["mean"] = float(e.mean())
        r["paper"] = dict(zip(("e1", "e2", "mean"), PAPER[name]))
    return results, first_models


def table(results) -> str:
    lines = [f"{'method':<24}{'e1 %':>9}{'paper':>8}{'e2 %':>9}{'paper':>8}{'mean %':>9}{'paper':>8}"]
    for name, r in results.items():
        p = PAPER[name]
        e1, e2 = r["e_mean"]
        lines.append(f"{name:<24}{e1:>9.2f}{p[0]:>8.2f}{e2:>9.2f}{p[1]:>8.2f}{r['mean']:>9.2f}{p[2]:>8.2f}")
    return "\n".join(lines)


def plot(models, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = jnp.linspace(-10, 10, 400)
    grid = jnp.stack([s / 2, s / 2], axis=1)  # points with x1 = x2, so x1 + x2 = s
    true = jax.vmap(target)(grid)
    fig, axes = plt.subplots(2, len(models), figsize=(4 * len(models), 6), sharex=True)
    for col, (name, model) in enumerate(models.items()):
        fit = model(grid)
        for row in range(2):
            ax = axes[row, col]
            ax.plot(s, true[:, row], "k-", label="f")
            ax.plot(s, fit[:, row], "r--", label="decoupled")
            ax.axvspan(-10, 10, alpha=0.0)
            if row == 0:
                ax.set_title(name, fontsize=9)
            ax.set_ylabel(f"f{row + 1}")
            if row == 1:
                ax.set_xlabel("x1 + x2")
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 draw, 300 sweeps, 4 restarts")
    parser.add_argument("--draws", type=int, default=3)
    parser.add_argument("--restarts", type=int, default=8)
    parser.add_argument("--max-iter", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.draws, args.restarts, args.max_iter = 1, 4, 300
    results, models = run(args.draws, 200, 1000, args.restarts, args.max_iter, args.seed)
    print(table(results))
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python experiments/synthetic.py " + " ".join(sys.argv[1:] if argv is None else argv)
    payload = {
        "command": command.strip(),
        "protocol": {"train": 200, "test": 1000, "draws": args.draws, "restarts": args.restarts,
                     "max_iter": args.max_iter, "rank": 3, "lam": 0.25, "seed": args.seed},
        "results": results,
    }
    name = "synthetic_quick" if args.quick else "synthetic"
    json_path = write_json_atomic(args.out / f"{name}.json", payload)
    plot(models, args.out / f"{name}.png")
    print(f"wrote {json_path} and {args.out / (name + '.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
