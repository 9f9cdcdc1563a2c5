"""The benchmarks (``benchmarks/*.json``): the solver's and the refinement's timings on each
machine that measured them, with their figure sources."""

from __future__ import annotations

import json
import re

from .. import committed
from ..committed import source_line
from ..formats import bench_value, md
from ..registry import source, table
from ..stats import Result


class Benchmark(Result):
    def row(self, prefix: str) -> dict:
        """The benchmark row whose name starts with ``prefix``."""
        rows = [r for r in self.json["rows"] if r["name"].startswith(prefix)]
        if len(rows) != 1:
            raise KeyError(f"{len(rows)} benchmark rows start with {prefix!r}")
        return rows[0]

    def note(self, prefix: str, pattern: str) -> float:
        """A number the row's note records: the first group of ``pattern`` (a regex) in it."""
        note = self.row(prefix).get("note") or ""
        m = re.search(pattern, note)
        if m is None:
            raise KeyError(f"{pattern!r} not in the note of {prefix!r}: {note!r}")
        return float(m.group(1))

    def rows(self, prefix: str) -> list[dict]:
        return [r for r in self.json["rows"] if r["name"].startswith(prefix)]


@table("benchmarks")
@table("benchmarks-gpu", "results_gpu.json")
def benchmark_table(name: str = "results.json") -> str:
    """The benchmark table of ``benchmarks/<name>``, headed by the machine that measured it."""
    path = committed.BENCHMARKS / name
    if not path.exists():
        return "_No benchmark result committed._"
    d = json.loads(path.read_text())
    if not d.get("provenance"):
        return source_line(d)
    value = bench_value
    rows = []
    for r in d["rows"]:
        ratio = "—" if r.get("ratio") is None else f"{r['ratio']:.2f}×"
        passed = {True: "yes", False: "**no**", None: "—"}[r.get("passed")]
        unit = r.get("unit", "s")
        rows.append([r["name"], value(r.get("ours"), unit), value(r.get("reference"), unit), ratio,
                     str(r.get("target") or "—"), passed])
    m = d["machine"]
    head = (f"Generated from `{d['provenance']['command']}` at commit `{str(d['provenance']['commit'])[:10]}` "
            f"({d['total_s'] / 60:.1f} min on {m.get('device_kind', '?')} ({m.get('backend', '?')}), "
            f"{m.get('cpu_count', '?')} CPUs, jax {m.get('jax', '?')}, load at start "
            f"{[round(x, 2) for x in m.get('loadavg_start') or []]}).")
    notes = [f"- {r['name']}: {r['note']}" for r in d["rows"]
             if r.get("note") and (r["name"].startswith("(f)") or "headline" in r["name"])]
    table = md(["benchmark", "ours", "reference", "ratio", "target", "met"], rows)
    return head + "\n\n" + table + ("\n\n" + "\n".join(notes) if notes else "")


@table("headline-benchmarks")
def headline_benchmarks() -> str:
    """The headline benchmark rows on each machine that measured them."""
    rows = []
    for name in ("results.json", "results_gpu.json"):
        path = committed.BENCHMARKS / name
        if not path.exists():
            continue
        d = json.loads(path.read_text())
        m = d.get("machine", {})
        machine = f"{m.get('cpu_count', '?')}-core CPU" if m.get("backend") == "cpu" else m.get("device_kind", "?")
        for r in d.get("rows", []):
            if r["name"].startswith(("(c) headline: 100 sweeps", "(d) DecoupledMLP")):
                unit = r.get("unit", "s")
                met = {True: "yes", False: "**no**", None: "—"}[r.get("passed")]
                rows.append([r["name"], machine, bench_value(r.get("ours"), unit),
                             bench_value(r.get("reference"), unit), str(r.get("target") or "—"), met])
    if not rows:
        return "_No benchmark result committed._"
    return md(["benchmark", "machine", "ours", "reference", "target", "met"], rows)


