"""Small, safe file I/O for results: atomic writes, reads that say what went wrong, and the
provenance every committed result carries (command, commit, source hashes, and for a result
computed with the solver the solver's numerical fingerprint, :mod:`jaxbsd.fingerprint`)."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import tempfile
from typing import Any, Iterable

__all__ = ["write_json_atomic", "write_bytes_atomic", "fsync_dir", "read_json", "provenance", "source_hash", "SOLVER_FILES"]

PACKAGE = pathlib.Path(__file__).resolve().parent

#: The solver's source files. Their hash (``solver_hash``) is recorded as information only:
#: staleness is judged by the solver's numerical fingerprint (:mod:`jaxbsd.fingerprint`), so a
#: comment or a refactoring that leaves the numbers alone stales nothing.
SOLVER_FILES = ("cmtf.py", "bases.py", "bspline.py", "tensor.py")


def source_hash(files: Iterable[str] | None = None) -> str:
    """SHA-256 over the named files of the ``jaxbsd`` package (paths relative to it), or over
    every ``*.py`` file of the package when ``files`` is None; names and contents both count."""
    paths = sorted(PACKAGE.rglob("*.py")) if files is None else [PACKAGE / f for f in sorted(files)]
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


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
        (:func:`jaxbsd.fingerprint.solver_fingerprint`, a few seconds on first use in a
        process) and ``fingerprint_version`` are recorded: ``experiments/report.py --check``
        calls the result stale when the current solver's fingerprint has moved beyond
        :data:`jaxbsd.fingerprint.RTOL`. ``solver_files`` and ``solver_hash`` (the hash of
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
        from jaxbsd.fingerprint import FINGERPRINT_VERSION, solver_fingerprint

        record["solver_files"] = list(SOLVER_FILES)
        record["solver_hash"] = source_hash(SOLVER_FILES)
        record["fingerprint_version"] = FINGERPRINT_VERSION
        record["solver_fingerprint"] = solver_fingerprint()
    return record


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a directory's entries (a rename is durable only once its directory is synced)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory handles
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> pathlib.Path:
    """Write ``data`` to a temporary file beside ``path``, then rename it into place.

    The one atomic writer of the package (results, checkpoints, data caches). A crash at any
    point leaves the previous file (or none), never a truncated one; the file gets the usual
    mode (``0666`` less the umask, not ``mkstemp``'s private ``0600``), its bytes are flushed
    to disk before the rename and the directory entry after it.
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def write_json_atomic(path: str | os.PathLike, payload: Any) -> pathlib.Path:
    """Atomically write ``payload`` as indented JSON."""
    return write_bytes_atomic(path, json.dumps(payload, indent=1).encode())


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
