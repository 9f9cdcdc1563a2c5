"""Row (g): batching and compilation at the paper size.

16 seeds and a 3 λ × 16 seeds grid in one program against one restart, one sweep's time, and
the three programs' compile times (targets on accelerators; informational on the CPU).
"""

from __future__ import annotations

import time

# first: benchmarks.common enables float64 before jaxbsd is imported
from benchmarks.common import Row, block, interleaved, on_accelerator
from benchmarks.problems import random_dense_problem

import jax
import jax.numpy as jnp
import numpy as np

import jaxbsd as jb


__all__ = ["bench_batching"]


def bench_batching(
    S: int = 128, n: int = 64, m: int = 64, r: int = 64, dof: int = 4, degree: int = 3,
    restarts: int = 16, lams: tuple[float, ...] = (0.1, 0.25, 1.0), sweeps: int = 20, repeats: int = 5,
) -> list[Row]:
    """(g) Batching and compilation at the paper size, float32, on the default backend.

    One program each, compiled ahead of time (``lower().compile()``, timed as its own row):
    one restart (``jb.solver.solve``), ``restarts`` seeds (``jax.vmap`` over keys) and a
    ``len(lams)`` × ``restarts`` grid (``jax.vmap`` over λ of a ``jax.vmap`` over keys), all
    ``sweeps`` sweeps (tol = 0). On an accelerator a batch should cost little more than one
    restart (the targets: 16 seeds ≤ 2×, the grid ≤ 3×, one sweep ≤ 0.3 ms); on the
    CPU, where the batch's solves run one member at a time, the rows are informational
    (row (f) holds the CPU targets).
    """
    J, F, X = random_dense_problem(S, n, m, seed=0, dtype=np.float32)
    problem = jb.solver.problem(J, F, X)
    config = jb.CMTFConfig(rank=r, basis=jb.BSpline(degree, dof), max_iter=sweeps, tol=0.0)
    keys = jax.random.split(jax.random.key(0), restarts)
    lam = jnp.asarray(lams, jnp.float32)

    def one(key):
        return jb.solver.solve(key, problem, config).objective

    def seeds(keys):
        return jax.vmap(one)(keys)

    def grid(lam, keys):
        return jax.vmap(lambda l: jax.vmap(lambda k: jb.solver.solve(k, problem, config.replace(lam=l)).objective)(keys))(lam)

    programs, compile_s = {}, {}
    for name, fn, args in (("one", one, (keys[0],)), ("seeds", seeds, (keys,)), ("grid", grid, (lam, keys))):
        t0 = time.perf_counter()
        compiled = jax.jit(fn).lower(*args).compile()
        compile_s[name] = time.perf_counter() - t0
        block(compiled(*args))
        programs[name] = lambda c=compiled, a=args: block(c(*a))
    t = interleaved(programs, repeats=repeats, warmup=0)
    t1, tR, tG = (t[k]["median"] for k in ("one", "seeds", "grid"))
    acc = on_accelerator()
    size = f"S={S} n={n} m={m} r={r} ν={dof} d={degree} f32, {sweeps} sweeps, {jax.default_backend()}"
    per_sweep = t1 / sweeps

    def target(limit: float, value: float, text: str) -> tuple[str, bool | None]:
        return (text, value <= limit) if acc else ("info", None)

    rows = []
    tgt, ok = target(2.0, tR / t1, "<= 2x")
    rows.append(Row(f"(g) {restarts} seeds / 1 restart, one program", tR, t1, tR / t1, tgt, ok,
                    ratio_min=t["seeds"]["min"] / t["one"]["min"], note=size, details={"timings": t}))
    tgt, ok = target(3.0, tG / t1, "<= 3x")
    rows.append(Row(f"(g) {len(lams)} λ x {restarts} seeds / 1 restart, one program", tG, t1, tG / t1, tgt, ok,
                    ratio_min=t["grid"]["min"] / t["one"]["min"], note=size))
    tgt, ok = target(0.3e-3, per_sweep, "<= 0.3 ms")
    rows.append(Row("(g) one sweep at the paper size", per_sweep, None, None, tgt, ok,
                    note=f"{size}; one restart's time / sweeps ({per_sweep * 1e3:.3f} ms)"))
    rows.append(Row("(g) compile, paper size (1 restart / 16 seeds / grid)", compile_s["one"], None, None, "info", None,
                    note=f"{size}; lower+compile {compile_s['one']:.2f} s / {compile_s['seeds']:.2f} s / "
                    f"{compile_s['grid']:.2f} s", details={"compile_s": compile_s}))
    return rows
