"""Row (c), the headline: 100 sweeps of ``jaxbsd.decouple`` on a ViT-B-sized MLP.

768 → 3072 → 768, S = 1024, r = 768, float32, ν = 4, d = 3, in a fresh process
(:func:`headline_worker` behind the runner's ``--headline-worker`` flag,
:func:`benchmarks.common.run_worker`): wall time (compile included), compile time and peak
resident memory (VmHWM).
"""

from __future__ import annotations

import time

# first: benchmarks.common enables float64 before jaxbsd is imported
from benchmarks.common import GiB, Row, block, check_dtype, on_accelerator, run_worker
from benchmarks.problems import mlp_problem

import jax
import jax.numpy as jnp

import jaxbsd as jb


__all__ = ["headline_worker", "bench_headline"]


def _vm_hwm_bytes() -> int | None:
    """Peak resident set size of this process (``VmHWM``), or ``None`` off Linux."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    except Exception:  # pragma: no cover
        return None


def headline_worker(m: int, hidden: int, S: int, r: int, sweeps: int, dof: int = 4, degree: int = 3) -> dict:
    """Run ``sweeps`` R-CMTF-BSD sweeps (``jb.decouple``, tol = 0) on an MLP's structured
    Jacobian, float32. Meant to run in a fresh process (see :func:`bench_headline`).

    Returns:
      timings (``setup_s``, ``compile_s``, ``run_s``), ``peak_rss_bytes`` and the final errors.
    """
    t0 = time.perf_counter()
    rss_start = _vm_hwm_bytes()
    jac, F, X = mlp_problem(m, hidden, S)
    block((jac, F, X))
    config = jb.CMTFConfig(rank=r, basis=jb.BSpline(degree, dof), max_iter=sweeps, tol=0.0)
    key = jax.random.key(0)
    t1 = time.perf_counter()
    fn = jax.jit(lambda jac, F, X, key: jb.decouple(jac, F, X, config, key=key))
    compiled = fn.lower(jac, F, X, key).compile()
    t2 = time.perf_counter()
    res = block(compiled(jac, F, X, key))
    t3 = time.perf_counter()
    check_dtype("headline model", res.model, jnp.float32)
    return {
        "m": m, "hidden": hidden, "S": S, "r": r, "sweeps": sweeps, "dtype": "float32",
        "setup_s": t1 - t0, "compile_s": t2 - t1, "run_s": t3 - t2,
        "iterations": int(res.iterations), "status": int(res.status),
        "error_J": float(res.error_J), "error_F": float(res.error_F),
        "peak_rss_bytes": _vm_hwm_bytes(), "rss_at_start_bytes": rss_start,
    }


def bench_headline(
    m: int = 768, hidden: int = 3072, S: int = 1024, r: int = 768, sweeps: int = 100,
    measured_sweeps: int | None = None, subprocess_: bool = True, timeout: float = 900,
) -> list[Row]:
    """(c, headline) ``sweeps`` sweeps on a ViT-B-sized MLP, wall time and peak memory.

    Runs :func:`headline_worker` in a fresh Python process (so the peak RSS is this job's
    alone) with ``measured_sweeps`` sweeps (default: all); with fewer, the run time is
    extrapolated linearly to ``sweeps`` and the row says so.
    """
    measured = measured_sweeps or sweeps
    args = dict(m=m, hidden=hidden, S=S, r=r, sweeps=measured)
    if subprocess_:
        out = run_worker("--headline-worker", args, timeout)
        if out is None:
            raise RuntimeError(f"headline worker did not finish within {timeout:.0f} s")
    else:
        out = headline_worker(**args)
    scale = sweeps / measured
    total = out["compile_s"] + out["run_s"] * scale
    label = "measured" if measured == sweeps else f"EXTRAPOLATED from {measured} sweeps (x{scale:g})"
    size = f"m={m} H={hidden} S={S} r={r} f32 ν=4 d=3"
    peak = out["peak_rss_bytes"]
    # Targets: 30 s on the 2-core CPU; on a GPU 5 s in all and 5 s of compilation.
    wall_target, compile_target = (5.0, 5.0) if on_accelerator() else (30.0, None)
    return [
        Row(
            f"(c) headline: {sweeps} sweeps, wall",
            total, wall_target, total / wall_target, f"<= {wall_target:g} s", total <= wall_target,
            note=f"{size}; compile {out['compile_s']:.1f} s + run {out['run_s'] * scale:.1f} s "
            f"({out['run_s'] / measured:.2f} s/sweep), {label}; ratio = wall / {wall_target:g} s",
            details=out,
        ),
        Row(
            "(c) headline: compile",
            out["compile_s"], compile_target, None if compile_target is None else out["compile_s"] / compile_target,
            "info" if compile_target is None else f"<= {compile_target:g} s",
            None if compile_target is None else out["compile_s"] <= compile_target,
            note=f"{size}; jax.jit(decouple).lower().compile(), paid once per new shape",
        ),
        Row(
            "(c) headline: peak RSS",
            None if peak is None else peak / GiB, 4.0, None if peak is None else peak / GiB / 4.0,
            "<= 4 GiB", None if peak is None else peak <= 4 * GiB, unit="GiB",
            note=f"VmHWM of the whole worker process (JAX runtime included), {label}; ratio = peak / 4 GiB",
        ),
    ]
