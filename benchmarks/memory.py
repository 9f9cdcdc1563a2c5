"""Memory of compression: resident memory over repeated compressions in one process, and the peak of
one compression against a memory model.

1. **Flat memory.** In one process, ``--iterations`` times (10): load all-MiniLM-L6-v2
   (:func:`jaxbsd.models.bert.from_pretrained`), ``jb.compress_model(model, calibration, mlps=None,
   method="prune", reduction=0.2)`` on 8 windows of 128 tokens of the Python docs' calibration files,
   and a small fidelity evaluation (64 passages and 32 (heading, section) pairs of the evaluation
   files, embedded by the loaded and the compressed encoder, :func:`jaxbsd.evaluation.fidelity`).
   The resident set (``VmRSS``) after each iteration, once ``gc.collect()`` ran; the growth is the
   least-squares slope of the last five, in MB (10⁶ bytes) per iteration: target ≤ 5.
2. **Peak of one compression.** In a fresh process per model: ``jb.compress_model(mlps=None,
   method="prune", reduction=0.25)`` with the defaults otherwise (refinement on) on 64 windows of 128
   tokens, for MiniLM (its real weights, the docs' text; also on 8 windows, where the activations are
   small: that run calibrates the compiled programs' term) and a BERT-base-shaped encoder (random
   weights, 768 → 3072, random token ids; its first four layers by default, ``bert-base`` for all 12). The peak resident set (``VmHWM``, reset once the
   model and its calibration are loaded) and the resident set sampled every 50 ms, each sample
   labelled with the stage the progress hook last announced (planning, then each MLP), against the
   memory model of :func:`memory_model`.

Usage::

    python benchmarks/memory.py               # writes benchmarks/memory.json
    python benchmarks/memory.py --quick       # 4 iterations, MiniLM's peak on 16 windows; a scratch file
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gc
import json
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))
os.environ.setdefault("JAXBSD_DATA", str(HERE.parents[1] / "shared" / "data"))

from benchmarks.common import Row, StageSampler, format_table, rss_bytes, write_rows  # noqa: E402  (enables x64 first)

import jax  # noqa: E402
import numpy as np  # noqa: E402

MB = 1e6
#: The flat-memory target: MB of resident memory per iteration over the last five.
TARGET_MB_PER_ITERATION = 5.0
#: Iterations whose resident sets the slope is fitted to (the last ones: the first iterations compile).
SLOPE_OVER = 5


def reset_peak() -> bool:
    """Reset ``VmHWM`` to the current resident set (Linux ``clear_refs`` 5); whether it could."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def slope(values) -> float:
    """Least-squares slope of ``values`` against their index."""
    y = np.asarray(values, np.float64)
    return float(np.polyfit(np.arange(y.size), y, 1)[0])


# --------------------------------------------------------------------------- 1. flat memory


def _evaluation_texts(docs):
    rng = np.random.default_rng(0)
    passages, pairs = docs.passages("evaluation"), docs.pairs("evaluation")
    return ([passages[i] for i in np.sort(rng.choice(len(passages), 64, replace=False))],
            [pairs[i] for i in np.sort(rng.choice(len(pairs), 32, replace=False))])


def flat_worker(iterations: int, windows: int) -> dict:
    """The resident set after each of ``iterations`` rounds of (load MiniLM, prune, evaluate)."""
    import jaxbsd as jb
    from jaxbsd import evaluation
    from jaxbsd.data import load_docs_corpus, minilm_dir
    from jaxbsd.models import bert as B

    docs = load_docs_corpus()
    texts = docs.passages("calibration")
    passages, pairs = _evaluation_texts(docs)
    start_rss = rss_bytes()
    rounds = []
    for i in range(iterations):
        start = time.perf_counter()
        encoder = B.from_pretrained(minilm_dir())
        ids = B.calibration_windows(encoder, texts, 128, windows, seed=0)
        mask = np.ones_like(ids)
        reference = evaluation.embed_eval_set(encoder, passages, pairs)
        compressed, report = jb.compress_model(encoder, lambda m: m(ids, mask), key=jax.random.key(0), mlps=None,
                                               method="prune", reduction=0.2)
        scores = evaluation.fidelity(reference, evaluation.embed_eval_set(compressed, passages, pairs))
        reduction = report.reduction
        del encoder, compressed, report, reference
        gc.collect()
        live = jax.live_arrays()
        rounds.append({"rss_mb": rss_bytes() / MB, "seconds": time.perf_counter() - start,
                       "live_arrays": len(live), "live_array_mb": sum(a.nbytes for a in live) / MB,
                       "gc_objects": len(gc.get_objects()), "mean_cosine": scores["mean_cosine"],
                       "reduction": reduction})
        del live
        print(f"iteration {i + 1}: {rounds[-1]['rss_mb']:.0f} MB, {rounds[-1]['seconds']:.1f} s", flush=True)
    return {"rounds": rounds, "rss_start_mb": start_rss / MB, "windows": windows, "tokens_per_window": 128,
            "peak_rss_mb": rss_bytes("VmHWM") / MB}


