"""Row (e): time per iteration of our sweep (``jaxbsd.sweep``) against tensorly's CP-ALS
(``parafac``, numpy backend).

Named ``tensorly_cp`` rather than ``tensorly``: ``python benchmarks/run.py`` puts ``benchmarks/``
on ``sys.path``, where a ``tensorly.py`` would shadow the tensorly package.
"""

from __future__ import annotations

# first: benchmarks.common enables float64 before jaxbsd is imported
from benchmarks.common import Row, block, interleaved, numpy_blas_variants
from benchmarks.problems import init_jit, random_dense_problem

import jax

import jaxbsd as jb


__all__ = ["bench_tensorly"]


def bench_tensorly(S: int = 128, n: int = 64, m: int = 64, r: int = 16, iters: int = 10, repeats: int = 11) -> list[Row]:
    """(e) Time per iteration: tensorly ``parafac`` (numpy backend, float64) vs our sweep.

    Ours is the library's own :func:`jaxbsd.sweep` (``iters`` of them in one jitted
    ``fori_loop``): a full R-CMTF-BSD iteration, i.e. the CP updates of W1, W0, G plus the
    zeroth-order term and the B-spline projection, so it does strictly more work per iteration
    than tensorly's CP-ALS. tensorly runs with ``tol=0`` (no error computed per iteration) and
    ``init='random'``; its fixed cost is removed by subtracting a run with ``n_iter_max=0``.
    """
    import tensorly as tl
    from tensorly.decomposition import parafac

    tl.set_backend("numpy")
    J, F, X = random_dense_problem(S, n, m, seed=3)
    problem = jb.solver.problem(J, F, X)
    config = jb.CMTFConfig(rank=r, basis=jb.BSpline(3, 4))
    state = init_jit(jax.random.key(4), problem, config)

    @jax.jit
    def ours(state, problem):
        return jax.lax.fori_loop(0, iters, lambda _, st: jb.solver.sweep(st, problem, config), state)

    def tly(k):
        return parafac(J, r, n_iter_max=k, init="random", tol=0, random_state=0)

    t = interleaved(
        {
            "ours": lambda: block(ours(state, problem)),
            **numpy_blas_variants(lambda: tly(iters), "tensorly"),
            **numpy_blas_variants(lambda: tly(0), "tensorly_setup"),
        },
        repeats=repeats,
    )
    t_ours = t["ours"]["median"] / iters
    per_iter = {
        suffix: (
            max(t["tensorly" + suffix]["median"] - t["tensorly_setup" + suffix]["median"], 1e-12) / iters,
            max(t["tensorly" + suffix]["min"] - t["tensorly_setup" + suffix]["min"], 1e-12) / iters,
        )
        for suffix in ("", "@1thread")
        if "tensorly" + suffix in t
    }
    best = min(per_iter, key=lambda k: per_iter[k][0])
    t_tl = per_iter[best][0]
    ratio = t_tl / t_ours
    ratio_min = min(v[1] for v in per_iter.values()) / (t["ours"]["min"] / iters)
    # Sanity: our iterations decrease the fit error (a real ALS, not a no-op).
    end = ours(state, problem)
    err = float(problem.jac.residual_sq_norm(end.W0, end.W1, end.G) / problem.jac.sq_norm())
    return [
        Row(
            "(e) iteration: our sweep vs tensorly CP-ALS",
            t_ours, t_tl, ratio, ">= 1x", ratio >= 1,
            ratio_min=ratio_min,
            note=f"S={S} n={n} m={m} r={r} f64, {iters} iterations; tensorly with NumPy BLAS "
            + ("1 thread" if best else "default threads") + f" (its faster setting); our rel. error after them {err:.3f}",
            details={"timings": t, "iters": iters, "per_iteration_tensorly": per_iter},
        )
    ]
