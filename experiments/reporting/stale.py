"""The staleness guard: a committed result's provenance, and its solver fingerprint against this
checkout's solver. The only module of the package that imports :mod:`jaxbsd` (lazily, on first
need: rendering pages never computes a fingerprint)."""

from __future__ import annotations

import json
import pathlib
from typing import Iterable

from . import committed


#: Provenance keys that mark a result computed with the solver (older results record only the
#: source hash of the solver files; those need a fingerprint too).
SOLVER_KEYS = ("solver_fingerprint", "fingerprint_version", "solver_hash", "solver_files")


def _fingerprint_module():
    """:mod:`jaxbsd.solver.fingerprint` as imported; :func:`stale_results` refuses to compare against it
    unless it is this checkout's (an editable install may be another tree's: run from the checkout
    with ``PYTHONPATH=.``)."""
    from jaxbsd.solver import fingerprint

    return fingerprint


def stale_results(paths: Iterable[pathlib.Path], fingerprint: dict | None = None) -> list[str]:
    """Problems with the given result files: a missing or incomplete ``provenance``; for a result
    computed with the solver, no ``solver_fingerprint`` or one that moved beyond tolerance
    against ``fingerprint`` (default: this checkout's solver's, computed once, on first need).
    Empty when every result is current."""
    fp = _fingerprint_module()
    current = fingerprint
    problems = []
    foreign = not pathlib.Path(fp.__file__).resolve().is_relative_to(committed.ROOT.resolve())
    for path in paths:
        try:
            prov = json.loads(path.read_text()).get("provenance")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
            problems.append(f"{path}: not a JSON results object ({e})")
            continue
        if not isinstance(prov, dict) or not all(prov.get(k) for k in ("command", "commit", "source_hash")):
            problems.append(f"{path}: no provenance (command, commit, source_hash); regenerate it with its script")
            continue
        if not any(k in prov for k in SOLVER_KEYS):
            continue  # not computed with the solver (a training run)
        recorded = prov.get("solver_fingerprint")
        if not isinstance(recorded, dict) or not recorded:
            problems.append(f"{path}: stale — computed with the solver at commit {str(prov['commit'])[:10]} but "
                            f"records no solver_fingerprint; regenerate: {prov['command']}")
            continue
        if prov.get("fingerprint_version") != fp.FINGERPRINT_VERSION:
            problems.append(f"{path}: stale — its solver_fingerprint is of version {prov.get('fingerprint_version')}, "
                            f"the current cases are version {fp.FINGERPRINT_VERSION}; regenerate: {prov['command']}")
            continue
        if current is None:
            if foreign:  # checked only when a fingerprint is needed
                return problems + [f"the solver fingerprint would come from {fp.__file__}, not from this checkout "
                                   f"({committed.ROOT}): run from the checkout's root or put it first on PYTHONPATH"]
            current = fp.solver_fingerprint()
        moved = fp.compare_fingerprints(recorded, current)
        if moved:
            shown = "; ".join(moved[:4]) + (f"; and {len(moved) - 4} more" if len(moved) > 4 else "")
            problems.append(
                f"{path}: stale — the solver's numbers moved since commit {str(prov['commit'])[:10]} "
                f"({len(moved)} of {len(current)} fingerprint entries beyond rtol {fp.RTOL:g}: {shown}); "
                f"regenerate: {prov['command']}")
    return problems
