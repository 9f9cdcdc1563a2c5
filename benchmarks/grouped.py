"""Grouped compression against one block at a time, side by side in one run.

A 6-block model whose MLPs have the ViT/Fashion-MNIST study's shape (``m = 64``, ``H = 256``,
residual blocks, float32; ``--model minilm``: all-MiniLM-L6-v2's, ``384 → 1536 → 384`` at rank 153
on 4,096 tokens, where compiling is a small share of the solve) is compressed by ``jb.compress_model`` with the defaults (``jb.BSD()``:
300 sweeps, the warm start, held-out selection; ``jb.Refine()``), at the rank a ρ = 0.5
training-free run gives that shape (40), grouped (``group=True``: on this CPU without a mesh the
solve's program then the refinement's, each compiled once for the six blocks,
:func:`jaxbsd.compression.grouped.fuses`), grouped with the solve and the refinement fused in one
program (``fused``: what a mesh or an accelerator runs, forced here by
:data:`jaxbsd.compression.grouped.FUSE`) and one block at a time (``group=False``). Each mode runs
in a fresh subprocess (so each compiles from cold, and its peak memory is its own), the modes
alternating for ``rounds`` rounds (5): a first run (compiles included), then ``repeats`` timed runs. Reported per
mode (medians over the rounds): the first run's and the steady wall time, the XLA backend
compiles of the first run (``jax.monitoring``), those of the solver's and the refinement's
programs by name, where the first run's compile time goes (tracing, lowering, XLA's compile, and
XLA's compile of those programs alone), and the process's peak resident memory. Ratios are one
block at a time / grouped (``fused_*``: one block at a time / fused).

Also: the exported CUDA program of a group of 6 blocks × 4 restarts (``jax.export``, lowered on
this CPU): its count of device-side loops; and the sweep as a multiple of this machine's GEMM
bound, at the paper's size (dense Jacobian, row (f) of ``benchmarks/run.py``: :mod:`benchmarks.sweep`)
and at a MiniLM MLP's size (384 → 1536 → 384, S = 256, the structured Jacobian ``compress_model`` solves, at the
real-model study's ranks), with a profile of where a sweep's time goes.

Usage::

    python benchmarks/grouped.py                  # writes benchmarks/grouped.json
    python benchmarks/grouped.py --model minilm   # the comparison on MiniLM-size MLPs: grouped_minilm.json
    python benchmarks/grouped.py --quick          # fewer sweeps, rounds and ranks, to a scratch file
"""

from __future__ import annotations

import argparse
import json
import pathlib
import resource
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

#: The compressed models, 6 residual blocks each: the ViT study's MLP shape at the rank a rho = 0.5
#: training-free run gives it, and MiniLM's (all-MiniLM-L6-v2: 384 -> 1536 -> 384) at the real-model
#: study's rank at s = 0.9 on its calibration (32 windows of 128 tokens).
MODELS = {"vit": dict(blocks=6, m=64, H=256, rank=40, tokens=(32, 64)),
          "minilm": dict(blocks=6, m=384, H=1536, rank=153, tokens=(32, 128))}
#: The programs of the solve and the refinement: one block at a time's (jaxbsd.solver.driver, refine) and
#: a group's (on the CPU without a mesh the one-block program of jaxbsd.compression.devices.run_blocks,
#: named after the function it runs; otherwise jaxbsd.compression.devices._program).
SOLVER_PROGRAMS = ("jit(decouple_compiled)", "jit(refine_loop)", "jit(_solve_and_refine_block)", "jit(solve_block)",
                   "jit(_refine_block)",
                   "jit(program)")
#: jax.monitoring's compile events, by the stage a first run's profile names them.
COMPILE_STAGES = {"/jax/core/compile/jaxpr_trace_duration": "tracing",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration": "lowering",
                  "/jax/core/compile/backend_compile_duration": "XLA compile"}
#: A MiniLM MLP (all-MiniLM-L6-v2: 384 → 1536 → 384) and the real-model study's ranks (s = 0.9, 0.7, 0.5).
MINILM = dict(S=256, m=384, H=1536)
MINILM_RANKS = (153, 459, 765)


