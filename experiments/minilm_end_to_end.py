"""Refined end-to-end MiniLM compression: pruning against the augmented B-spline decoupling, in wall time.

all-MiniLM-L6-v2's six MLPs compressed back to front by ``jb.compress_model`` (uniform allocation,
``mlps=None``) at one share ``s`` of the MLP parameters removed (default 0.5, the whole-model
reduction ``ρ = s · P_mlp / P`` as in ``experiments/minilm.py``), refined (``jb.Refine()``, the
default), calibrated on 32 windows of 128 tokens of the Python docs' calibration files (seed 0), by

- ``prune``: ``jb.Prune()``;
- ``bsd-aug``: :func:`jaxbsd.compression.methods.bsd.augmented` of ``"gelu"``: ``jb.BSD`` with
  ``jb.Augmented(jb.BSpline(0, 1), "gelu")``, the warm start alone (``restarts=0``),
  ``best_iterate=True`` and ``CMTFConfig(patience=5)`` (the benchmark's, ``benchmarks/minilm.py``).

Each unit runs in this one process in the order given, compiles included (a fresh process pays
them as well), and records its wall seconds, the seconds per MLP, the sweeps kept, the output
errors and the fidelity measures of ``experiments/minilm.py`` (mean cosine, recall) on the same
held-out passages and pairs. Today's ``bsd`` takes 20+ minutes here; its refined units are in the
MiniLM study (``experiments/results/minilm.json``).

Usage::

    python experiments/minilm_end_to_end.py              # writes experiments/results/minilm_end_to_end.json
    python experiments/minilm_end_to_end.py --quick --out DIR   # the MiniLM study's quick calibration and evaluation
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

import jax
import numpy as np

import jaxbsd as jb
from jaxbsd import evaluation
from jaxbsd.data import load_docs_corpus, minilm_dir
from jaxbsd.models import bert as B
from jaxbsd.compression.methods.bsd import augmented
from jaxbsd.models import count_params

from checkout import RESULTS
from minilm import FULL, QUICK, evaluation_set
from output import Timer, command_line, machine, write_json

def unit(name: str, share: float, original, ids, reference, passages, pairs) -> dict:
    """One refined compression of the six MLPs by ``name`` at ``share``: its wall seconds and measures."""
    P = count_params(original)
    P_mlp = sum(count_params(original.bert.layers[i].mlp) for i in range(6))
    rho = share * P_mlp / P
    method = jb.Prune() if name == "prune" else augmented("gelu")  # BSpline(0, 1) + GELU, the benchmark's
    encoder, mask = B.from_pretrained(minilm_dir()), np.ones_like(ids)
    load_start, t = os.getloadavg()[0], Timer()
    encoder, report = jb.compress_model(encoder, lambda m: m(ids, mask), mlps=None, reduction=rho, method=method,
                                        key=jax.random.key(0), refine=jb.Refine())
    seconds = t()
    scores = evaluation.fidelity(reference, evaluation.embed_eval_set(encoder, passages, pairs))
    mlps = [dict(path=r.path, method=r.method, rank=r.rank, output_error=r.output_error, seconds=r.seconds,
                 sweep_kept=getattr(r, "sweep_kept", None), stopped=getattr(r, "stopped", None),
                 refine=None if r.refine is None else {k: r.refine.get(k) for k in ("steps", "steps_kept",
                                                                                     "error_before", "error_after")})
            for r in report.mlps]
    return dict(method=name + "-ref", share=share, rho=rho, params=report.params_after, reduction=report.reduction,
                seconds=seconds, load_1min=[load_start, os.getloadavg()[0]], **scores, mlps=mlps, machine=machine())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--share", type=float, default=0.5)
    parser.add_argument("--methods", nargs="+", default=["prune", "bsd-aug"], choices=["prune", "bsd-aug"])
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--quick", action="store_true",
                        help="the MiniLM study's quick sizes (windows, evaluation passages); results to --out")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    command = command_line("minilm_end_to_end.py", argv)
    original = B.from_pretrained(minilm_dir())
    corpus = load_docs_corpus()
    passages, pairs = evaluation_set(corpus, plan)
    reference = evaluation.embed_eval_set(original, passages, pairs)
    ids = B.calibration_windows(original, corpus.passages("calibration"), plan["seq_len"], plan["windows"], seed=0)
    runs = []
    for name in args.methods:
        runs.append(unit(name, args.share, original, ids, reference, passages, pairs))
        r = runs[-1]
        print(f"{r['method']} s={args.share}: {r['seconds']:.1f} s, cosine {r['mean_cosine']:.4f}", flush=True)
    ratio = None
    if {"prune-ref", "bsd-aug-ref"} <= {r["method"] for r in runs}:
        by = {r["method"]: r for r in runs}
        ratio = by["bsd-aug-ref"]["seconds"] / by["prune-ref"]["seconds"]
    path = pathlib.Path(args.out) / "minilm_end_to_end.json"
    write_json(path, {"command": command, "share": args.share, "runs": runs, "seconds_ratio": ratio,
                      "calibration": f"{plan['windows']} windows of {plan['seq_len']} tokens, seed 0"})
    print(f"wrote {path}; augmented / pruning wall time: {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