@table("refine-benchmark")
def refine_benchmark_table() -> str:
    """``benchmarks/refine.json``: the refinement stage against the decoupling, per MLP shape."""
    path = committed.BENCHMARKS / "refine.json"
    if not path.exists():
        return "No current result committed (`python benchmarks/refine.py`)."
    d = json.loads(path.read_text())
    rows = []
    for r in d["rows"]:
        m = re.search(r"refinement(?P<how> \(full batch\))? / decoupling, (?P<what>.*?) \((?P<shape>[^)]*)\)", r["name"])
        what, shape = (m["what"] + (", full batch" if m["how"] else ", default (minibatches of 512)"),
                       m["shape"]) if m else (r["name"], "")
        ratio_ = "—" if r.get("ratio") is None else f"{r['ratio']:.3f}"
        rows.append([what, shape, bench_value(r.get("ours"), "s"), bench_value(r.get("reference"), "s"), ratio_,
                     str(r.get("target") or "—").replace("<=", "≤"),
                     {True: "yes", False: "**no**", None: "—"}[r.get("passed")]])
    head = (source_line(d) + f" Device: {d.get('device', '?')}; median of the timed repeats, the two stages "
            "timed alternately, compiled.")
    return "\n".join([head, "", md(["MLP", "shape", "refine", "decouple", "ratio", "target", "met"], rows)])


class GroupedBenchmark(Result):
    def says(self) -> str:
        """The comparison as prose: the first run against one block at a time (not slower when the
        grouped median is within the spread of one block at a time's own rounds), the compiled run,
        the solver programs compiled, and where the first run's time goes."""
        seq, grp, ratio = self.json["results"]["sequential"], self.json["results"]["grouped"], self.json["ratios"]
        same = grp["first"] <= max(seq["first_runs"])
        n_seq, n_grp = sum(seq["solver_programs"].values()), sum(grp["solver_programs"].values())
        text = (f"The first run, compiles included, takes {seq['first']:.1f} s one block at a time and "
                f"{grp['first']:.1f} s grouped ({ratio['first_run']:.2f}×): "
                + ("**not slower**, within the spread of one block at a time's own rounds "
                   f"({', '.join(f'{x:.1f}' for x in seq['first_runs'])} s)" if same else "**slower**")
                + f"; the compiled run takes {seq['steady']:.2f} s and {grp['steady']:.2f} s "
                f"({ratio['steady_median']:.2f}×). The solve's and refinement's programs compiled: {n_seq} one block "
                f"at a time (one per method step, reused by every block of the shape), {n_grp} grouped")
        if "compile_seconds" in seq:
            cs, cg = seq["compile_seconds"], grp["compile_seconds"]
            text += (f". XLA's compile is most of a first run: {cs['XLA compile']:.1f} s of {seq['first']:.1f} s one "
                     f"block at a time, {cg['XLA compile']:.1f} s of {grp['first']:.1f} s grouped, of which the solver "
                     f"programs' {cs['solver programs (XLA)']:.1f} s and {cg['solver programs (XLA)']:.1f} s")
        fus = self.json["results"].get("fused")
        if fus is not None:  # the fused program (a mesh's, an accelerator's) forced on this CPU
            text += (f". Fused in one program (solve and refinement, what a mesh or an accelerator runs), the first "
                     f"run takes {fus['first']:.1f} s ({ratio['fused_first_run']:.2f}×), XLA's compile "
                     f"{fus['compile_seconds']['XLA compile']:.1f} s, the solver programs' "
                     f"{fus['compile_seconds']['solver programs (XLA)']:.1f} s")
        return text + "."

    def sweep_part(self, rank: str, part: str) -> float:
        """Seconds of ``part`` in the profile of the MiniLM-size sweep row at ``rank`` (``"r=765"``)."""
        rows = [r for r in self.json["sweep_vs_bound"] if f"MiniLM MLP, {rank}]" in r["name"]]
        if len(rows) != 1:
            raise KeyError(f"{len(rows)} sweep rows at {rank!r}")
        return float(rows[0]["details"]["parts_s"][part])


source("bench", "results.json", Benchmark, folder="benchmarks")
source("bench_grouped", "grouped.json", GroupedBenchmark, folder="benchmarks")
source("bench_gpu", "results_gpu.json", Benchmark, folder="benchmarks")
source("bench_refine", "refine.json", Benchmark, folder="benchmarks")
source("bench_memory", "memory.json", Benchmark, folder="benchmarks")
source("bench_minilm", "minilm.json", Benchmark, folder="benchmarks")
source("bench_scale", "scale.json", Benchmark, folder="benchmarks")


