"""Decoupling one MLP of a real pretrained model, beside pruning it.

The MLP is ``bert.layers.3.mlp`` of all-MiniLM-L6-v2 (384 → 1536 → 384, GELU), its calibration
tokens captured on real text (32 windows of 128 tokens of the Python docs' calibration files, 4096
tokens), S = 256 sampling points as ``jb.compress_model`` draws by default. At each share ``s`` of
the MLP's parameters removed (the MiniLM study's, ``experiments/minilm.py``; the full mode runs
s = 0.8 and 0.5, ranks 306 and 765) one run times, side by side and compiled, in float32, at the
same parameter budget (pruning and the augmented builds interleaved, 3 rounds after a warm-up,
medians with the minima beside them; today's decoupling once after a warm-up build):

- ``prune``: ``jb.Prune()``;
- ``bsd``: today's ``jb.BSD()`` (ν = 4 B-splines, 300 sweeps, the warm start from the pruned MLP,
  the restart chosen on held-out tokens);
- ``bsd-aug``: ``jb.BSD`` with the augmented basis ``jb.Augmented(jb.BSpline(0, 1), "gelu")`` (a
  constant plus the model's activation per unit, 2 coefficients, so the warm start is the pruned MLP
  exactly: at ranks of at least the output width it keeps ``r`` units and the constants carry the
  output bias, :func:`jaxbsd.compression.methods.bsd.warm_init`), the best iterate on the held-out
  selection tokens (``best_iterate=True``) and early stopping (``CMTFConfig(patience=5)``), the warm
  start's loop alone (``restarts=0``: no random restart beside it), at the
  largest rank within the budget (306 and 767: 770 parameters a unit against pruning's 769) and at
  today's rank where it differs (765);
- ``bsd-aug`` with a larger inner basis, ``jb.BSpline(3, 4)`` (ν + 1 = 5 coefficients, budget ranks
  305 and 764) and ``jb.BSpline(1, 2)`` (3, ranks 306 and 766), at their budget ranks: the measurement
  behind the choice of the constant. Every coefficient per unit beyond pruning's one bias costs
  budget rank, and a unit fewer costs more output error than the richer internal functions win back
  in the five sweeps before the early stop (the sweeps kept are 0: none improves on the start).

Every row records its seconds, its output error on the check tokens (held out from the restart
and the iterate choices), its sweeps run and the sweep kept, and its time as multiples of
pruning's and of its matmul bound. The matmul bound of a decoupling is the GEMM work of the sweeps
it ran through the structured Jacobian ``[[V1, V0ᵀ, D]]`` (``D = h'(X V0ᵀ + b0)``, ``S × H``), at
the float32 GEMM rate measured in the same run: per sweep ``V0 W0ᵀ`` and ``V1ᵀ W1``
(``2·H·(m + n)·r``), ``Dᵀ G`` and ``D (A ∘ B)`` (``2·2·S·H·r``) and the products back through
``V0``, ``V1`` (``2·H·(m + n)·r``), i.e. ``4·r·H·(S + m + n)`` FLOP; ``multiple = seconds / bound``.
(Row (f) of ``benchmarks/run.py`` uses the dense ``4·S·n·m·r``, ≈ 27× larger here; it is recorded
as ``dense_bound_s``.) The held-out error tracking of ``bsd-aug`` is not in the bound.

Then every MLP of MiniLM (the six, each on its own captured tokens) at s = 0.5: ``bsd-aug`` (the
constant inner basis) at the rank within the budget against ``prune``, output errors at the same parameter count (rows named
``every MLP``; layer 3's is the one above).

Usage::

    python benchmarks/minilm.py                 # writes benchmarks/minilm.json
    python benchmarks/minilm.py --quick         # CI: one rank (s = 0.9), layer 3 only, to a scratch file
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from benchmarks.common import Row, format_table, interleaved, write_rows  # noqa: E402  (enables x64 first)
from benchmarks.sweep import gemm_peak  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import jaxbsd as jb  # noqa: E402
from jaxbsd.compression.methods.base import largest_rank  # noqa: E402
from jaxbsd.compression.methods.bsd import augmented  # noqa: E402  (constant inner basis, patience 5)
from jaxbsd.compression.sites import make_site  # noqa: E402
from jaxbsd.compression.specs import MLPSpec  # noqa: E402
from jaxbsd.compression.surgery import capture_calls  # noqa: E402
from jaxbsd.data import load_docs_corpus, minilm_dir  # noqa: E402
from jaxbsd.models import bert as B  # noqa: E402
from jaxbsd.models import count_params  # noqa: E402

SHARES = (0.8, 0.5)
LAYER = 3
PATHS = tuple(f"bert.layers.{i}.mlp" for i in range(6))
#: interleaved timing rounds of pruning and the augmented builds
REPEATS = 3
#: larger inner bases measured beside it at layer 3, at their budget ranks
COMPARED_INNERS = (jb.BSpline(3, 4), jb.BSpline(1, 2))


def _timed(build):
    start = time.perf_counter()
    built = build()
    jax.block_until_ready(nnx.state(built.module))
    return time.perf_counter() - start, built.report()


def _site(encoder, tokens, path: str):
    mlp = encoder.bert.layers[int(path.split(".")[2])].mlp
    X, Y = tokens[path]
    return mlp, make_site(path, mlp, MLPSpec("fc1", "fc2", mlp.activation), X, Y, 256, jax.random.key(0))


def _inner(method: jb.BSD) -> str | None:
    """The augmented basis's inner basis, as written (``"BSpline(0, 1)"``); None for a plain basis."""
    basis = method.config.basis
    return f"BSpline({basis.inner.degree}, {basis.inner.dof})" if isinstance(basis, jb.Augmented) else None


