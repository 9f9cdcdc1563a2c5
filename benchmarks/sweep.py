"""Rows (a) and (f): one R-CMTF-BSD sweep against the NumPy baseline, and against this machine's
matmul bound.

(a) one jitted sweep (``jaxbsd.solver.cmtf.sweep``, float64) vs a plain NumPy/SciPy sweep
    (:mod:`benchmarks.numpy_baseline`) at the paper's size m = n = 64, S = 128, r = 64, ν = 4,
    d = 3, after checking that both give the same iterate;
(f) ``jaxbsd.decouple`` per sweep, 1 and 16 restarts, against this machine's matmul bound
    (``4·S·n·m·r`` FLOP at the float32 GEMM rate measured in the same run, :func:`gemm_peak`),
    with a profile of one sweep.
"""

from __future__ import annotations

# first: benchmarks.common enables float64 before jaxbsd is imported
from benchmarks import numpy_baseline
from benchmarks.common import Row, best_reference, block, interleaved, numpy_blas_variants, rel_diff
from benchmarks.problems import init_jit, random_dense_problem, sweep_jit

import jax
import jax.numpy as jnp
import numpy as np

import jaxbsd as jb
from jaxbsd.solver import linalg
from jaxbsd.solver.jacobians import DenseJacobian


__all__ = ["bench_sweep_vs_numpy", "gemm_peak", "bench_matmul_bound"]


def bench_sweep_vs_numpy(
    S: int = 128, n: int = 64, m: int = 64, r: int = 64, dof: int = 4, degree: int = 3,
    repeats: int = 5, seed: int = 0, float32_variant: bool = True,
) -> list[Row]:
    """(a) One jitted float64 sweep vs the NumPy baseline, from the same state (plus,
    informational, the same jitted sweep in float32)."""
    J, F, X = random_dense_problem(S, n, m, seed)
    config = jb.CMTFConfig(rank=r, basis=jb.BSpline(degree, dof))
    problem = jb.solver.Problem(DenseJacobian(jnp.asarray(J)), jnp.asarray(F), jnp.asarray(X))
    state = init_jit(jax.random.key(seed), problem, config)
    np_state = numpy_baseline.State(*(np.asarray(a) for a in state))
    kw = dict(degree=degree, dof=dof, lam=config.lam, mu_w=config.mu_w, mu_c=config.mu_c, eps=config.eps)

    ours = block(sweep_jit(state, problem, config))
    ref = numpy_baseline.sweep(np_state, J, F, X, **kw)
    agreement = max(rel_diff(getattr(ours, f), getattr(ref, f)) for f in jb.solver.SolverState._fields)

    # float32 variant of ours (informational): same data cast down.
    problem32 = jax.tree_util.tree_map(lambda a: a.astype(jnp.float32), problem)
    state32 = jax.tree_util.tree_map(lambda a: a.astype(jnp.float32), state)

    fns = {
        "jax_f64": lambda: block(sweep_jit(state, problem, config)),
        **numpy_blas_variants(lambda: numpy_baseline.sweep(np_state, J, F, X, **kw), "numpy_f64"),
    }
    if float32_variant:
        fns["jax_f32"] = lambda: block(sweep_jit(state32, problem32, config))
    t = interleaved(fns, repeats=repeats)
    size = f"S={S} n={n} m={m} r={r} ν={dof} d={degree}"
    ref_key, ref = best_reference(t, "numpy_f64")
    ours_t, ref_t = t["jax_f64"]["median"], ref["median"]
    ratio = ref_t / ours_t
    blas_note = "NumPy BLAS " + ("1 thread" if ref_key.endswith("@1thread") else "default threads") + " (its faster setting)"
    rows = [
        Row(
            "(a) sweep: jax f64 vs NumPy f64",
            ours_t, ref_t, ratio, ">= 50x, same iterate", ratio >= 50 and agreement <= 1e-6,
            ratio_min=min(t[k]["min"] for k in t if k.startswith("numpy")) / t["jax_f64"]["min"],
            note=f"{size}; {blas_note}; max rel. diff of the iterates {agreement:.1e} (must be <= 1e-6)",
            details={"timings": t, "agreement": agreement, "size": size, "reference": ref_key},
        )
    ]
    for k in t:
        if k.startswith("numpy") and k != ref_key:
            rows.append(
                Row("(a'') sweep: jax f64 vs NumPy f64, " + ("1 BLAS thread" if k.endswith("@1thread") else "default BLAS threads"),
                    ours_t, t[k]["median"], t[k]["median"] / ours_t, "info", None,
                    ratio_min=t[k]["min"] / t["jax_f64"]["min"],
                    note="the NumPy baseline in its other BLAS setting (informational)")
            )
    if float32_variant:
        t32 = t["jax_f32"]["median"]
        rows.append(
            Row("(a') sweep: jax f32 vs NumPy f64", t32, ref_t, ref_t / t32, "info", None,
                ratio_min=min(t[k]["min"] for k in t if k.startswith("numpy")) / t["jax_f32"]["min"],
                note="same data and state cast to float32 (informational)")
        )
    return rows