def _grouped_comparison(d: dict) -> list[str]:
    """The head and the table of one grouped-against-sequential comparison (``benchmarks/grouped*.json``)."""
    seq, grp, ratio = d["results"]["sequential"], d["results"]["grouped"], d["ratios"]
    mdl = d["model"]
    head = (source_line(d) + f" Device: {d.get('device', '?')}. A {mdl['blocks']}-block model, MLPs "
            f"{mdl['m']} → {mdl['H']} → {mdl['m']} at rank {mdl['rank']}, `jb.BSD()` and `jb.Refine()` defaults; "
            f"each mode in fresh processes, {d['rounds']} alternating round(s), medians; ratio = one at a time / grouped"
            + (" (or / fused: grouped with the solve and the refinement in one program, what a mesh or an "
               "accelerator runs, forced on this CPU)." if "fused" in d["results"] else "."))
    programs = lambda r: ", ".join(f"`{k}` × {v}" for k, v in sorted(r["solver_programs"].items()))  # noqa: E731
    modes = [grp] + ([d["results"]["fused"]] if "fused" in d["results"] else [])
    prefixes = ["", "fused_"][:len(modes)]

    def row(name, value, ratio_key=None, ratio_of=None):
        cells = [name, value(seq)]
        for mode, prefix in zip(modes, prefixes):
            cells.append(value(mode))
            cells.append(f"{ratio[prefix + ratio_key]:.2f}×" if ratio_key else ratio_of(mode) if ratio_of else "—")
        return cells

    rows = [
        row("first run (compiles included)", lambda r: f"{r['first']:.1f} s", "first_run"),
        row("steady run (compiled)", lambda r: f"{r['steady']:.2f} s", "steady_median"),
        row("XLA compiles, first run", lambda r: f"{r['compiles']:.0f}", "compiles"),
        row("of which the solve's and refinement's programs", programs),
        # where the first run's compile time goes (benchmarks run before this profile have none)
        *([row(f"first run: {stage}", lambda r, stage=stage: f"{r['compile_seconds'][stage]:.1f} s",
               ratio_of=lambda r, stage=stage: f"{seq['compile_seconds'][stage] / max(r['compile_seconds'][stage], 1e-9):.2f}×")
           for stage in seq["compile_seconds"]] if "compile_seconds" in seq else []),
        row("peak resident memory", lambda r: f"{r['peak_rss_mib']:.0f} MiB", "peak_rss"),
    ]
    heads = ["", "one block at a time"] + [h for h in (["grouped", "ratio"], ["fused", "ratio"])[:len(modes)] for h in h]
    return [head, "", md(heads, rows)]


@table("grouped-benchmark")
def grouped_benchmark_table() -> str:
    """``benchmarks/grouped.json``: grouped compression against one block at a time on one device
    (and ``grouped_minilm.json``, the same at MiniLM's MLP size, where committed), the CUDA export's
    loop count, and the sweep against this machine's GEMM bound with its profile."""
    path = committed.BENCHMARKS / "grouped.json"
    if not path.exists():
        return "No current result committed (`python benchmarks/grouped.py`)."
    d = json.loads(path.read_text())
    out = _grouped_comparison(d)
    minilm = committed.BENCHMARKS / "grouped_minilm.json"
    if minilm.exists():
        out += ["", "At MiniLM's MLP size:", "", *_grouped_comparison(json.loads(minilm.read_text()))]
    ex = d["cuda_export"]
    export = (f"The group program of {ex['blocks']} blocks × {ex['restarts']} restarts exported for CUDA "
              f"(`jax.export`, lowered on this CPU) has {ex['while_loops']} device-side loop(s) "
              f"(`stablehlo.while`); its carry holds every block's every restart: {'yes' if ex['carry_holds_all'] else 'no'}.")
    sweep_rows = []
    for r in d["sweep_vs_bound"]:
        sweep_rows.append([r["name"], bench_value(r.get("ours"), "s"), bench_value(r.get("reference"), "s"),
                           f"{r['ratio']:.2f}×"])
    notes = "\n".join(f"- {r['name']}: {r['note']}" for r in d["sweep_vs_bound"])
    return "\n".join([*out, "", export, "", md(["sweep", "per sweep", "GEMM bound", "multiple"], sweep_rows), "", notes])


