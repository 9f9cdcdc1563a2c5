"""Gated-MLP scale rows: ``python benchmarks/gated.py [--d 256 512 1024] [--out FILE.json]``.

One float32 R-CMTF-BSD sweep through :class:`jaxbsd.GatedJacobian` (the structured Jacobian of
a SwiGLU MLP ``d → 3d → d``, never materialized) against the same sweep through
:class:`jaxbsd.DenseJacobian` (the ``(S, d, d)`` tensor in the solver's three layouts), at
``S = 128`` samples and rank ``r = 64``. For each ``d``:

* time: the median of interleaved repeats (:func:`benchmarks.common.interleaved`) of the sweep as
  it runs inside :func:`jaxbsd.solve`'s loop, i.e. with ``‖𝒥‖²`` computed once beforehand
  (XLA hoists it out of the loop); the one-off ``‖𝒥‖²`` of the gated operator is timed
  separately (``details["sq_norm_s"]``), and so is building each Jacobian;
* memory (deterministic, no sampling): the bytes of the problem's and state's arrays as they
  sit in memory between sweeps, plus the compiled sweep's scratch (``temp`` of
  ``memory_analysis()``), i.e. the sweep's peak footprint apart from its (small) outputs; the
  one-off ``‖𝒥‖²``'s scratch (``H × H`` Gram blocks) is in ``details["sq_norm_temp_bytes"]``;
* the same iterate from both (relative difference of ``W1``), so the rows compare equals.

Ratios read as ``dense / gated`` (above 1: the structured operator wins). Dense is skipped
where its three layouts would exceed ``dense_max_bytes``. :func:`bench_gated` is row (h) of
``benchmarks/run.py``; ``tests/test_gated_benchmark.py`` runs it at a tiny size.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python benchmarks/gated.py` puts benchmarks/ first, not the root
    sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxbsd as jb  # noqa: E402
from jaxbsd.solver import cmtf  # noqa: E402
from jaxbsd.solver.jacobians import GatedJacobian  # noqa: E402

from benchmarks.common import GiB, Row, block, check_dtype, format_table, interleaved, jsonable, rel_diff  # noqa: E402

__all__ = ["gated_problem", "dense_from_gated", "bench_gated", "main"]


def gated_problem(d: int, hidden: int, S: int, seed: int = 0, dtype=np.float32):
    """A random SwiGLU MLP ``d → hidden → d`` (fan-in scaled weights, no biases, as in Llama and
    Qwen; unit-normal inputs as after an RMSNorm) and its gated Jacobian at ``S`` points.

    Returns:
      ``(jac, F, X)``: a :class:`~jaxbsd.GatedJacobian`, ``F (S, d)``, ``X (S, d)``.
    """
    rng = np.random.default_rng(seed)
    normal = lambda *shape: jnp.asarray(rng.standard_normal(shape).astype(dtype))  # noqa: E731
    gate = normal(hidden, d) / math.sqrt(d)
    up = normal(hidden, d) / math.sqrt(d)
    down = normal(d, hidden) / math.sqrt(hidden)
    X = normal(S, d)
    return _build(X, gate, up, down)


@jax.jit
def _build(X, gate, up, down):
    jac = jb.solver.gated_mlp_jacobian(X, gate, up, down, jax.nn.silu)
    return jac, jb.solver.gated_mlp(X, gate, up, down, jax.nn.silu), X


@jax.jit
def _dense_chunks(V1, Vg, Vu, Dg_chunks, Du_chunks):
    # J[s] = V1 (diag(Dg[s]) Vg + diag(Du[s]) Vu), a chunk of samples at a time.
    one = lambda dg, du: jnp.einsum("ah,chb->cab", V1, dg[:, :, None] * Vg[None] + du[:, :, None] * Vu[None])  # noqa: E731
    return jax.lax.map(lambda c: one(*c), (Dg_chunks, Du_chunks))


def dense_from_gated(jac: GatedJacobian, chunk: int = 4) -> jb.solver.DenseJacobian:
    """The ``(S, n, m)`` tensor of ``jac`` in the solver's three layouts
    (:meth:`~jaxbsd.DenseJacobian.from_dense`), ``chunk`` samples at a time."""
    S, n, m = jac.shape
    chunk = math.gcd(S, chunk)
    split = lambda D: D.reshape(S // chunk, chunk, -1)  # noqa: E731
    J = _dense_chunks(jac.V1, jac.Vg, jac.Vu, split(jac.Dg), split(jac.Du)).reshape(S, n, m)
    return jb.solver.DenseJacobian.from_dense(J)


def _loop_sweep(state, problem, config, sq_norm_J):
    # One sweep as inside jb.solver.solve's loop: ‖𝒥‖² is loop-invariant there (computed once).
    return cmtf._sweep(state, problem, config.cast(problem.F.dtype), sq_norm_J)[0]


_loop_sweep_jit = jax.jit(_loop_sweep)
_sq_norm_jit = jax.jit(lambda jac: jac.sq_norm())
_init_jit = jax.jit(jb.solver.init_state)


def _footprint(state, problem, config, sq_norm_J) -> dict:
    """Bytes of the sweep: ``resident`` (every array of the problem and the state, as they sit
    in memory between sweeps; the compiled sweep may not read all of them: the dense sweep
    never reads ``J`` itself, only its two other layouts), and from the compiled sweep's
    ``memory_analysis()`` its ``argument``, ``temp`` and ``output`` bytes.
    ``peak = resident + temp``."""
    resident = sum(int(x.nbytes) for x in jax.tree_util.tree_leaves((state, problem)))
    mem = _loop_sweep_jit.lower(state, problem, config, sq_norm_J).compile().memory_analysis()
    out = {"resident": resident}
    if mem is not None:  # None on backends without the analysis
        out.update({k: int(getattr(mem, f"{k}_size_in_bytes")) for k in ("argument", "temp", "output", "alias")})
    out["peak"] = resident + out.get("temp", 0)
    return out


def _timed(fn):
    t0 = time.perf_counter()
    out = block(fn())
    return out, time.perf_counter() - t0


def bench_gated(
    ds: tuple[int, ...] = (256, 512, 1024),
    hidden_factor: int = 3,
    S: int = 128,
    r: int = 64,
    dof: int = 4,
    degree: int = 3,
    repeats: int = 3,
    dense_max_bytes: float = 8 * GiB,
) -> list[Row]:
    """One float32 sweep through the gated operator vs the dense one at each ``d``; two rows
    per size (time and memory), ratios ``dense / gated``. See the module docstring."""
    rows = []
    for d in ds:
        H = hidden_factor * d
        (jac, F, X), t_build = _timed(lambda d=d, H=H: gated_problem(d, H, S))
        config = jb.CMTFConfig(rank=r, basis=jb.BSpline(degree, dof))
        p_gated = jb.solver.Problem(jac, F, X)
        state = _init_jit(jax.random.key(0), p_gated, config)
        _sq_norm_jit(jac)  # compile
        norm_g, t_norm = _timed(lambda j=jac: _sq_norm_jit(j))
        check_dtype("gated sweep", _loop_sweep_jit(state, p_gated, config, norm_g), jnp.float32)
        fns = {"gated": lambda s=state, p=p_gated, c=config, nj=norm_g: block(_loop_sweep_jit(s, p, c, nj))}
        mem = {"gated": _footprint(state, p_gated, config, norm_g)}
        dense_bytes = 3 * S * d * d * 4
        norm_mem = _sq_norm_jit.lower(jac).compile().memory_analysis()
        details = {"d": d, "H": H, "S": S, "r": r, "build_gated_s": t_build, "sq_norm_s": t_norm,
                   "sq_norm_temp_bytes": None if norm_mem is None else int(norm_mem.temp_size_in_bytes),
                   "dense_tensor_bytes": dense_bytes, "memory": mem}
        p_dense = None
        if dense_bytes <= dense_max_bytes:
            dense, t_dense_build = _timed(lambda j=jac: dense_from_gated(j))
            p_dense = jb.solver.Problem(dense, F, X)
            norm_d = block(_sq_norm_jit(dense))
            fns["dense"] = lambda s=state, p=p_dense, c=config, nj=norm_d: block(_loop_sweep_jit(s, p, c, nj))
            mem["dense"] = _footprint(state, p_dense, config, norm_d)
            details["build_dense_s"] = t_dense_build
            details["rel_diff_sq_norm"] = rel_diff(norm_g, norm_d)
            details["rel_diff_W1"] = rel_diff(fns["gated"]().W1, fns["dense"]().W1)
        t = interleaved(fns, repeats=repeats)
        details["timings"] = t
        tg = t["gated"]["median"]
        size = f"d={d}, H={H}, S={S}, r={r}, f32"
        if p_dense is None:
            rows.append(Row(f"gated sweep, d={d} (dense skipped)", tg, None, None, "info", None,
                            note=f"{size}; dense J ({dense_bytes / GiB:.1f} GiB in 3 layouts) over "
                            f"dense_max_bytes; ‖J‖² once {t_norm:.3g} s", details=details))
            rows.append(Row(f"gated sweep memory, d={d}", mem["gated"].get("peak", 0) / 2**20, None, None,
                            "info", None, unit="MiB", note="resident arrays + temp bytes of the compiled sweep"))
        else:
            td = t["dense"]["median"]
            rows.append(Row(f"gated sweep vs dense, d={d}", tg, td, td / tg, "info", None,
                            ratio_min=t["dense"]["min"] / t["gated"]["min"],
                            note=f"{size}; ‖J‖² once {t_norm:.3g} s (not in the sweep); "
                            f"rel. diff W1 {details['rel_diff_W1']:.1e}", details=details))
            pg, pd = mem["gated"].get("peak"), mem["dense"].get("peak")
            if pg and pd:
                rows.append(Row(f"gated sweep memory vs dense, d={d}", pg / 2**20, pd / 2**20, pd / pg, "info",
                                None, unit="MiB", note="resident arrays + temp bytes of the compiled sweep "
                                "(memory_analysis); dense holds J in 3 layouts"))
        del p_dense, fns
        gc.collect()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, nargs="+", default=[256, 512, 1024], help="model widths")
    parser.add_argument("--S", type=int, default=128)
    parser.add_argument("--r", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dense-max-gib", type=float, default=8.0, help="skip dense above this size (3 layouts)")
    parser.add_argument("--out", default=None, help="JSON output path (default: print only)")
    args = parser.parse_args(argv)
    device = jax.devices()[0]
    print(f"gated-MLP rows on {device.platform} ({device.device_kind})", flush=True)
    rows = bench_gated(tuple(args.d), S=args.S, r=args.r, repeats=args.repeats,
                       dense_max_bytes=args.dense_max_gib * GiB)
    print(format_table(rows))
    if args.out:
        record = {"command": "python benchmarks/gated.py " + " ".join(sys.argv[1:] if argv is None else argv),
                  "device": f"{device.platform} ({device.device_kind})",
                  "rows": [dataclasses.asdict(r) for r in rows]}
        Path(args.out).write_text(json.dumps(jsonable(record), indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