def gemm_peak(size: int = 2048, repeats: int = 5) -> float:
    """This machine's float32 GEMM rate in FLOP/s: a jitted ``size³`` matmul, median time."""
    a = jax.random.normal(jax.random.key(0), (size, size), jnp.float32)
    mm = jax.jit(lambda a: a @ a)
    t = interleaved({"gemm": lambda: block(mm(a))}, repeats=repeats)
    return 2 * size**3 / t["gemm"]["median"]


def bench_matmul_bound(
    S: int = 128, n: int = 64, m: int = 64, r: int = 64, dof: int = 4, degree: int = 3,
    restarts: int = 16, sweeps: int = 20, repeats: int = 5, gemm: int = 2048, peak: float | None = None,
) -> list[Row]:
    """(f) ``jb.decouple`` per sweep against the machine's own matmul bound, float32.

    A sweep must contract 𝒥 twice (with W0 for the W1 update, with the new W1 for the W0 and
    G updates): ``4·S·n·m·r`` FLOP, ``bound = 4·S·n·m·r / peak`` with ``peak`` the GEMM rate
    measured in this run (or ``peak``, FLOP/s, one measurement several rows share). ``t1``: one restart; ``t16``: ``restarts`` restarts (the default
    batching, vmap), both per sweep (tol = 0, ``sweeps`` sweeps, compile excluded). Also: the
    same restarts one after the other (``batch="map"``, informational), and a profile of one
    sweep from the library's public pieces (contractions, knots, design matrices, the r × r
    LAPACK solves of the same sizes; "rest" = sweep − their sum: projection solves, Grams,
    normalization, bookkeeping).
    """
    peak = gemm_peak(gemm, repeats=repeats) if peak is None else peak
    J, F, X = random_dense_problem(S, n, m, seed=0, dtype=np.float32)
    problem = jb.solver.problem(J, F, X)
    config = jb.CMTFConfig(rank=r, basis=jb.BSpline(degree, dof), max_iter=sweeps, tol=0.0)
    key = jax.random.key(0)
    calls = {
        "t1": lambda: block(jb.decouple(J, F, X, config, key=key, restarts=1)),
        f"t{restarts}": lambda: block(jb.decouple(J, F, X, config, key=key, restarts=restarts)),
        f"t{restarts}_map": lambda: block(jb.decouple(J, F, X, config, key=key, restarts=restarts, batch="map")),
    }
    trips = {name: int(np.max(np.asarray(fn().restarts.iterations))) for name, fn in calls.items()}
    t = interleaved(calls, repeats=repeats, warmup=0)  # compiled and run once just above
    per_sweep = {name: t[name]["median"] / trips[name] for name in calls}
    bound1 = 4 * S * n * m * r / peak
    boundR = restarts * bound1

    # Profile of one sweep from public pieces, each jitted on its own.
    state = init_jit(key, problem, config)
    jac, basis = problem.jac, config.basis
    U = jax.jit(lambda W0: W0 @ problem.X.T)(state.W0)
    knots = jax.jit(jax.vmap(basis.fit))(U)
    sym = jax.jit(lambda W: W.T @ W + jnp.eye(r, dtype=W.dtype))(state.G)
    parts = {
        "contractions (MTTKRPs)": jax.jit(lambda st: (jac.mttkrp_w1(st.W0, st.G), jac.mttkrp_w0(st.W1, st.G),
                                                       jac.mttkrp_g(st.W0, st.W1))),
        "knots (quantile fit)": jax.jit(jax.vmap(basis.fit)),
        "design matrices": jax.jit(jax.vmap(basis.design)),
        # The sweep's four: W1 and W0 (Tikhonov), G (certified Cholesky pseudo-inverse) and, at
        # r >= n as here, R (eigh pseudo-inverse: W1ᵀW1 cannot pass the certificate).
        "r x r solves (2 Cholesky-Tikhonov + Cholesky-pinv + eigh-pinv)": jax.jit(
            lambda A, B: (linalg.tikhonov_solve(A, B, jnp.asarray(1e-4, A.dtype)), linalg.tikhonov_solve(A, B.T, jnp.asarray(1e-4, A.dtype)),
                          linalg.pinv_solve(A, B), linalg.pinv_solve_by_eigh(A + A, B.T))),
        "whole sweep": sweep_jit,
        # What the same four solves cost as LU and eigh, for the profile's
        # before/after: not part of the sweep.
        "(was: 2 LU + 2 eigh)": jax.jit(lambda A, B: (jnp.linalg.solve(A, B), jnp.linalg.solve(A, B.T),
                                                     jnp.linalg.eigh(A), jnp.linalg.eigh(A + A))),
    }
    args = {
        "contractions (MTTKRPs)": (state,), "knots (quantile fit)": (U,), "design matrices": (U, knots),
        "r x r solves (2 Cholesky-Tikhonov + Cholesky-pinv + eigh-pinv)": (sym, sym),
        "whole sweep": (state, problem, config),
        "(was: 2 LU + 2 eigh)": (sym, sym),
    }
    tp = interleaved({k: (lambda f=f, a=args[k]: block(f(*a))) for k, f in parts.items()}, repeats=repeats)
    profile = {k: v["median"] for k, v in tp.items()}
    profile["rest"] = profile["whole sweep"] - sum(v for k, v in profile.items() if k not in ("whole sweep", "(was: 2 LU + 2 eigh)"))
    prof_note = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in profile.items())
    size = f"S={S} n={n} m={m} r={r} ν={dof} d={degree} f32"
    t1, tR, tmap = per_sweep["t1"], per_sweep[f"t{restarts}"], per_sweep[f"t{restarts}_map"]
    facts = f"peak {peak / 1e9:.0f} GFLOP/s ({gemm}³ f32 GEMM); bound/sweep {bound1 * 1e3:.3f} ms"
    return [
        Row("(f) 1 restart: sweep / matmul bound", t1, bound1, t1 / bound1, "<= 2.5x", t1 / bound1 <= 2.5,
            note=f"{size}; {facts}; t1 = {t1 * 1e3:.2f} ms/sweep; profile: {prof_note}",
            details={"peak_flops": peak, "bound_s": bound1, "per_sweep": per_sweep, "trips": trips,
                     "timings": t, "profile_s": profile}),
        Row(f"(f) {restarts} restarts: sweep / matmul bound", tR, boundR, tR / boundR, "<= 2.5x", tR / boundR <= 2.5,
            note=f"{size}; {facts}; t{restarts} = {tR * 1e3:.2f} ms/sweep (vmap, the default), "
            f"{tR / t1:.1f}x one restart"),
        Row(f"(f') {restarts} restarts one after the other (map) / vmap", tmap, tR, tmap / tR, "info", None,
            note=f"t{restarts} map = {tmap * 1e3:.2f} ms/sweep: the measurement behind decouple's default batching"),
    ]