@table("minilm-benchmark")
def minilm_benchmark_table() -> str:
    """``benchmarks/minilm.json``: one MiniLM MLP pruned, decoupled today and decoupled in the
    augmented basis, side by side at each share, in seconds and as multiples of pruning's time and
    of the matmul bound; then the augmented decoupling against pruning at every MLP."""
    path = committed.BENCHMARKS / "minilm.json"
    if not path.exists():
        return "No current result committed (`python benchmarks/minilm.py`)."
    d = json.loads(path.read_text())
    label = {"prune": "pruning", "bsd": "B-splines (today)", "bsd-aug": "B-splines, augmented"}
    rows, inners = [], []
    for r in (r for r in d["rows"] if not r["name"].startswith("every MLP")):
        x = r["details"]
        if x["method"] == "prune":
            rows.append([f"{x['share']:g}", label["prune"], f"k = {x['units']}", f"{x['params']:,}",
                         bench_value(x["seconds"], "s"), "1× (1×)", "—", "—", "—", f"{x['output_error']:.4f}", "—"])
            continue
        kept = "last" if x["sweep_kept"] is None else f"{x['sweep_kept']} ({x['stopped'].replace('_', ' ')})"
        name = label[x["method"]] + (f", `{x['inner']}` + GELU" if x.get("inner") else "")
        if x.get("inner") and x["inner"] not in inners:
            inners.append(x["inner"])
        rows.append([f"{x['share']:g}", name, f"r = {x['rank']}", f"{x['params']:,}",
                     bench_value(x["seconds"], "s"), f"{x['x_prune']:.1f}× ({x['x_prune_min']:.1f}×)",
                     bench_value(x["matmul_bound_s"], "s"),
                     f"{x['x_bound']:.1f}×", f"{x['sweeps']} / {kept}", f"{x['output_error']:.4f}",
                     f"{x['error_vs_prune']:+.1%}"])
    # Recorded since the warm start could be solved alone (restarts=0); rows before it had one random restart beside it.
    alone = any(r["details"].get("restarts") == 0 for r in d["rows"] if r["details"].get("method") == "bsd-aug")
    head = (source_line(d) + f" Device: {d.get('device', '?')}. `bert.layers.3.mlp` of all-MiniLM-L6-v2 at the same "
            "parameter budget, compiled, float32, one run: `jb.Prune()`; `jb.BSD()` (ν = 4, 300 sweeps, warm start, "
            "held-out selection); the augmented basis `jb.Augmented(inner, \"gelu\")` with "
            f"`best_iterate=True`{', `restarts=0` (the warm start alone)' if alone else ''} and "
            f"`CMTFConfig(patience=5)` for the inner bases {', '.join(f'`{i}`' for i in inners)}, "
            "at the rank within the budget (and the constant one at today's rank). "
            "Pruning and the augmented builds are timed interleaved, 3 rounds after a warm-up (medians; × pruning "
            "of the minima in brackets), today's decoupling once after a warm-up build. "
            "Bound = the GEMM work of the sweeps run through the structured Jacobian at this run's GEMM rate; "
            "sweeps = run / kept (0: the warm start, i.e. the pruned MLP: with the constant inner basis the "
            "r-unit pruned MLP itself, its output bias its own at every rank; with a larger inner basis, of r units "
            "whose constants carry the output bias at r ≥ 384, the MLP's output width, of r − 1 and a constant unit "
            "below); output error on the check tokens, held out from every choice.")
    every = [r["details"] for r in d["rows"] if r["name"].startswith("every MLP")]
    out = [head, "", md(["MLP share removed", "method", "rank", "parameters", "seconds", "× pruning (minima)", "matmul bound",
                         "× bound", "sweeps run / kept", "output error", "vs pruning"], rows)]
    augmented = [r["details"] for r in d["rows"] if r["details"].get("method") == "bsd-aug"]
    kept = sorted({x["sweep_kept"] for x in augmented if x.get("sweep_kept") is not None})
    if augmented and kept == [0]:
        out += ["", "Every augmented row keeps sweep 0: no sweep improves on the warm start on the "
                "held-out tokens, so each augmented decoupling is the pruned MLP written as a decoupling (with the "
                "constant inner basis, the r-unit pruned MLP itself at every rank), its sweeps discarded."]
    if every:
        erows = [[x["path"], f"r = {x['rank']} ({x['params']:,})", f"k = {x['prune']['units']} ({x['prune']['params']:,})",
                  f"{x['output_error']:.4f}", f"{x['prune']['output_error']:.4f}", f"{x['error_vs_prune']:+.2%}",
                  f"{x['sweeps']} / {x['sweep_kept']}", f"{x['seconds']:.1f} s / {x['prune']['seconds']:.2f} s"]
                 for x in every]
        worst = max(x["error_vs_prune"] for x in every)
        basis = f" (`{every[0]['inner']}` + GELU)" if every[0].get("inner") else ""
        out += ["", f"Every MLP at s = {every[0]['share']:g}, the augmented decoupling{basis} against pruning within the same "
                f"parameter budget (each MLP on its own captured tokens); the worst relative excess is {worst:+.2%}.", "",
                md(["MLP", "B-splines, augmented (params)", "pruning (params)", "output error (augmented)",
                    "output error (pruning)", "relative", "sweeps run / kept", "seconds (augmented / pruning)"], erows)]
    return "\n".join(out + _minilm_end_to_end())


