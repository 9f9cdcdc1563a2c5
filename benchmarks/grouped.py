"""Grouped compression against one block at a time, side by side in one run (issue 44).

A 6-block model whose MLPs have the ViT/Fashion-MNIST study's shape (``m = 64``, ``H = 256``,
residual blocks, float32) is compressed by ``jb.compress_model`` with the defaults (``jb.BSD()``:
300 sweeps, the warm start, held-out selection; ``jb.Refine()``), at the rank a ρ = 0.5
training-free run gives that shape (40), once grouped (``group=True``: one program for the six
blocks) and once one block at a time (``group=False``). Each mode runs in a fresh subprocess (so
each compiles from cold, and its peak memory is its own): a first run (compiles included), then
``repeats`` timed runs. Reported per mode: the first run's and the median steady wall time, the
XLA backend compiles of the first run (``jax.monitoring``), and the process's peak resident
memory. Ratios are one block at a time / grouped.

Usage::

    python benchmarks/grouped.py              # writes benchmarks/grouped.json
    python benchmarks/grouped.py --quick      # fewer sweeps and repeats, to a scratch file
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

BLOCKS, M, H, RANK, TOKENS = 6, 64, 256, 40, (32, 64)


def child(mode: str, quick: bool, repeats: int) -> dict:
    """One mode in this process: ``{"first": s, "steady": [s...], "compiles": k, "peak_rss_mib": x}``."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    import jaxbsd as jb

    compiles = [0]
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, _secs, **_: compiles.__setitem__(0, compiles[0] + (event == "/jax/core/compile/backend_compile_duration")))

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
        jb.compress_model(model, x, mlps=paths, ranks={p: RANK for p in paths}, method=method, refine=refine,
                          key=jax.random.key(0), mlp_specs=spec, group=mode == "grouped")
        jax.block_until_ready(nnx.state(model))

    t0 = time.perf_counter()
    once()
    first, first_compiles = time.perf_counter() - t0, compiles[0]
    steady = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        once()
        steady.append(time.perf_counter() - t0)
    return {"mode": mode, "first": first, "steady": steady, "compiles": first_compiles,
            "compiles_steady": compiles[0] - first_compiles,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--child", choices=("grouped", "sequential"), help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    if args.child:
        print(json.dumps(child(args.child, args.quick, repeats)))
        return 0
    results = {}
    for mode in ("sequential", "grouped"):
        command = [sys.executable, __file__, "--child", mode, "--repeats", str(repeats)] + (["--quick"] if args.quick else [])
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        results[mode] = json.loads(out.strip().splitlines()[-1])
    seq, grp = results["sequential"], results["grouped"]
    ratios = {"first_run": seq["first"] / grp["first"],
              "steady_median": statistics.median(seq["steady"]) / statistics.median(grp["steady"]),
              "compiles": seq["compiles"] / max(grp["compiles"], 1),
              "peak_rss": seq["peak_rss_mib"] / grp["peak_rss_mib"]}
    print(f"{'':28s}{'one at a time':>16s}{'grouped':>12s}{'ratio':>9s}")
    print(f"{'first run (compiles), s':28s}{seq['first']:16.2f}{grp['first']:12.2f}{ratios['first_run']:9.2f}")
    print(f"{'steady run (median), s':28s}{statistics.median(seq['steady']):16.2f}"
          f"{statistics.median(grp['steady']):12.2f}{ratios['steady_median']:9.2f}")
    print(f"{'XLA compiles, first run':28s}{seq['compiles']:16d}{grp['compiles']:12d}{ratios['compiles']:9.2f}")
    print(f"{'peak RSS, MiB':28s}{seq['peak_rss_mib']:16.0f}{grp['peak_rss_mib']:12.0f}{ratios['peak_rss']:9.2f}")
    # The sweep as a multiple of this machine's GEMM bound (row (f) of benchmarks/run.py), at the
    # paper's size and at a MiniLM MLP's (m = n = 384, S = 256, r = 96: a dense Jacobian, as row (f);
    # the real-model study's ranks are not on this branch, r = 96 is a stand-in to replace by them).
    from benchmarks.common import format_table
    from benchmarks.run import bench_matmul_bound

    sizes = {"paper": dict(S=128, n=64, m=64, r=64), "MiniLM MLP": dict(S=256, n=384, m=384, r=96)}
    bound_rows = []
    for name, size in sizes.items():
        rows = bench_matmul_bound(**size, restarts=4, sweeps=3 if args.quick else 10, repeats=2 if args.quick else 3)
        for row in rows[:2]:
            row.name = f"{row.name} [{name}]"
            bound_rows.append(row)
    print(format_table(bound_rows))
    from jaxbsd.io import provenance, write_json_atomic
    import jax

    out = args.out or (pathlib.Path("/tmp/grouped_quick.json") if args.quick else HERE / "grouped.json")
    cmd = "python benchmarks/grouped.py" + (" --quick" if args.quick else "")
    write_json_atomic(out, {"command": cmd, "mode": "quick" if args.quick else "full",
                            "device": jax.devices()[0].platform, "model": {"blocks": BLOCKS, "m": M, "H": H,
                                                                           "rank": RANK, "tokens": TOKENS},
                            "results": results, "ratios": ratios,
                            "sweep_vs_bound": [r.__dict__ for r in bound_rows], "provenance": provenance(cmd)})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