def _details(method: jb.BSD, site, rank: int, seconds: float, info: dict, peak: float, prune: dict) -> dict:
    """A decoupling's figures beside pruning's (``prune``: seconds, error, units, params)."""
    S, m, n, H = site.X.shape[0], site.m, site.n, site.hidden
    sweeps = int(info["iterations"])
    bound = sweeps * 4 * rank * H * (S + m + n) / peak
    return {"rank": rank, "inner": _inner(method), "num_coef": method.dof, "params": method.params(site, rank),
            "restarts": method.restarts, "seconds": seconds, "sweeps": sweeps,
            "sweep_kept": info.get("sweep_kept"), "stopped": info.get("stopped"),
            "output_error": info["output_error"], "matmul_bound_s": bound,
            "dense_bound_s": sweeps * 4 * S * n * m * rank / peak,
            "x_bound": seconds / bound, "x_prune": seconds / prune["seconds"],
            "error_vs_prune": info["output_error"] / prune["output_error"] - 1}


def share_rows(site, mlp, share: float, peak: float) -> tuple[list[Row], dict]:
    """The rows of one share at ``site``: pruning, today's decoupling, the augmented one at its
    budget rank and at today's rank, and the augmented ones with the larger inner bases at theirs,
    compiled. Pruning and the augmented builds (seconds each) are timed interleaved, ``REPEATS``
    rounds after a warm-up (medians, minima beside them); today's decoupling (minutes) once after a
    warm-up build."""
    budget = (1 - share) * count_params(mlp)
    bsd, prune, aug = jb.BSD(), jb.Prune(), augmented(mlp.activation)
    k, r, r_aug = (largest_rank(meth, site, budget) for meth in (prune, bsd, aug))
    key, reports = jax.random.key(1), {}
    # name -> (method, rank, at its budget rank)
    cases = {"prune": (prune, k, True), f"bsd-aug r={r_aug}": (aug, r_aug, True)}
    if r != r_aug:
        cases[f"bsd-aug r={r}"] = (aug, r, False)
    for inner in COMPARED_INNERS:
        meth = augmented(mlp.activation, inner)
        rank = largest_rank(meth, site, budget)
        cases[f"bsd-aug[{_inner(meth)}] r={rank}"] = (meth, rank, True)

    def call(name, meth, rank, _budget_rank):
        def run():
            reports[name] = _timed(lambda: meth.build(site, rank, key))[1]
        return run

    times = interleaved({name: call(name, *case) for name, case in cases.items()}, repeats=REPEATS)
    first, _ = _timed(lambda: bsd.build(site, r, key))
    seconds, reports["bsd"] = _timed(lambda: bsd.build(site, r, key))
    times["bsd"] = {"median": seconds, "min": seconds, "times": [seconds]}
    cases["bsd"] = (bsd, r, True)
    pinfo, t_prune = reports["prune"], times["prune"]
    ref = {"seconds": t_prune["median"], "seconds_min": t_prune["min"], "output_error": pinfo["output_error"],
           "units": k, "params": prune.params(site, k)}
    H, tag = site.hidden, f"MiniLM layer {LAYER} MLP (384-1536-384), s={share}"
    rows = [Row(name=f"pruning, {tag}: k={k}", ours=ref["seconds"], reference=None, ratio=None, target="",
                passed=None, note=f"output error {ref['output_error']:.4f}, {ref['params']} parameters",
                details={"share": share, "method": "prune", **ref, "times": t_prune["times"]})]
    for name in ["bsd"] + [n for n in cases if n not in ("prune", "bsd")]:
        meth, rank, budget_rank = cases[name]
        label, t = name.rsplit(" r=", 1)[0], times[name]
        method = label.split("[")[0]
        d = _details(meth, site, rank, t["median"], reports[name], peak, ref)
        rows.append(Row(
            name=f"{label} / matmul bound, {tag}: r={rank}, S={site.X.shape[0]}", ours=t["median"],
            reference=d["matmul_bound_s"], ratio=d["x_bound"], target="", passed=None,
            ratio_min=t["min"] / d["matmul_bound_s"],
            note=(f"{d['x_prune']:.1f}x pruning's {ref['seconds']:.2f} s (minima: {t['min'] / ref['seconds_min']:.1f}x); "
                  f"output error {d['output_error']:.4f} against pruning's {ref['output_error']:.4f} "
                  f"({d['error_vs_prune']:+.1%}); {d['sweeps']} sweeps, kept {d['sweep_kept']}, stopped: {d['stopped']}"),
            details={"share": share, "method": method, "budget_rank": budget_rank, **d,
                     "seconds_min": t["min"], "times": t["times"], "x_prune_min": t["min"] / ref["seconds_min"],
                     "seconds_first_call": first if label == "bsd" else None, "prune": ref, "hidden": H,
                     "peak_flops": peak, "S": int(site.X.shape[0]), "tokens": int(site.check_X.shape[0])}))
        print(format_table(rows[-1:]), flush=True)
    return rows, ref


