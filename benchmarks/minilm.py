"""Decoupling one MLP of a real pretrained model, beside pruning it.

The MLP is ``bert.layers.3.mlp`` of all-MiniLM-L6-v2 (384 → 1536 → 384, GELU), its calibration
tokens captured on real text (32 windows of 128 tokens of the Python docs' calibration files, 4096
tokens), S = 256 sampling points as ``jb.compress_model`` draws by default. At each rank the MiniLM
study (``experiments/minilm.py``) gives the decoupling — the share ``s`` of the MLP's parameters
removed, s ∈ {0.5, 0.6, 0.7, 0.8, 0.9}, ranks 765 … 153 — it times ``jb.BSD()`` (300 sweeps, the warm
start from the pruned MLP, the restart chosen on held-out tokens) and ``jb.Prune()`` at the same
budget, compiled (one warm-up build first), in float32. The matmul bound of a decoupling is the GEMM
work of its 300 sweeps through the structured Jacobian ``[[V1, V0ᵀ, D]]`` (``D = h'(X V0ᵀ + b0)``,
``S × H``), at the float32 GEMM rate measured in the same run: per sweep ``V0 W0ᵀ`` and ``V1ᵀ W1``
(``2·H·(m + n)·r``), ``Dᵀ G`` and ``D (A ∘ B)`` (``2·2·S·H·r``) and the products back through ``V0``,
``V1`` (``2·H·(m + n)·r``), i.e. ``4·r·H·(S + m + n)`` FLOP; ``multiple = seconds / bound``. (Row (f)
of ``benchmarks/run.py`` uses the dense ``4·S·n·m·r``, which here would be ``n·m / (H·(1 + (m + n)/S))``
≈ 27× larger; it is recorded as ``dense_bound_s``.)

Usage::

    python benchmarks/minilm.py                 # writes benchmarks/minilm.json
    python benchmarks/minilm.py --quick         # CI: one rank (s = 0.9), to a scratch file
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from benchmarks.common import Row, format_table, write_rows  # noqa: E402  (enables x64 first)
from benchmarks.sweep import gemm_peak  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import jaxbsd as jb  # noqa: E402
from jaxbsd.compression.methods.base import largest_rank  # noqa: E402
from jaxbsd.compression.sites import make_site  # noqa: E402
from jaxbsd.compression.specs import MLPSpec  # noqa: E402
from jaxbsd.compression.surgery import capture_calls  # noqa: E402
from jaxbsd.data import load_docs_corpus, minilm_dir  # noqa: E402
from jaxbsd.models import bert as B  # noqa: E402
from jaxbsd.models import count_params  # noqa: E402

SHARES = (0.9, 0.8, 0.7, 0.6, 0.5)
PATH = "bert.layers.3.mlp"


def _timed(build):
    start = time.perf_counter()
    built = build()
    jax.block_until_ready(nnx.state(built.module))
    return time.perf_counter() - start, built.report()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--shares", type=float, nargs="+", default=None, help="a subset of the study's shares")
    args = parser.parse_args(argv)
    jax.config.update("jax_enable_x64", False)
    shares = tuple(args.shares) if args.shares else SHARES[:1] if args.quick else SHARES
    encoder = B.from_pretrained(minilm_dir())
    texts = load_docs_corpus().passages("calibration")
    ids = B.calibration_windows(encoder, texts, 128, 32, seed=0)
    tokens, _ = capture_calls(encoder, lambda m: m(ids, np.ones_like(ids)), [PATH])
    X, Y = tokens[PATH]
    mlp = encoder.bert.layers[3].mlp
    site = make_site(PATH, mlp, MLPSpec("fc1", "fc2", mlp.activation), X, Y, 256, jax.random.key(0))
    peak = gemm_peak(2048, repeats=3)
    bsd, prune = jb.BSD(), jb.Prune()
    S, (n, m) = site.X.shape[0], (site.n, site.m)
    rows = []
    for share in shares:
        budget = (1 - share) * count_params(mlp)
        r, k = largest_rank(bsd, site, budget), largest_rank(prune, site, budget)
        key = jax.random.key(1)
        compile_bsd, _ = _timed(lambda: bsd.build(site, r, key))
        t_bsd, info = _timed(lambda: bsd.build(site, r, key))
        _timed(lambda: prune.build(site, k, key))
        t_prune, pinfo = _timed(lambda: prune.build(site, k, key))
        H = site.hidden
        bound = bsd.config.max_iter * 4 * r * H * (S + m + n) / peak
        dense_bound = bsd.config.max_iter * 4 * S * n * m * r / peak
        rows.append(Row(
            name=f"decoupling / matmul bound, MiniLM layer 3 MLP (384-1536-384), s={share}: r={r}, S={S}",
            ours=t_bsd, reference=bound, ratio=t_bsd / bound, target="", passed=None,
            note=f"pruning to k={k} units: {t_prune:.2f} s ({t_bsd / t_prune:.0f}x faster than the decoupling)",
            details={"share": share, "rank": r, "prune_units": k, "seconds_decouple": t_bsd,
                     "seconds_decouple_first_call": compile_bsd, "seconds_prune": t_prune,
                     "matmul_bound_s": bound, "dense_bound_s": dense_bound, "peak_flops": peak, "hidden": H, "sweeps": bsd.config.max_iter,
                     "output_error_decouple": info["output_error"], "output_error_prune": pinfo["output_error"],
                     "tokens": int(X.shape[0]), "S": S}))
        print(format_table(rows[-1:]), flush=True)
    print(format_table(rows))
    out = args.out or (pathlib.Path("/tmp/minilm_bench_quick.json") if args.quick else HERE / "minilm.json")
    command = " ".join(["python", "benchmarks/minilm.py", *(sys.argv[1:] if argv is None else argv)])
    write_rows(out, command, args.quick, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