def _minilm_end_to_end() -> list[str]:
    """``experiments/results/minilm_end_to_end.json``, where committed: the refined compression of
    MiniLM's six MLPs by pruning and by the augmented decoupling, in wall time and mean cosine."""
    d = committed.load("minilm_end_to_end.json")
    if d is None:
        return []
    rows = [[r["method"], f"{r['params']:,}", f"{r['seconds']:.0f} s", f"{r['mean_cosine']:.4f}",
             f"{r['recall@10']:.3f}", ", ".join("—" if m.get("sweep_kept") is None else str(m["sweep_kept"]) for m in r["mlps"]),
             f"{r['load_1min'][0]:.1f} → {r['load_1min'][1]:.1f}"] for r in d["runs"]]
    ratio = "" if d["seconds_ratio"] is None else f" The augmented decoupling took {d['seconds_ratio']:.2f}× pruning's wall time."
    head = (f"{source_line(d)} Refined end-to-end (`jb.Refine()`), the six MLPs at s = {d['share']:g} of their "
            f"parameters removed, back to front, uniform allocation, one process, compiles included; calibration "
            f"{d['calibration']}; measured as in the MiniLM study.{ratio}")
    return ["", head, "", md(["method", "parameters", "wall time", "mean cosine", "recall@10",
                              "sweep kept per MLP", "load (1 min) before → after"], rows)]


source("bench_compile_cache", "compile_cache.json", Result, folder="benchmarks")


@table("compile-cache-benchmark")
def compile_cache_benchmark_table() -> str:
    """``benchmarks/compile_cache.json``: the same ``jaxbsd`` command twice in fresh processes, one
    empty persistent compilation cache: where each run's compile time goes, and the cache's hits."""
    path = committed.BENCHMARKS / "compile_cache.json"
    if not path.exists():
        return "No current result committed (`python benchmarks/compile_cache.py`)."
    d = json.loads(path.read_text())
    first, second = d["runs"]
    ratio = lambda a, b: f"{b / a:.3f}" if a else "—"  # noqa: E731
    rows = [[label, f"{first['compile_seconds'][k]:.2f} s", f"{second['compile_seconds'][k]:.2f} s",
             ratio(first["compile_seconds"][k], second["compile_seconds"][k])]
            for label, k in (("XLA compile (on a hit: the cache's read)", "XLA compile"),
                             ("of which the cache's read", "cache read"), ("tracing to a jaxpr", "tracing"),
                             ("lowering to StableHLO", "lowering"))]
    rows += [["the command's wall time", f"{first['command_s']:.1f} s", f"{second['command_s']:.1f} s",
              ratio(first["command_s"], second["command_s"])],
             ["programs compiled (cache hits, misses)", f"{first['compiles']} ({first['hits']}, {first['misses']})",
              f"{second['compiles']} ({second['hits']}, {second['misses']})", "—"]]
    head = (source_line(d) + f" Device: {d.get('device', '?')}. `{d['measured_command']}` on {d['model_dir']}, "
            "twice, each in a fresh process, one cache directory empty before the first; target: the second run's "
            "XLA compile at most 0.10 × the first's.")
    return "\n".join([head, "", md(["", "first run", "second run", "second / first"], rows)])