def every_mlp_rows(encoder, tokens, share: float, peak: float, done: dict) -> list[Row]:
    """``bsd-aug`` at the budget rank against pruning at each of the six MLPs (``done``: the
    figures already measured at one path, as ``{path: (aug details, prune figures)}``)."""
    rows = []
    for path in PATHS:
        if path in done:
            d, ref = done[path]
        else:
            mlp, site = _site(encoder, tokens, path)
            budget = (1 - share) * count_params(mlp)
            prune, aug = jb.Prune(), augmented(mlp.activation)
            k, rank, key = largest_rank(prune, site, budget), largest_rank(aug, site, budget), jax.random.key(1)
            t_prune, pinfo = _timed(lambda: prune.build(site, k, key))  # same shapes as layer 3: compiled
            ref = {"seconds": t_prune, "output_error": pinfo["output_error"], "units": k,
                   "params": prune.params(site, k)}
            seconds, info = _timed(lambda: aug.build(site, rank, key))
            d = _details(aug, site, rank, seconds, info, peak, ref)
        rows.append(Row(
            name=f"every MLP, s={share}: {path}, bsd-aug r={d['rank']} ({d['params']} params) against pruning "
                 f"k={ref['units']} ({ref['params']} params)",
            ours=d["output_error"], reference=ref["output_error"], ratio=d["output_error"] / ref["output_error"],
            target="", passed=None, unit="",
            note=f"{d['error_vs_prune']:+.2%} relative; {d['sweeps']} sweeps, kept {d['sweep_kept']}; "
                 f"{d['seconds']:.1f} s against {ref['seconds']:.2f} s",
            details={"share": share, "path": path, "method": "bsd-aug", "inner": d["inner"], "rank": d["rank"],
                     "params": d["params"],
                     "output_error": d["output_error"], "sweeps": d["sweeps"], "sweep_kept": d["sweep_kept"],
                     "stopped": d["stopped"], "seconds": d["seconds"], "prune": ref,
                     "error_vs_prune": d["error_vs_prune"]}))
        print(format_table(rows[-1:]), flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--shares", type=float, nargs="+", default=None, help="shares of the MLP removed")
    args = parser.parse_args(argv)
    jax.config.update("jax_enable_x64", False)
    shares = tuple(args.shares) if args.shares else (0.9,) if args.quick else SHARES
    encoder = B.from_pretrained(minilm_dir())
    texts = load_docs_corpus().passages("calibration")
    ids = B.calibration_windows(encoder, texts, 128, 32, seed=0)
    paths = PATHS[LAYER:LAYER + 1] if args.quick else PATHS
    tokens, _ = capture_calls(encoder, lambda m: m(ids, np.ones_like(ids)), list(paths))
    mlp, site = _site(encoder, tokens, PATHS[LAYER])
    peak = gemm_peak(2048, repeats=3)
    rows, done = [], {}
    for share in shares:
        got, ref = share_rows(site, mlp, share, peak)
        rows += got
        aug = next(r.details for r in got if r.details["method"] == "bsd-aug" and r.details["inner"] == _inner(
            augmented(mlp.activation)) and r.details["budget_rank"])
        done[share] = {PATHS[LAYER]: (aug, ref)}
    if not args.quick:
        rows += every_mlp_rows(encoder, tokens, 0.5, peak, done.get(0.5, {}))
    print(format_table(rows))
    out = args.out or (pathlib.Path("/tmp/minilm_bench_quick.json") if args.quick else HERE / "minilm.json")
    command = " ".join(["python", "benchmarks/minilm.py", *(sys.argv[1:] if argv is None else argv)])
    write_rows(out, command, args.quick, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