# --------------------------------------------------------------------------- 2. peak of one compression


def _minilm(windows: int):
    from jaxbsd.data import load_docs_corpus, minilm_dir
    from jaxbsd.models import bert as B

    encoder = B.from_pretrained(minilm_dir())
    return encoder, B.calibration_windows(encoder, load_docs_corpus().passages("calibration"), 128, windows, seed=0)


def _bert_base(windows: int, layers: int = 12):
    from flax import nnx

    from jaxbsd.models import bert as B

    config = B.BertConfig(num_hidden_layers=layers)  # BERT-base: 12 layers, 768 -> 3072, 12 heads
    encoder = B.Encoder(B.Bert(config, rngs=nnx.Rngs(0)))
    ids = np.random.default_rng(0).integers(1000, config.vocab_size, (windows, 128), dtype=np.int32)
    return encoder, ids


#: The models a peak is measured on; ``bert-base-4``: BERT-base's first four layers (its block shape
#: and calibration at a third of the run time: the model's per-block terms are those of BERT-base).
MODELS = {"minilm": _minilm, "bert-base": _bert_base, "bert-base-4": lambda windows: _bert_base(windows, 4)}


def peak_worker(model: str, windows: int) -> dict:
    """Peak resident memory of one prune of ``model`` (a key of :data:`MODELS`) on ``windows`` windows."""
    from flax import nnx

    import jaxbsd as jb
    from jaxbsd.models import count_params

    rss_import = rss_bytes()
    encoder, ids = MODELS[model](windows)
    mask = np.ones_like(ids)
    mlp = encoder.bert.layers[0].mlp
    (m, H), n = mlp.fc1.kernel.shape, mlp.fc2.kernel.shape[1]
    params, param_bytes = count_params(encoder), sum(x.nbytes for x in jax.tree.leaves(nnx.state(encoder)))
    gc.collect()
    rss_loaded = rss_bytes()
    peak_reset = reset_peak()
    start = time.perf_counter()
    with StageSampler() as sampler:
        encoder, report = jb.compress_model(encoder, lambda m: m(ids, mask), key=jax.random.key(0), mlps=None,
                                            method="prune", reduction=0.25,
                                            execution=jb.Execution(progress=sampler.progress))
    seconds = time.perf_counter() - start
    peak = rss_bytes("VmHWM") if peak_reset else max(rss for _, rss in sampler.samples)
    shapes = {"layers": len(report.mlps), "tokens": int(ids.size), "m": int(m), "H": int(H), "n": int(n),
              "kept": [int(r.rank) for r in report.mlps], "heads": int(encoder.bert.config.num_attention_heads)}
    return {"model": model, "windows": windows, "tokens_per_window": int(ids.shape[1]), "params": int(params),
            "param_bytes": int(param_bytes), "rss_import_mb": rss_import / MB, "rss_loaded_mb": rss_loaded / MB,
            "peak_rss_mb": peak / MB, "peak_reset": peak_reset, "seconds": seconds,
            "stage_peaks_mb": sampler.peaks(), "shapes": shapes, "reduction": report.reduction,
            "output_errors": [float(r.output_error) for r in report.mlps]}


# --------------------------------------------------------------------------- the memory model


def memory_model(shapes: dict, windows: int, tokens_per_window: int, heads: int) -> dict[str, float]:
    """The memory model of one prune with refinement, in MB above the loaded model, term by term.

    ``N`` tokens (``windows × tokens_per_window``), ``L`` MLPs ``m → H → n``, ``k`` kept units (the
    most of any MLP), float32 activations (``b = 4``), float64 for the refit (8); ``R`` tokens reserved
    for the refinement's held-out error, ``C = min(N − R, 8192)`` check tokens, ``F`` fit tokens
    (``min(N − R − C, C)``); the refit uses the fit tokens when there are ``4 (k + 1)`` of them,
    else the check tokens (``N_fit``).

    * ``capture``: one MLP's captured inputs and outputs, ``N (m + n) b``;
    * ``site``: its check, fit and reserved tokens gathered, and refinement's copy of them,
      ``2 (C + F + R)(m + n) b``;
    * ``targets``: the original model's outputs of every MLP, the refinement's ``"consistent"``
      target, ``L N n b``;
    * ``forward``: the capture's largest intermediates, one MLP's hidden activations and one
      layer's attention scores, ``N H b + windows · heads · T² · b``;
    * ``refit``: the hidden activations in float64 and float32, the kept ones twice (centred) and
      the least-squares copies, ``N_fit (H (8 + b) + 3·8 k + 3·8 n)``;
    * ``every_layer`` (what a run holds that one block would not): the planning capture's inputs of
      the other MLPs and their planning sites, ``(L − 1)(N m b + (C + F + R)(m + n) b)``.

    ``one_block`` sums all but ``every_layer``; ``as_run`` sums them all.
    """
    from jaxbsd.compression.engine import Plan
    from jaxbsd.compression.refine import Refine

    b = 4
    L, m, H, n, k = shapes["layers"], shapes["m"], shapes["H"], shapes["n"], max(shapes["kept"])
    T = tokens_per_window
    N = windows * T
    R = Plan.reserved_tokens(Refine(), N)
    C = min(N - R, 8192)
    F = min(N - R - C, C)
    N_fit = F if F >= 4 * (k + 1) else C
    terms = {"capture": N * (m + n) * b, "site": 2 * (C + F + R) * (m + n) * b, "targets": L * N * n * b,
             "forward": N * H * b + windows * heads * T * T * b,
             "refit": N_fit * (H * (8 + b) + 3 * 8 * k + 3 * 8 * n),
             "every_layer": (L - 1) * (N * m * b + (C + F + R) * (m + n) * b)}
    out = {name: v / MB for name, v in terms.items()}
    out["one_block"] = sum(v for name, v in out.items() if name != "every_layer")
    out["as_run"] = out["one_block"] + out["every_layer"]
    return out