#: The memory model's terms as the table names them (``benchmarks/memory.py``'s ``memory_model``).
_MEMORY_TERMS = (("capture", "one MLP's capture"), ("site", "its site and refinement tokens"),
                 ("targets", "every MLP's refinement targets"), ("forward", "the capture's intermediates"),
                 ("refit", "the pruning refit"), ("every_layer", "the other MLPs' planning tokens and sites"))


@table("memory-benchmark")
def memory_benchmark_table() -> str:
    """``benchmarks/memory.json``: resident memory over repeated compressions in one process, and the
    peak of one compression against the memory model, term by term."""
    path = committed.BENCHMARKS / "memory.json"
    if not path.exists():
        return "No current result committed (`python benchmarks/memory.py`)."
    d = json.loads(path.read_text())
    flat, peaks = d["rows"][0], d["rows"][1:]
    rss = flat["details"]["rss_mb"]
    head = (source_line(d) + f" Device: {d.get('device', '?')}. Resident set (`VmRSS`) after each of {len(rss)} "
            f"iterations in one process; growth = least-squares slope over the last {flat['details']['slope_over']}.")
    flat_table = md(["iterations", "RSS after each (MB)", "growth", "target", "met"],
                    [[str(len(rss)), ", ".join(f"{x:.0f}" for x in rss), f"{flat['ours']:.1f} MB/iteration",
                      flat["target"].replace("<=", "≤"), {True: "yes", False: "**no**"}[flat["passed"]]]])
    cols = ["model", "tokens", "loaded", "peak measured", "predicted (as run)", "measured / predicted",
            "predicted (one block)", "compression time"]
    rows = []
    for r in peaks:
        p = r["details"]
        rows.append([f"{p['model']} ({p['params'] / 1e6:.0f} M)", f"{p['windows']} × {p['tokens_per_window']}",
                     f"{p['rss_loaded_mb']:.0f} MB", f"{p['peak_rss_mb']:.0f} MB",
                     f"{p['predicted_as_run_mb']:.0f} MB" + (" (calibrates)" if p["calibrates_programs"] else ""),
                     f"{r['ratio']:.2f}", f"{p['predicted_one_block_mb']:.0f} MB", f"{p['seconds']:.0f} s"])
    terms = [[label] + [f"{r['details']['model_mb'][key]:.0f}" for r in peaks] for key, label in _MEMORY_TERMS]
    terms.append(["compiled programs and runtime (measured)"] + [f"{r['details']['programs_mb']:.0f}" for r in peaks])
    names = [f"{r['details']['model']}, {r['details']['windows']} windows (MB)" for r in peaks]
    return "\n".join([head, "", flat_table, "", md(cols, rows), "", "The model's terms:", "",
                      md(["term", *names], terms)])


@table("scale-benchmark")
def scale_benchmark_table() -> str:
    """``benchmarks/scale.json``: pruning random-weight models of base size, refined and not, in wall
    time and peak resident memory, against the targets of the refined runs."""
    path = committed.BENCHMARKS / "scale.json"
    if not path.exists():
        return "No current result committed (`python benchmarks/scale.py`)."
    d = json.loads(path.read_text())
    rows = []
    for r in d["rows"]:
        x = r["details"]
        refine = sum(s for s in x["seconds_refine_per_mlp"] if s) if x["refine"] else None
        planning = x.get("seconds_planning")  # recorded since the benchmark samples the stages
        rows.append([x["model"], f"{x['params'] / 1e6:.0f} M", str(x["mlps"]), "refined" if x["refine"] else "not refined",
                     bench_value(x["seconds_call"], "s"), "—" if planning is None else bench_value(planning, "s"),
                     "—" if refine is None else bench_value(refine, "s"),
                     f"{x['peak_rss_gb']:.2f} GB", r["target"] or "—",
                     "—" if r["passed"] is None else ("yes" if r["passed"] else "no")])
    head = (source_line(d) + f" Device: {d.get('device', '?')}. `jb.compress_model(mlps=None, method=\"prune\", "
            "reduction=0.25)` on 64 windows of 128 random token ids, random weights, float32, each case in a fresh "
            "process (compiles included); planning = the capture of every MLP's tokens, the sites and the ranks, "
            "until the first step; peak RSS is the process's `ru_maxrss`.")
    return "\n".join([head, "", md(["model", "parameters", "MLPs", "refinement", "wall (the call)", "of it planning",
                                    "of it refining", "peak RSS", "target", "met"], rows)])
