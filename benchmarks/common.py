"""What the benchmark scripts share: the result row, interleaved timing, the NumPy-side BLAS
settings, the fresh-process workers, the table and JSON.

Every module of ``benchmarks/`` may import this one; it imports none of them, so the imports run
one way (the runner :mod:`benchmarks.run` → the subjects → :mod:`benchmarks.problems` → this).
Importing this module enables float64 in JAX, as the benchmark scripts do: float64 where stated,
float32 always explicit.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import jax

jax.config.update("jax_enable_x64", True)  # float64 where stated; float32 is always explicit

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

__all__ = [
    "GiB", "ROOT", "RUNNER", "Row", "interleaved", "block", "check_dtype", "rel_diff", "format_table", "jsonable",
    "numpy_blas_variants", "best_reference", "on_accelerator", "run_worker", "write_rows",
]

GiB = 1024**3
#: The repository root (the working directory of the fresh-process workers).
ROOT = Path(__file__).resolve().parents[1]
#: The runner's script: the fresh-process workers are its ``--headline-worker`` and
#: ``--restarts-worker`` flags (:func:`run_worker`).
RUNNER = Path(__file__).resolve().parent / "run.py"


@dataclasses.dataclass
class Row:
    """One line of the result table.

    ``ours`` and ``reference`` are in ``unit``; ``ratio`` is oriented so that ``target`` reads
    naturally (a speed-up ``reference / ours`` unless ``note`` says otherwise); ``passed`` is
    ``None`` for informational rows without a target. Pass/fail uses the medians;
    ``ratio_min`` (best repeat of each side) shows how much of the spread is machine load.
    """

    name: str
    ours: float | None
    reference: float | None
    ratio: float | None
    target: str
    passed: bool | None
    unit: str = "s"
    note: str = ""
    ratio_min: float | None = None  #: the same ratio from the fastest repeat of each side
    details: dict = dataclasses.field(default_factory=dict)


def interleaved(fns: dict[str, Callable[[], Any]], repeats: int = 5, warmup: int = 1) -> dict[str, dict]:
    """Time blocking callables side by side: ``warmup`` untimed rounds, then ``repeats``
    rounds, each calling every function once, in alternating order (so slow drifts of the
    machine's load hit all of them alike).

    Returns:
      ``{name: {"median": s, "min": s, "times": [s, ...]}}``.
    """
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(repeats):
        for name in names if i % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - t0)
    return {n: {"median": statistics.median(t), "min": min(t), "times": t} for n, t in times.items()}


def block(x):
    """``jax.block_until_ready(x)``: ``x`` once every array in it is computed."""
    return jax.block_until_ready(x)


def check_dtype(what: str, tree, dtype) -> None:
    """Fail loudly if a benchmark that claims a dtype silently computed in another one."""
    found = {str(jnp.dtype(x.dtype)) for x in jax.tree_util.tree_leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)}
    if found != {str(jnp.dtype(dtype))}:
        raise RuntimeError(f"{what}: expected {jnp.dtype(dtype)} results, got {sorted(found)}")


def rel_diff(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), np.finfo(np.float64).tiny))


def numpy_blas_variants(fn: Callable[[], Any], name: str) -> dict[str, Callable[[], Any]]:
    """``fn`` as is (NumPy's BLAS at its default thread count) and, if threadpoolctl can
    reach NumPy's BLAS, with it limited to one thread: on a loaded machine the multi-threaded
    BLAS can lose far more to contention than it gains, so the NumPy-side references are
    timed both ways and the faster median is used (the reference's best configuration)."""
    out = {name: fn}
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover
        return out
    ctl = ThreadpoolController()
    paths = [c.filepath for c in ctl.lib_controllers if c.user_api == "blas" and "numpy" in c.filepath]
    if paths:
        blas = ctl.select(filepath=paths)

        def limited():
            with blas.limit(limits=1):
                return fn()

        out[name + "@1thread"] = limited
    return out


def best_reference(t: dict, name: str) -> tuple[str, dict]:
    """The faster (by median) of ``name`` and ``name@1thread`` in timings ``t``."""
    keys = [k for k in (name, name + "@1thread") if k in t]
    k = min(keys, key=lambda k: t[k]["median"])
    return k, t[k]


def on_accelerator() -> bool:
    """Whether JAX's default backend is an accelerator (not the CPU)."""
    return jax.default_backend() != "cpu"


def run_worker(flag: str, args: dict, timeout: float) -> dict | None:
    """Run ``run.py <flag> <json args>`` (:data:`RUNNER`) in a fresh process; its last stdout
    line is JSON.

    Returns ``None`` if it did not finish within ``timeout`` seconds (killed).
    """
    cmd = [sys.executable, str(RUNNER), flag, json.dumps(args)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(ROOT))
    except subprocess.TimeoutExpired:
        return None
    if proc.returncode != 0:
        raise RuntimeError(f"{flag} worker failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "s":
        if value >= 1:
            return f"{value:.2f} s"
        if value >= 1e-3:
            return f"{value * 1e3:.2f} ms"
        return f"{value * 1e6:.1f} µs"
    return f"{value:.2f} {unit}"


def format_table(rows: list[Row]) -> str:
    header = ("name", "ours", "reference", "ratio", "ratio(min)", "target", "pass")
    lines = [
        (
            r.name,
            _fmt(r.ours, r.unit),
            _fmt(r.reference, r.unit),
            "—" if r.ratio is None else f"{r.ratio:.2f}x",
            "—" if r.ratio_min is None else f"{r.ratio_min:.2f}x",
            r.target,
            {True: "PASS", False: "FAIL", None: "-"}[r.passed],
        )
        for r in rows
    ]
    widths = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    out = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*l) for l in lines]
    out.append("")
    out += [f"  {r.name}: {r.note}" for r in rows if r.note]
    return "\n".join(out)


def jsonable(x):
    """``x`` as plain JSON: string keys, lists for tuples, Python scalars, non-finite floats as ``None``."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (np.generic,)):
        return x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def write_rows(out, command: str, quick: bool, rows: list) -> None:
    """Write a side-by-side benchmark's rows (:class:`Row`) to ``out`` as JSON, with its command,
    mode, device and provenance, and say where."""
    from jaxbsd.io import provenance, write_json_atomic

    write_json_atomic(out, {"command": command, "mode": "quick" if quick else "full",
                            "device": jax.devices()[0].platform, "rows": [r.__dict__ for r in rows],
                            "provenance": provenance(command)})
    print(f"wrote {out}")


def rss_bytes(field: str = "VmRSS") -> int:
    """A field of ``/proc/self/status`` (``VmRSS``: resident now; ``VmHWM``: its peak), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


class StageSampler:
    """The resident set every ``every`` seconds on a thread, each sample labelled with the stage (a
    compression's ``"planning"``, then ``"step k: path"`` from its progress events); :meth:`peaks` in MB."""

    def __init__(self, every: float = 0.05):
        self.every, self.stage, self.samples = every, "planning", []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.samples.append((self.stage, rss_bytes()))
            self._stop.wait(self.every)

    def progress(self, event):
        if event.kind == "start":
            self.stage = f"step {event.position}: {event.paths[0]}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def peaks(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for stage, rss in self.samples:
            out[stage] = max(out.get(stage, 0.0), rss / 1e6)
        return out
