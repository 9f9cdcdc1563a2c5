"""Where the committed results are, how a table reads one, and the line that says where it came from.

The folders are module attributes read when a result is loaded (``committed.RESULTS``, through
:func:`load`), never copied: ``report.py --results DIR`` and the tests point them elsewhere by
setting them here.
"""

from __future__ import annotations

import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results"
README = ROOT / "README.md"
DOCS = ROOT / "docs"
BENCHMARKS = ROOT / "benchmarks"


def result_files(root: pathlib.Path | None = None) -> list[pathlib.Path]:
    """Every committed result: ``experiments/results/*.json`` and ``benchmarks/*.json``."""
    root = ROOT if root is None else root
    return sorted((root / "experiments" / "results").glob("*.json")) + sorted((root / "benchmarks").glob("*.json"))


def load(name: str) -> dict | None:
    """The result ``experiments/results/<name>`` (of :data:`RESULTS`), or ``None`` if it is not committed."""
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else None


_JSON_CACHE: dict = {}


def read_json(path: pathlib.Path) -> dict:
    """The JSON at ``path``, parsed once per version of the file (shared: figures only read it)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    if key not in _JSON_CACHE:
        _JSON_CACHE[key] = json.loads(path.read_bytes())
    return _JSON_CACHE[key]


def run_seconds(payload: dict) -> float:
    """Seconds the result's runs took, each as recorded when it finished (0 if none say)."""
    if "run_seconds_total" in payload:  # full_compression records the sum itself
        return payload["run_seconds_total"]
    runs = payload.get("runs")
    return sum(r.get("seconds") or 0 for r in runs if isinstance(r, dict)) if isinstance(runs, list) else 0.0


def source_line(payload: dict) -> str:
    """The line above a table that says which command and commit wrote the result, and what it cost where."""
    prov = payload.get("provenance")
    if not prov:
        return "**No provenance: this result is stale (report --check fails) and must be regenerated.**"
    wall = payload.get("wall_seconds")
    machines = payload.get("machines") or []
    if any("(cpu)" not in m for m in machines):
        # Runs kept from unit.json computed elsewhere (a GPU): say where, and what they cost there.
        where = f" (runs: {run_seconds(payload) / 60:.1f} min on {', '.join(machines)})."
    elif wall and (runs := run_seconds(payload)) > 2 * wall:
        # Most runs were kept from unit.json (a study that spans sessions): their own time counts.
        where = (f" (runs: {runs / 3600:.1f} h on the 2-core CPU machine over several sessions; "
                 f"this assembly {wall / 60:.1f} min).")
    else:
        where = f" ({wall / 60:.1f} min on the 2-core CPU machine)." if wall else "."
    return f"Generated from `{prov['command']}` at commit `{str(prov['commit'])[:10]}`" + where
