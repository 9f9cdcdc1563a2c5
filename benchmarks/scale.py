"""Compression at base scale: pruning random-weight models of real shapes, in wall time and peak memory.

Two models with random weights (float32, ``nnx.Rngs(0)``):

* ``bert-base``: a BERT-base-shaped encoder (``jaxbsd.models.bert``: 12 layers, 768 → 3072 → 768 GELU
  MLPs, 12 heads, vocabulary 30,522; 110 M parameters);
* ``llama-300m``: a Llama-style decoder (``jaxbsd.models.llama``: 20 layers, hidden 1024, SwiGLU
  MLPs 1024 → 2816 → 1024, 16 query heads and 4 key/value heads of 64, vocabulary 32,000, untied
  embeddings; 291 M parameters).

Each is compressed by ``jb.compress_model(model, calibration, mlps=None, method="prune",
reduction=0.25)`` on 64 windows of 128 random token ids, once with the default refinement
(``jb.Refine()``) and once without (``refine=None``). Each case runs in a fresh process (so it
compiles from cold and its peak memory is its own): the call's wall time, the process's wall
time (imports and the model's construction included) and its peak resident memory
(``ru_maxrss``), with the per-MLP build and refinement seconds of the report, the planning's seconds
(capture, sites, ranks: until the first step starts) and the resident set sampled every 0.25 s, its
peak during the planning and during the steps. Targets (issue 59):
BERT-base refined at most 300 s and 3 GB, the decoder at most 600 s and 5 GB.

Usage::

    python benchmarks/scale.py                 # writes benchmarks/scale.json
    python benchmarks/scale.py --quick         # tiny shapes, seconds, to a scratch file
    python benchmarks/scale.py --models bert-base --out /tmp/scale.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

#: The models' configurations (keyword arguments of BertConfig / LlamaConfig) and the calibration
#: (windows of tokens); ``quick`` holds tiny shapes of the same families for a smoke run.
MODELS = {
    "bert-base": dict(family="bert", config=dict()),
    "llama-300m": dict(family="llama", config=dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                                                    num_hidden_layers=20, num_attention_heads=16,
                                                    num_key_value_heads=4, head_dim=64)),
}
QUICK = {
    "bert-base": dict(family="bert", config=dict(vocab_size=500, hidden_size=64, num_hidden_layers=2,
                                                 num_attention_heads=2, intermediate_size=256)),
    "llama-300m": dict(family="llama", config=dict(vocab_size=500, hidden_size=64, intermediate_size=176,
                                                    num_hidden_layers=2, num_attention_heads=4,
                                                    num_key_value_heads=2, head_dim=16)),
}
#: The issue's targets: (wall seconds, peak RSS in GB), for the refined run.
TARGETS = {"bert-base": (300.0, 3.0), "llama-300m": (600.0, 5.0)}
WINDOWS, TOKENS = (64, 128)
QUICK_WINDOWS = (8, 16)
REDUCTION = 0.25


def _build(family: str, config: dict):
    from flax import nnx

    if family == "bert":
        from jaxbsd.models.bert import Bert, BertConfig, Encoder

        return Encoder(Bert(BertConfig(**config), rngs=nnx.Rngs(0)))
    from jaxbsd.models.llama import Llama, LlamaConfig

    return Llama(LlamaConfig(**config), rngs=nnx.Rngs(0))


def worker(spec: dict) -> dict:
    """One case in this (fresh) process: build the model, prune it, report times and memory."""
    start = time.perf_counter()
    import resource

    import jax
    import jax.numpy as jnp

    from benchmarks.common import StageSampler  # (benchmarks.common turns x64 on: before the line below)

    jax.config.update("jax_enable_x64", False)  # what a user's run has
    import jaxbsd as jb
    from jaxbsd.models import count_params

    model = _build(spec["family"], spec["config"])
    params = count_params(model)
    vocab = spec["config"].get("vocab_size", 30522)
    windows, tokens = spec["windows"]
    ids = jax.random.randint(jax.random.key(1), (windows, tokens), 0, vocab)
    mask = jnp.ones_like(ids)
    built = time.perf_counter()
    first_step = []
    with StageSampler(every=0.25) as sampler:
        def progress(event):
            sampler.progress(event)
            if event.kind == "start" and not first_step:
                first_step.append(time.perf_counter() - built)

        model, report = jb.compress_model(model, lambda m: m(ids, mask), key=jax.random.key(0), mlps=None,
                                          method="prune", reduction=REDUCTION,
                                          refine=jb.Refine() if spec["refine"] else None,
                                          execution=jb.Execution(progress=progress))
    call = time.perf_counter() - built
    peaks = sampler.peaks()
    mlps = report.to_dict()["mlps"]
    return {"params": params, "params_after": count_params(model), "mlps": len(mlps),
            "rank": sorted({m["rank"] for m in mlps}), "seconds_call": call,
            "seconds_process": time.perf_counter() - start, "seconds_model": built - start,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9,
            "seconds_per_mlp": [m["seconds"] for m in mlps],
            "seconds_refine_per_mlp": [(m.get("refine") or {}).get("seconds") for m in mlps],
            "output_error_max": max(m["output_error"] for m in mlps),
            # the planning (capture, sites, ranks) until the first step starts, and the sampled peak of each stage
            "seconds_planning": first_step[0] if first_step else None,
            "peak_rss_gb_planning": peaks.get("planning", 0.0) / 1e3,
            "peak_rss_gb_steps": max([v for k, v in peaks.items() if k != "planning"] or [0.0]) / 1e3}


def _run_case(name: str, spec: dict, refine: bool, quick: bool) -> dict:
    payload = json.dumps({**spec, "refine": refine, "windows": QUICK_WINDOWS if quick else (WINDOWS, TOKENS)})
    proc = subprocess.run([sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", payload],
                          capture_output=True, text=True, cwd=HERE.parent)
    if proc.returncode:
        raise RuntimeError(f"{name} (refine={refine}) failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    from benchmarks.common import Row, format_table, write_rows

    rows = []
    for name in args.models:
        spec = (QUICK if args.quick else MODELS)[name]
        seconds, gb = TARGETS[name]
        for refine in (True, False):
            r = _run_case(name, spec, refine, args.quick)
            passed = None if not refine or args.quick else bool(r["seconds_call"] <= seconds and r["peak_rss_gb"] <= gb)
            rows.append(Row(
                name=f"prune rho={REDUCTION}, {name} ({r['params'] / 1e6:.0f} M), {'refined' if refine else 'not refined'}",
                ours=r["seconds_call"], reference=None, ratio=None,
                target=f"<= {seconds:.0f} s and {gb:g} GB" if refine else "", passed=passed,
                note=(f"peak RSS {r['peak_rss_gb']:.2f} GB (sampled: planning {r['peak_rss_gb_planning']:.2f}, steps "
                      f"{r['peak_rss_gb_steps']:.2f}); {r['mlps']} MLPs, planning {r['seconds_planning']:.0f} s, "
                      f"{r['seconds_process']:.0f} s in all"),
                details={"model": name, "refine": refine, **r,
                         "windows": list(QUICK_WINDOWS if args.quick else (WINDOWS, TOKENS))}))
            print(format_table(rows[-1:]), flush=True)
    print(format_table(rows))
    out = args.out or (pathlib.Path("/tmp/scale_bench_quick.json") if args.quick else HERE / "scale.json")
    command = " ".join(["python", "benchmarks/scale.py", *(sys.argv[1:] if argv is None else argv)])
    write_rows(out, command, args.quick, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
