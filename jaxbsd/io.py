"""Small, safe file I/O for results: atomic writes, reads that say what went wrong, and the
provenance every committed result carries (command, commit, source hashes, and for a result
computed with the solver the solver's numerical fingerprint, :mod:`jaxbsd.solver.fingerprint`).

The atomic writers and the source hash are defined in ``jaxbsd._files``, which imports
nothing of jaxbsd, and re-exported here: the fingerprint uses them too, and this module uses the
fingerprint, so the imports run one way (io → fingerprint → _files)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
from typing import Iterable

from jaxbsd._files import PACKAGE, fsync_dir, source_hash, write_bytes_atomic, write_json_atomic

__all__ = ["write_json_atomic", "write_bytes_atomic", "fsync_dir", "read_json", "provenance", "source_hash", "SOLVER_FILES"]

#: The solver's source files. Their hash (``solver_hash``) is recorded as information only:
#: staleness is judged by the solver's numerical fingerprint (:mod:`jaxbsd.solver.fingerprint`), so a
#: comment or a refactoring that leaves the numbers alone stales nothing.
SOLVER_FILES = ("solver/cmtf.py", "solver/linalg.py", "solver/bases.py", "solver/bspline.py", "solver/jacobians.py")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=PACKAGE, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def provenance(command: str, *, solver: bool = True) -> dict:
    """What produced a result: the command, the git commit, whether the package's sources had
    uncommitted changes, hashes of the package sources and, for a solver result, the solver's
    numerical fingerprint.

    Args:
      command: the command line that reproduces the result.
      solver: whether the result was computed with the solver. Then ``solver_fingerprint``
        (:func:`jaxbsd.solver.fingerprint.solver_fingerprint`, a few seconds on first use in a
        process) and ``fingerprint_version`` are recorded: ``experiments/report.py --check``
        calls the result stale when the current solver's fingerprint has moved beyond
        :data:`jaxbsd.solver.fingerprint.RTOL`. ``solver_files`` and ``solver_hash`` (the hash of
        :data:`SOLVER_FILES`) are recorded as information, like ``commit`` and ``source_hash``.
    """
    dirty = _git("status", "--porcelain", "--", ".")
    record = {
        "command": command,
        "commit": _git("rev-parse", "HEAD"),
        "sources_dirty": None if dirty is None else bool(dirty),
        "source_hash": source_hash(),
    }
    if solver:
        from jaxbsd.solver.fingerprint import FINGERPRINT_VERSION, solver_fingerprint

        record["solver_files"] = list(SOLVER_FILES)
        record["solver_hash"] = source_hash(SOLVER_FILES)
        record["fingerprint_version"] = FINGERPRINT_VERSION
        record["solver_fingerprint"] = solver_fingerprint()
    return record


def read_json(path: str | os.PathLike, required: Iterable[str] = ()) -> dict:
    """Read a JSON object, checking that it has the ``required`` top-level keys.

    Raises:
      FileNotFoundError: no file at ``path``.
      ValueError: the file is not JSON, not an object, or lacks a required key — the message
        names the path and what was expected.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such results file")
    try:
        payload = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: expected a JSON results file, could not parse it ({e})") from None
    required = list(required)
    if not isinstance(payload, dict):
        raise ValueError(f"{path}: expected a JSON object with keys {required}, got {type(payload).__name__}")
    missing = [k for k in required if k not in payload]
    if missing:
        raise ValueError(f"{path}: expected keys {required}, missing {missing}")
    return payload