# --------------------------------------------------------------------------- the runner


def _worker(kind: str, args: dict, timeout: float) -> dict:
    """Run this script's ``--worker`` in a fresh process; its last stdout line is the JSON result."""
    cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", json.dumps({"kind": kind, **args})]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(HERE.parent))
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} worker failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _flat_row(flat: dict) -> Row:
    rss = [r["rss_mb"] for r in flat["rounds"]]
    growth = slope(rss[-SLOPE_OVER:])
    return Row(name=f"RSS growth per (load MiniLM, prune, evaluate), last {min(SLOPE_OVER, len(rss))} of {len(rss)}",
               ours=growth, reference=None, ratio=None, target=f"<= {TARGET_MB_PER_ITERATION:g} MB/iteration",
               passed=growth <= TARGET_MB_PER_ITERATION, unit="MB",
               note=f"RSS {rss[0]:.0f} -> {rss[-1]:.0f} MB over {len(rss)} iterations",
               details={**flat, "rss_mb": rss, "slope_over": SLOPE_OVER})


def _peak_rows(peaks: list[dict]) -> list[Row]:
    """One row per measured peak, with the memory model's prediction; the programs' term (the
    compiled programs and the runtime's own buffers: not modelled) is the first run's increment
    above its modelled activations, the others' predictions add it."""
    rows, programs = [], None
    for p in peaks:
        model = memory_model(p["shapes"], p["windows"], p["tokens_per_window"], p["shapes"]["heads"])
        increment = p["peak_rss_mb"] - p["rss_loaded_mb"]
        if programs is None:
            programs = increment - model["as_run"]
            calibrates = True
        else:
            calibrates = False
        predicted = p["rss_loaded_mb"] + programs + model["as_run"]
        rows.append(Row(
            name=f"peak RSS, prune rho=0.25 refined, {p['model']} ({p['params'] / 1e6:.0f} M), "
                 f"{p['windows']} x {p['tokens_per_window']} tokens",
            ours=p["peak_rss_mb"], reference=predicted, ratio=p["peak_rss_mb"] / predicted, target="", passed=None,
            unit="MB", note=("calibrates the programs' term" if calibrates else
                             f"one block's model: {p['rss_loaded_mb'] + programs + model['one_block']:.0f} MB"),
            details={**p, "model_mb": model, "programs_mb": programs, "calibrates_programs": calibrates,
                     "predicted_as_run_mb": predicted,
                     "predicted_one_block_mb": p["rss_loaded_mb"] + programs + model["one_block"]}))
    return rows


#: (model, windows) of the peak runs; the first calibrates the programs' term.
PEAKS = (("minilm", 8), ("minilm", 64), ("bert-base-4", 64))
QUICK_PEAKS = (("minilm", 8), ("minilm", 16))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    jax.config.update("jax_enable_x64", False)
    if args.worker is not None:
        job = json.loads(args.worker)
        kind = job.pop("kind")
        result = flat_worker(**job) if kind == "flat" else peak_worker(**job)
        print(json.dumps(result))
        return 0
    # Every measurement in its own process, all at once: each one's resident set is its own, and on a
    # shared machine the wall time is the longest one's (the times recorded are not speed claims).
    jobs = [("flat", {"iterations": 4 if args.quick else 10, "windows": 8})]
    jobs += [("peak", {"model": name, "windows": w}) for name, w in (QUICK_PEAKS if args.quick else PEAKS)]
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(lambda job: _worker(*job, timeout=5400), jobs))
    rows = [_flat_row(results[0]), *_peak_rows(results[1:])]
    print(format_table(rows))
    out = args.out or (pathlib.Path("/tmp/memory_quick.json") if args.quick else HERE / "memory.json")
    command = "python benchmarks/memory.py" + (" --quick" if args.quick else "")
    write_rows(out, command, args.quick, rows)
    return 0 if rows[0].passed or args.quick else 1


if __name__ == "__main__":
    sys.exit(main())
