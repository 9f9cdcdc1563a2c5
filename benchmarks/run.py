"""jaxbsd benchmark suite: ``python benchmarks/run.py [--quick] [--out benchmarks/results.json]``.

One run measures, side by side and interleaved (warm-up, then the median of several repeats,
the order of the compared functions alternating between repeats), the rows of its plan
(:func:`plan`), a letter each, every subject in its own module:

(a) one jitted sweep vs the NumPy baseline (:mod:`benchmarks.sweep`);
(b) 16 vmapped restarts vs one (:mod:`benchmarks.restarts`, each case in a fresh process);
(c) a sweep through ``StructuredJacobian`` vs ``DenseJacobian`` (:mod:`benchmarks.structured`) and
    the ViT-B headline, 100 sweeps in a fresh process (:mod:`benchmarks.headline`);
(d) ``DecoupledMLP`` vs the ``MLP`` it replaces (:mod:`benchmarks.decoupled_mlp`);
(e) our sweep vs tensorly's CP-ALS, per iteration (:mod:`benchmarks.tensorly_cp`);
(f) ``jaxbsd.decouple`` per sweep against this machine's matmul bound (:mod:`benchmarks.sweep`);
(g) batching and compilation at the paper size (:mod:`benchmarks.batching`);
(h) a sweep through the gated-MLP operator vs the dense one (:mod:`benchmarks.gated`).

``--only LETTERS`` runs a subset; ``--list`` prints every benchmark subject, those with their own
script (grouped, distill, refine, minilm, gated, compile_cache, scale) included, and the command that runs each.
The fresh-process workers of rows (b) and (c) are this script's ``--restarts-worker`` and
``--headline-worker`` flags (:func:`benchmarks.common.run_worker`).

Runs in the default environment: no thread variables (``import jaxbsd`` configures the BLAS
behind jaxlib's LAPACK kernels itself).

Prints one table (name, ours, reference, ratio, target, pass) and writes JSON with the raw
timings, the machine facts and the exact command. The benchmark functions take their sizes as
arguments so ``tests/test_benchmarks.py`` can smoke-run them at tiny sizes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python benchmarks/run.py` puts benchmarks/ first, not the root
    sys.path.insert(0, str(ROOT))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)  # float64 where stated; float32 is always explicit

import numpy as np  # noqa: E402

import jaxbsd as jb  # noqa: E402
from jaxbsd.io import provenance, write_json_atomic  # noqa: E402

from benchmarks.batching import bench_batching  # noqa: E402
from benchmarks.common import Row, format_table, interleaved, jsonable, on_accelerator  # noqa: E402
from benchmarks.decoupled_mlp import bench_decoupled_mlp  # noqa: E402
from benchmarks.gated import bench_gated  # noqa: E402
from benchmarks.headline import bench_headline, headline_worker  # noqa: E402
from benchmarks.restarts import bench_restarts, restarts_worker  # noqa: E402
from benchmarks.structured import bench_structured_vs_dense  # noqa: E402
from benchmarks.sweep import bench_matmul_bound, bench_sweep_vs_numpy  # noqa: E402
from benchmarks.tensorly_cp import bench_tensorly  # noqa: E402

__all__ = [
    "Row",
    "interleaved",
    "bench_sweep_vs_numpy",
    "bench_matmul_bound",
    "bench_restarts",
    "bench_structured_vs_dense",
    "bench_headline",
    "bench_decoupled_mlp",
    "bench_tensorly",
    "bench_batching",
    "SUBJECTS",
    "plan",
    "main",
]

_RUN = "python benchmarks/run.py --only "

#: Every benchmark subject: ``(name, module of benchmarks/, what it measures, the command that
#: runs it)``. The letters are :func:`plan`'s rows (they write ``benchmarks/results.json``); the
#: others are scripts of their own, each writing ``benchmarks/<name>.json``.
SUBJECTS: tuple[tuple[str, str, str, str], ...] = (
    ("a", "sweep", "one jitted sweep (float64) vs the NumPy baseline, from the same state", _RUN + "a"),
    ("b", "restarts", "16 vmapped restarts vs one (jb.decouple, tol = 0), each case in a fresh process", _RUN + "b"),
    ("c", "structured, headline", "a sweep, StructuredJacobian vs DenseJacobian; the ViT-B headline "
     "(100 sweeps: wall, compile, peak RSS)", _RUN + "c"),
    ("d", "decoupled_mlp", "the DecoupledMLP forward vs the MLP it replaces; the spline evaluation alone", _RUN + "d"),
    ("e", "tensorly_cp", "our sweep vs tensorly's CP-ALS (parafac), per iteration", _RUN + "e"),
    ("f", "sweep", "jb.decouple per sweep (1 and 16 restarts) vs this machine's matmul bound, with a profile",
     _RUN + "f"),
    ("g", "batching", "16 seeds and a 3 λ × 16 seeds grid in one program vs one restart; compile times", _RUN + "g"),
    ("h", "gated", "a sweep through GatedJacobian (SwiGLU) vs DenseJacobian: time and memory", _RUN + "h"),
    ("gated", "gated", "row (h) on its own, at the widths given (prints; --out FILE writes JSON)",
     "python benchmarks/gated.py --d 256 512 1024"),
    ("grouped", "grouped", "grouped compression vs one block at a time, fresh processes; sweep vs GEMM bound",
     "python benchmarks/grouped.py"),
    ("distill", "distill", "the whole-model distillation stage vs the compression it follows",
     "python benchmarks/distill.py"),
    ("refine", "refine", "the refinement stage of one replacement vs its decoupling", "python benchmarks/refine.py"),
    ("minilm", "minilm", "one all-MiniLM-L6-v2 MLP decoupled at the study's ranks, vs its matmul bound and pruning",
     "python benchmarks/minilm.py"),
    ("compile_cache", "compile_cache", "the same jaxbsd compress-hf command twice in fresh processes: XLA compile "
     "seconds without and with the persistent compilation cache", "python benchmarks/compile_cache.py"),
    ("memory", "memory", "RSS over 10 (load MiniLM, prune, evaluate) in one process; one prune's peak RSS vs the "
     "memory model", "python benchmarks/memory.py"),
    ("scale", "scale", "prune a BERT-base-shaped encoder and a 300 M Llama-style decoder (random weights), "
     "refined and not: wall time and peak RSS, fresh processes", "python benchmarks/scale.py"),
)


def list_subjects() -> str:
    """:data:`SUBJECTS` as text, one line each: name, module, what it measures, command."""
    widths = [max(len(s[i]) for s in SUBJECTS) for i in range(3)]
    return "\n".join(f"{name:<{widths[0]}}  {module:<{widths[1]}}  {what:<{widths[2]}}  $ {command}"
                     for name, module, what, command in SUBJECTS)


# --------------------------------------------------------------------------- report


def machine_facts() -> dict:
    import scipy

    facts = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "jax": jax.__version__,
        "jaxlib": getattr(jax.lib, "__version__", None) or _pkg_version("jaxlib"),
        "backend": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,
        "devices": len(jax.devices()),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "tensorly": _pkg_version("tensorly"),
        "flax": _pkg_version("flax"),
        "loadavg_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    facts["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return facts


def _pkg_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def plan(mode: str, only: str = "abcdefgh") -> list[tuple[str, Callable[[], list[Row]]]]:
    """The benchmark calls of one run: ``mode`` is ``full``, ``quick`` (fewer repeats and
    sweeps, no dense m = 768, headline extrapolated from 5 sweeps) or ``smoke`` (tiny sizes)."""
    steps: list[tuple[str, Callable[[], list[Row]]]] = []
    if mode == "smoke":
        tiny_b = dict(
            restarts=2, sweeps={"synthetic": 3, "paper": 3}, repeats=1,
            sizes={"synthetic": dict(S=24, r=2, dof=5), "paper": dict(S=16, n=3, m=3, r=2, dof=4)},
        )
        table = {
            "a": [lambda: bench_sweep_vs_numpy(S=24, n=3, m=3, r=2, dof=5, repeats=1, float32_variant=False)],
            "b": [lambda: bench_restarts(cases=("synthetic",), timeout=120, **tiny_b)],
            "c": [
                lambda: bench_structured_vs_dense(ms=(4,), S=16, repeats=1),
                lambda: bench_headline(m=4, hidden=16, S=16, r=4, sweeps=4, measured_sweeps=2),
            ],
            "d": [lambda: bench_decoupled_mlp(m=8, batch=2, tokens=5, repeats=1)],
            "e": [lambda: bench_tensorly(S=8, n=6, m=5, r=2, iters=2, repeats=1)],
            "f": [lambda: bench_matmul_bound(S=16, n=3, m=3, r=2, restarts=2, sweeps=3, repeats=1, gemm=64)],
            "g": [lambda: bench_batching(S=16, n=3, m=3, r=2, restarts=2, lams=(0.1, 1.0), sweeps=3, repeats=1)],
            "h": [lambda: bench_gated(ds=(6,), S=16, r=2, repeats=1)],
        }
    else:
        quick = mode == "quick"
        rep = 3 if quick else 7
        table = {
            "a": [lambda: bench_sweep_vs_numpy(repeats=rep)],
            "b": [lambda: bench_restarts(sweeps={"synthetic": 20, "paper": 5} if quick else None, repeats=3)],
            "c": [
                lambda: bench_structured_vs_dense(dense_max_m=384 if quick else 768, repeats=2 if quick else 3),
                lambda: bench_headline(measured_sweeps=5 if quick else None),
            ],
            "d": [lambda: bench_decoupled_mlp(repeats=rep)],
            "e": [lambda: bench_tensorly(repeats=5 if quick else 11)],
            "f": [lambda: bench_matmul_bound(repeats=3 if quick else 7)],
            "g": [lambda: bench_batching(repeats=3 if quick else 7)],
            # gated (SwiGLU) operator vs dense; d = 2048 and 4096 only where an accelerator holds them
            "h": [lambda: bench_gated(ds=(256, 512) if quick else (256, 512, 1024) + ((2048, 4096) if on_accelerator() else ()))],
        }
    for label in "abcdefgh":
        if label in only:
            steps += [(label, fn) for fn in table[label]]
    return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and sweeps; headline extrapolated")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results.json"), help="JSON output path")
    parser.add_argument(
        "--only", default="abcdefgh", help="subset of the benchmarks to run, e.g. 'ad' (default: all)"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the plumbing, times nothing useful")
    parser.add_argument("--list", action="store_true", help="list every benchmark subject and the command that runs it")
    parser.add_argument("--headline-worker", metavar="JSON", help=argparse.SUPPRESS)
    parser.add_argument("--restarts-worker", metavar="JSON", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.list:
        print(list_subjects())
        return 0
    lapack = jb.configure_cpu_threads(None)  # what `import jaxbsd` configured (no change)

    if args.headline_worker:
        print(json.dumps(jsonable(headline_worker(**json.loads(args.headline_worker)))))
        return 0
    if args.restarts_worker:
        print(json.dumps(jsonable(restarts_worker(**json.loads(args.restarts_worker)))))
        return 0

    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    command = " ".join([Path(sys.executable).name, *sys.argv]) if argv is None else "main(" + repr(argv) + ")"
    # What produced the figures, taken before anything runs (tests/test_results_fresh.py checks it).
    record = provenance("python benchmarks/run.py " + " ".join(sys.argv[1:] if argv is None else argv))
    facts = machine_facts()
    facts["jaxlib_lapack_blas_threads"] = lapack
    print(f"jaxbsd benchmarks ({mode}) — jax {facts['jax']} on {facts['backend']} "
          f"({facts['device_kind']}), {facts['cpu_affinity']} CPUs, load {facts['loadavg_start']}", flush=True)
    steps = plan(mode, args.only)
    rows: list[Row] = []
    t_start = time.perf_counter()
    for label, step in steps:
        t0 = time.perf_counter()
        new = step()
        rows += new
        print(f"  [{label}] done in {time.perf_counter() - t0:.1f} s: "
              + "; ".join(f"{r.name} = {'—' if r.ratio is None else f'{r.ratio:.2f}x'}" for r in new), flush=True)
    facts["loadavg_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    print()
    print(format_table(rows))
    total = time.perf_counter() - t_start
    print(f"\ntotal {total:.0f} s; load average at start {facts['loadavg_start']}, end {facts['loadavg_end']}")

    result = {
        "command": command,
        "cwd": os.getcwd(),
        "mode": mode,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "total_s": total,
        "machine": facts,
        "timing_method": "interleaved (alternating order), warm-up round(s), median of repeats; "
        "jax results block_until_ready; compile excluded except in the headline wall time",
        "rows": [dataclasses.asdict(r) for r in rows],
        "provenance": record,
    }
    out = write_json_atomic(args.out, jsonable(result))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