def planted_group(G: int, S: int = 64, m: int = 12, h: int = 32) -> tuple:
    """``G`` blocks of one MLP problem (``S`` samples, ``m → h → m``, sigmoid, float32), stacked
    as a group program takes them (keys, problems, no warm start)."""
    import jax
    import jax.numpy as jnp

    from jaxbsd.compression import devices as dv
    from jaxbsd.solver.driver import problem
    from jaxbsd.solver.jacobians import mlp_jacobian

    X = jax.random.normal(jax.random.key(0), (S, m), jnp.float32)
    V0 = jax.random.normal(jax.random.key(1), (h, m), jnp.float32)
    V1 = jax.random.normal(jax.random.key(2), (m, h), jnp.float32)
    prob = problem(mlp_jacobian(X, V0, jnp.zeros(h, jnp.float32), V1, jax.nn.sigmoid), X @ V0.T @ V1.T, X)
    return dv._stack_on_host([(jax.random.key_data(jax.random.key(i)), prob, None) for i in range(G)])


def cuda_export_loops(G: int = 6, restarts: int = 4) -> dict:
    """The group program of ``G`` blocks × ``restarts`` restarts (rank 3, ``m = 12``) exported for
    CUDA from this CPU: how many device-side loops (``stablehlo.while``) it has, and whether one
    carries all blocks' restarts (``G × restarts`` leading axes)."""
    import re

    import jax

    import jaxbsd as jb
    from jaxbsd.compression import devices as dv

    m, r = 12, 3
    config = jb.CMTFConfig(rank=r, basis=jb.BSpline(3, 4), max_iter=20)
    program = dv._program(dv.solve_block, (("batch", "vmap"), ("restarts", restarts)), None, None, True)
    text = jax.export.export(program, platforms=("cuda",))(planted_group(G, m=m), config).mlir_module()
    return {"blocks": G, "restarts": restarts, "while_loops": len(re.findall(r"stablehlo\.while", text)),
            "carry_holds_all": bool(re.search(rf"tensor<{G}x{restarts}x{m}x{r}x", text))}


