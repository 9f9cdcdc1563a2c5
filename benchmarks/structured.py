"""Row (c): one sweep through ``StructuredJacobian`` against ``DenseJacobian``.

Float32, an MLP m → 4m → m, S = 256, r = m, m = 192, 384, 768; both paths give the same iterate.
"""

from __future__ import annotations

import gc

# first: benchmarks.common enables float64 before jaxbsd is imported
from benchmarks.common import GiB, Row, block, check_dtype, interleaved, rel_diff
from benchmarks.problems import dense_from_structured, init_jit, mlp_problem, sweep_jit

import jax
import jax.numpy as jnp

import jaxbsd as jb


__all__ = ["bench_structured_vs_dense"]


def bench_structured_vs_dense(
    ms: tuple[int, ...] = (192, 384, 768),
    S: int = 256,
    hidden_factor: int = 4,
    dense_max_m: int = 768,
    dense_max_bytes: float = 2.5 * GiB,
    dof: int = 4,
    degree: int = 3,
    repeats: int = 3,
) -> list[Row]:
    """(c) One float32 sweep through ``StructuredJacobian`` vs ``DenseJacobian`` (r = m).

    Dense is skipped where ``m > dense_max_m`` or the tensor would exceed ``dense_max_bytes``
    (the sweep needs about two tensor-sized buffers).
    """
    rows = []
    for m in ms:
        jac, F, X = mlp_problem(m, hidden_factor * m, S)
        config = jb.CMTFConfig(rank=m, basis=jb.BSpline(degree, dof))
        p_struct = jb.solver.Problem(jac, F, X)
        state = init_jit(jax.random.key(0), p_struct, config)
        check_dtype("(c) structured sweep", sweep_jit(state, p_struct, config), jnp.float32)
        nbytes = S * m * m * 4
        fns = {"structured": lambda p=p_struct: block(sweep_jit(state, p, config))}
        p_dense = None
        if m <= dense_max_m and 2 * nbytes <= dense_max_bytes:
            p_dense = jb.solver.Problem(block(dense_from_structured(jac)), F, X)
            fns["dense"] = lambda p=p_dense: block(sweep_jit(state, p, config))
        t = interleaved(fns, repeats=repeats if m < 768 else min(repeats, 2))
        ts = t["structured"]["median"]
        if p_dense is not None:
            # Same iterate from both paths (the structured path is exact, not an approximation).
            diff = rel_diff(sweep_jit(state, p_struct, config).W1, sweep_jit(state, p_dense, config).W1)
            td = t["dense"]["median"]
            rows.append(
                Row(
                    f"(c) sweep structured vs dense, m={m}",
                    ts, td, td / ts, "info", None,
                    ratio_min=t["dense"]["min"] / t["structured"]["min"],
                    note=f"H={hidden_factor * m}, S={S}, r={m}, f32; dense J {nbytes / 2**20:.0f} MiB; "
                    f"rel. diff W1 {diff:.1e}",
                    details={"timings": t, "rel_diff_W1": diff},
                )
            )
        else:
            rows.append(
                Row(
                    f"(c) sweep structured, m={m} (dense skipped)",
                    ts, None, None, "info", None,
                    note=f"H={hidden_factor * m}, S={S}, r={m}, f32; dense J ({nbytes / 2**30:.2f} GiB) skipped: "
                    + (f"m > dense_max_m = {dense_max_m}" if m > dense_max_m else "over the memory limit"),
                    details={"timings": t},
                )
            )
        del p_dense, fns
        gc.collect()
    return rows
