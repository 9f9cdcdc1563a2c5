"""Row (b): 16 vmapped restarts against one restart of ``jaxbsd.decouple``.

tol = 0 (every restart runs ``max_iter`` sweeps), compiled ahead of time, only execution timed,
on the paper's synthetic example and at the paper size of row (a). Each case runs in a fresh
process, :func:`restarts_worker` behind the runner's ``--restarts-worker`` flag
(:func:`benchmarks.common.run_worker`).
"""

from __future__ import annotations

# first: benchmarks.common enables float64 before jaxbsd is imported
from benchmarks.common import Row, block, interleaved, run_worker
from benchmarks.problems import random_dense_problem

import jax
import jax.numpy as jnp
import numpy as np

import jaxbsd as jb


__all__ = ["RESTART_SIZES", "restarts_worker", "bench_restarts"]


def _synthetic_problem(S: int, seed: int = 0):
    """The paper's synthetic example f: R² → R² (sin and tanh of x1 + x2), float64."""

    def f(x):
        s = x[0] + x[1]
        return jnp.stack([jnp.sin(0.2 * jnp.pi * s + 2.5), jnp.tanh(s) - 5])

    X = jnp.asarray(np.random.default_rng(seed).uniform(-2.0, 2.0, (S, 2)))
    J, F = jb.solver.sample(f, X)
    return J, F, X


RESTART_SIZES = {
    "synthetic": dict(S=256, r=3, dof=11),
    "paper": dict(S=128, n=64, m=64, r=64, dof=4),
}


def restarts_worker(case: str, size: dict, restarts: int, sweeps: int, repeats: int) -> dict:
    """Time ``jb.decouple`` with ``restarts`` vmapped restarts and with 1, interleaved.

    Both calls are compiled ahead of time (``jax.jit(...).lower().compile()``) and run once
    before timing. Returns the timings, and per call the sweeps each restart did and the
    number of ``while_loop`` trips (under ``vmap`` the loop runs until the last restart stops).
    """
    if case == "synthetic":
        J, F, X = _synthetic_problem(size["S"])
    else:
        J, F, X = (jnp.asarray(a) for a in random_dense_problem(size["S"], size["n"], size["m"]))
    config = jb.CMTFConfig(rank=size["r"], basis=jb.BSpline(3, size["dof"]), max_iter=sweeps, tol=0.0)
    key = jax.random.key(0)
    compiled = {}
    for R in (1, restarts):
        fn = jax.jit(lambda J, F, X, key, R=R: jb.decouple(J, F, X, config, key=key, restarts=R, batch="vmap"))
        compiled[R] = fn.lower(J, F, X, key).compile()
    results = {R: block(c(J, F, X, key)) for R, c in compiled.items()}
    iterations = {R: np.asarray(res.restarts.iterations).tolist() for R, res in results.items()}
    status = {R: np.asarray(res.restarts.status).tolist() for R, res in results.items()}
    t = interleaved(
        {f"restarts={R}": (lambda c=c: block(c(J, F, X, key))) for R, c in compiled.items()},
        repeats=repeats,
        warmup=0,  # compiled and run once above
    )
    return {
        "timings": t,
        "iterations": {str(R): v for R, v in iterations.items()},
        "status": {str(R): v for R, v in status.items()},
        "trips": {str(R): max(v) for R, v in iterations.items()},
    }


def bench_restarts(
    cases: tuple[str, ...] = ("synthetic", "paper"),
    restarts: int = 16,
    sweeps: dict[str, int] | None = None,
    sizes: dict[str, dict] | None = None,
    repeats: int = 3,
    timeout: float = 180,
    attempts: int = 3,
) -> list[Row]:
    """(b) ``restarts`` vmapped restarts vs one, fixed number of sweeps (tol = 0), float64.

    ``synthetic``: the paper's f: R² → R², r = 3, ν = 11, d = 3, S = 256.
    ``paper``: the random dense problem of (a), m = n = 64, S = 128, r = 64, ν = 4, d = 3.

    Each case runs in a fresh process (:func:`restarts_worker`) killed after ``timeout``
    seconds and retried up to ``attempts`` times: with jaxlib 0.10.x on a machine with few
    cores, the vmapped solver can deadlock in XLA:CPU (batched LAPACK kernels wait for work
    they queued on the intra-op pool their own threads occupy); hangs are counted and
    reported instead of hanging the suite.

    ``tol = 0`` still stops a restart whose objective repeats exactly (an exact fixed point);
    the ratio is therefore per ``while_loop`` trip: ``(t_R / trips_R) / (t_1 / trips_1)``.
    """
    sweeps = {"synthetic": 50, "paper": 10, **(sweeps or {})}
    sizes = {**RESTART_SIZES, **(sizes or {})}
    rows = []
    for case in cases:
        sz = sizes[case]
        args = dict(case=case, size=sz, restarts=restarts, sweeps=sweeps[case], repeats=repeats)
        out, hangs = None, 0
        while out is None and hangs < attempts:
            out = run_worker("--restarts-worker", args, timeout)
            hangs += out is None
        name = f"(b) {restarts} restarts / 1 ({case})"
        if out is None:
            rows.append(
                Row(name, None, None, None, "<= 4x", False,
                    note=f"{sz}: HUNG in {hangs}/{attempts} attempts (killed after {timeout:.0f} s each): "
                    "XLA:CPU deadlock in jaxlib's batched LAPACK kernels (see benchmarks/README.md)",
                    details={"hangs": hangs, "size": sz})
            )
            continue
        t, trips = out["timings"], out["trips"]
        key1, keyR = "restarts=1", f"restarts={restarts}"
        per_trip = {k: {s: t[k][s] / trips[k.split("=")[1]] for s in ("median", "min")} for k in (key1, keyR)}
        ratio = per_trip[keyR]["median"] / per_trip[key1]["median"]
        uneven = trips["1"] != sweeps[case] or trips[str(restarts)] != sweeps[case]
        rows.append(
            Row(
                name,
                t[keyR]["median"], t[key1]["median"], ratio, "<= 4x", ratio <= 4,
                ratio_min=per_trip[keyR]["min"] / per_trip[key1]["min"],
                note=f"{sz}, max_iter={sweeps[case]}, tol=0, f64; ratio per while-loop trip"
                + (f" (trips: 1 restart {trips['1']}, {restarts} restarts {trips[str(restarts)]}: "
                   "a restart stopped at an exact fixed point)" if uneven else "")
                + (f"; {hangs} hung attempt(s) before this one" if hangs else ""),
                details={**out, "size": sz, "sweeps": sweeps[case], "hangs": hangs},
            )
        )
    return rows