def structured_sweep_rows(ranks, sweeps: int, repeats: int, peak: float) -> list:
    """The sweep of a MiniLM-size MLP's decoupling (structured Jacobian, float32, one restart)
    against this machine's GEMM bound ``4·r·H·(S + m + n)`` FLOP per sweep (``peak``: the GEMM
    rate, FLOP/s), at each rank; with a profile of one sweep from its parts, each jitted alone
    (medians over ``repeats``)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jaxbsd as jb
    from benchmarks.common import Row, interleaved
    from jaxbsd.solver import cmtf, linalg
    from jaxbsd.solver.jacobians import mlp_jacobian

    S, m, h = MINILM["S"], MINILM["m"], MINILM["H"]
    n = m
    rng = np.random.default_rng(0)
    X = jnp.asarray(rng.standard_normal((S, m)), jnp.float32)
    V0 = jnp.asarray(rng.standard_normal((h, m)) / np.sqrt(m), jnp.float32)
    V1 = jnp.asarray(rng.standard_normal((n, h)) / np.sqrt(h), jnp.float32)
    b0 = jnp.zeros(h, jnp.float32)
    gelu_prime = jax.vmap(jax.vmap(jax.grad(lambda z: jax.nn.gelu(z, approximate=False))))
    jac = mlp_jacobian(X, V0, b0, V1, gelu_prime)
    F = jax.nn.gelu(X @ V0.T + b0, approximate=False) @ V1.T
    prob = jb.solver.problem(jac, F, X)
    rows = []
    for r in ranks:
        full = jb.CMTFConfig(rank=r, basis=jb.BSpline(3, 4), max_iter=sweeps, tol=0.0)
        one = full.replace(max_iter=1)
        key = jax.random.key(0)
        cfg = full.cast(jnp.float32)
        state = cmtf.init_state(key, prob, full)
        sweep = jax.jit(lambda st: cmtf._sweep(st, prob, cfg, prob.jac.sq_norm()))
        state = sweep(sweep(state)[0])[0]  # two sweeps in: the factors a sweep meets in practice
        W0, W1, G, R = state.W0, state.W1, state.G, state.R
        mu = jnp.asarray(cfg.effective_mu_w, jnp.float32)
        parts = {
            "contractions": (jax.jit(lambda W0, W1, G: (jac.mttkrp_w1(W0, G), jac.mttkrp_w0_from(jac.contract_w1(W1), G),
                                                         jac.mttkrp_g_from(jac.contract_w1(W1), W0))), (W0, W1, G)),
            "W1, W0 (Tikhonov)": (jax.jit(lambda A, B1, B0: (linalg.tikhonov_solve(A, B1, mu), linalg.tikhonov_solve(A, B0, mu))),
                                  ((G.T @ G) * (W0 @ W0.T), jnp.ones((n, r), jnp.float32), jnp.ones((m, r), jnp.float32))),
            "G (certified pinv)": (jax.jit(linalg.pinv_solve), ((W0 @ W0.T) * (W1.T @ W1), G)),
            # as the sweep: through the n x n Gram at r > n, else the r x r one (eigh at r = n)
            "R (n x n Gram)" if r > n else "R": (jax.jit(lambda W1: linalg.wide_least_squares(W1, F) if r > n else
                                                         (linalg.pinv_solve_by_eigh if r == n else linalg.pinv_solve)(
                                                             W1.T @ W1, F @ W1)), (W1,)),
            "projection (knots, design, coefficients)": (jax.jit(lambda W0, G, R: cmtf._project(X, W0, G, R, cfg)), (W0, G, R)),
            "whole sweep": (sweep, (state,)),
        }
        if r > n:  # the R update before this issue: the r x r Gram's eigendecomposition
            parts["(was: R by r x r eigh)"] = (jax.jit(lambda W1: linalg.pinv_solve_by_eigh(W1.T @ W1, F @ W1)), (W1,))
        calls = {"run": lambda: jax.block_until_ready(jb.decouple(jac, F, X, full, key=key, restarts=1)),
                 "run1": lambda: jax.block_until_ready(jb.decouple(jac, F, X, one, key=key, restarts=1))}
        calls.update({k: (lambda f=f, a=a: jax.block_until_ready(f(*a))) for k, (f, a) in parts.items()})
        t = {k: v["median"] for k, v in interleaved(calls, repeats=repeats).items()}
        per_sweep = (t["run"] - t["run1"]) / (sweeps - 1)  # the loop's sweep, without the run's fixed costs
        bound = 4 * r * h * (S + m + n) / peak
        named = [k for k in parts if k not in ("whole sweep",) and not k.startswith("(was")]
        rest = t["whole sweep"] - sum(t[k] for k in named)
        profile = ", ".join(f"{k} {t[k] * 1e3:.1f} ms" for k in parts) + f", rest {rest * 1e3:.1f} ms"
        rows.append(Row(f"sweep / matmul bound [MiniLM MLP, r={r}]", per_sweep, bound, per_sweep / bound, "—", None,
                        note=(f"S={S} m=n={m} H={h} r={r} ν=4 d=3 f32, structured Jacobian; peak {peak / 1e9:.0f} GFLOP/s "
                              f"(2048³ f32 GEMM); bound 4·r·H·(S+m+n)/peak = {bound * 1e3:.1f} ms; in the loop "
                              f"{per_sweep * 1e3:.1f} ms/sweep (runs of {sweeps} and 1 sweeps, differenced); "
                              f"a whole run of {sweeps} sweeps {t['run']:.2f} s; profile: {profile}"),
                        details={"parts_s": {k: t[k] for k in parts}, "rest_s": rest, "run_s": t["run"],
                                 "run1_s": t["run1"], "peak_flops": peak}))
    return rows


#: The modes compared, in the order each round runs them.
MODES = ("sequential", "grouped", "fused")


def child(mode: str, quick: bool, repeats: int, model: str = "vit") -> dict:
    """One mode in this process: ``{"first": s, "steady": [s...], "compiles": k, "peak_rss_mib": x}``."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    import jaxbsd as jb
    from jaxbsd.compression import grouped

    grouped.FUSE = True if mode == "fused" else None  # fused: the one program a mesh or an accelerator runs

    compiles = [0]
    by_name: dict[str, int] = {}
    # Where a first run's compile time goes: tracing to a jaxpr, lowering it, XLA's compile (all
    # programs, and the solver's and refinement's alone).
    seconds = {stage: 0.0 for stage in (*COMPILE_STAGES.values(), "solver programs (XLA)")}

    def on_event(event, secs, **kw):
        name = str(kw.get("fun_name", "?"))
        if event in COMPILE_STAGES:
            seconds[COMPILE_STAGES[event]] += secs
        if event == "/jax/core/compile/backend_compile_duration":
            compiles[0] += 1
            by_name[name] = by_name.get(name, 0) + 1
            if name in SOLVER_PROGRAMS:
                seconds["solver programs (XLA)"] += secs

    jax.monitoring.register_event_duration_secs_listener(on_event)

    shape = MODELS[model]
    BLOCKS, M, H, RANK, TOKENS = (shape[k] for k in ("blocks", "m", "H", "rank", "tokens"))

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.fc1, self.fc2 = nnx.Linear(M, H, rngs=rngs), nnx.Linear(H, M, rngs=rngs)

        def __call__(self, x):
            return self.fc2(jax.nn.gelu(self.fc1(x)))

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.mlp = MLP(rngs)

        def __call__(self, x):
            return x + self.mlp(x)

    class Net(nnx.Module):
        def __init__(self):
            rngs = nnx.Rngs(0)
            self.blocks = nnx.List([Block(rngs) for _ in range(BLOCKS)])

        def __call__(self, x):
            for b in self.blocks:
                x = b(x)
            return x

    x = jax.random.normal(jax.random.key(1), (*TOKENS, M), jnp.float32)
    paths = [f"blocks.{i}.mlp" for i in range(BLOCKS)]
    spec = jb.MLPSpec("fc1", "fc2", "gelu_tanh")
    method = jb.BSD(config=jb.compression.methods.DEFAULT_CONFIG.replace(max_iter=60) if quick else
                    jb.compression.methods.DEFAULT_CONFIG)
    refine = jb.Refine(steps=60) if quick else jb.Refine()

    def once():
        model = Net()
        jb.compress_model(model, x, mlps=paths, ranks={p: RANK for p in paths}, method=method, refine=refine, key=jax.random.key(0), mlp_specs=spec, execution=jb.Execution(group=mode != "sequential"))
        jax.block_until_ready(nnx.state(model))

    t0 = time.perf_counter()
    once()
    first, first_compiles, first_seconds = time.perf_counter() - t0, compiles[0], dict(seconds)
    programs = {name: k for name, k in by_name.items() if name in SOLVER_PROGRAMS}
    steady = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        once()
        steady.append(time.perf_counter() - t0)
    return {"mode": mode, "first": first, "steady": steady, "compiles": first_compiles, "solver_programs": programs,
            "compiles_steady": compiles[0] - first_compiles, "compile_seconds": first_seconds,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None, help="alternating subprocess rounds per mode")
    parser.add_argument("--model", choices=tuple(MODELS), default="vit",
                        help="the compressed model (minilm: the model comparison only, to grouped_minilm.json)")
    args = parser.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    if args.child:
        print(json.dumps(child(args.child, args.quick, repeats, args.model)))
        return 0
    # Five rounds: a first run's time varies by ~10 % from round to round on this shared CPU, and
    # "not slower" is judged against that spread.
    default_rounds = 1 if args.quick else 5
    rounds = args.rounds or default_rounds
    runs: dict[str, list] = {mode: [] for mode in MODES}
    for _ in range(rounds):
        for mode in MODES:
            command = ([sys.executable, __file__, "--child", mode, "--repeats", str(repeats), "--model", args.model]
                       + (["--quick"] if args.quick else []))
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            runs[mode].append(json.loads(out.strip().splitlines()[-1]))
    med = statistics.median
    summary = {mode: {"first": med(r["first"] for r in rs), "steady": med(t for r in rs for t in r["steady"]),
                      "compiles": med(r["compiles"] for r in rs), "solver_programs": rs[0]["solver_programs"],
                      "peak_rss_mib": med(r["peak_rss_mib"] for r in rs),
                      "compile_seconds": {k: med(r["compile_seconds"][k] for r in rs) for k in rs[0]["compile_seconds"]},
                      "first_runs": [r["first"] for r in rs]} for mode, rs in runs.items()}
    seq, grp, fus = summary["sequential"], summary["grouped"], summary["fused"]
    ratios = {}
    for prefix, other in (("", grp), ("fused_", fus)):
        ratios.update({prefix + "first_run": seq["first"] / other["first"],
                       prefix + "steady_median": seq["steady"] / other["steady"],
                       prefix + "compiles": seq["compiles"] / max(other["compiles"], 1),
                       prefix + "peak_rss": seq["peak_rss_mib"] / other["peak_rss_mib"]})
    print(f"{'':34s}{'one at a time':>16s}{'grouped':>12s}{'ratio':>9s}{'fused':>12s}{'ratio':>9s}")

    def line(name, key, fmt, ratio=None):
        a, b, c = seq[key], grp[key], fus[key]
        tail = "" if ratio is None else f"{ratios[ratio]:9.2f}{c:12{fmt}}{ratios['fused_' + ratio]:9.2f}"
        print(f"{name:34s}{a:16{fmt}}{b:12{fmt}}" + tail)

    line("first run (compiles), s", "first", ".2f", "first_run")
    print(f"{'  (each round)':34s}" + "   |   ".join(" ".join(f"{x:.1f}" for x in r["first_runs"]) for r in (seq, grp, fus)))
    line("steady run (median), s", "steady", ".2f", "steady_median")
    line("XLA compiles, first run", "compiles", ".0f", "compiles")
    print(f"{'  solver + refinement programs':34s}" + " | ".join(str(r["solver_programs"]) for r in (seq, grp, fus)))
    for stage in seq["compile_seconds"]:
        a, b, c = (r["compile_seconds"][stage] for r in (seq, grp, fus))
        print(f"{'  first run: ' + stage + ', s':34s}{a:16.2f}{b:12.2f}{a / max(b, 1e-9):9.2f}{c:12.2f}{a / max(c, 1e-9):9.2f}")
    line("peak RSS, MiB", "peak_rss_mib", ".0f", "peak_rss")
    from jaxbsd.io import provenance, write_json_atomic
    import jax

    stem = "grouped" if args.model == "vit" else f"grouped_{args.model}"
    out = args.out or (pathlib.Path(f"/tmp/{stem}_quick.json") if args.quick else HERE / f"{stem}.json")
    cmd = "python benchmarks/grouped.py" + (" --quick" if args.quick else "") + \
        (f" --model {args.model}" if args.model != "vit" else "") + (f" --rounds {rounds}" if rounds != default_rounds else "")
    payload = {"command": cmd, "mode": "quick" if args.quick else "full", "device": jax.devices()[0].platform,
               "model": dict(MODELS[args.model], name=args.model), "rounds": rounds, "runs": runs, "results": summary,
               "ratios": ratios}
    if args.model == "vit":  # the export and the sweep rows do not depend on the model compared
        payload["cuda_export"] = export = cuda_export_loops()
        print(f"CUDA export of a group of {export['blocks']} blocks x {export['restarts']} restarts: "
              f"{export['while_loops']} stablehlo.while, carrying every block's restarts: {export['carry_holds_all']}")
        from benchmarks.common import format_table
        from benchmarks.sweep import bench_matmul_bound, gemm_peak

        # One GEMM peak for every bound row (two measurements in one run differed by 1.5x).
        repeats_bound = 2 if args.quick else 3
        peak = gemm_peak(2048, repeats=repeats_bound)
        # The paper's size: row (f) of benchmarks/run.py (dense Jacobian, 1 and 4 restarts).
        bound_rows = []
        for row in bench_matmul_bound(S=128, n=64, m=64, r=64, restarts=4, sweeps=5 if args.quick else 20,
                                      repeats=repeats_bound, peak=peak)[:2]:
            row.name = f"{row.name} [paper]"
            bound_rows.append(row)
        bound_rows += structured_sweep_rows(MINILM_RANKS[:1] if args.quick else MINILM_RANKS,
                                            sweeps=4 if args.quick else 10, repeats=repeats_bound, peak=peak)
        print(format_table(bound_rows))
        payload["sweep_vs_bound"] = [r.__dict__ for r in bound_rows]
    write_json_atomic(out, dict(payload, provenance=provenance(cmd)))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
