"""The package's file primitives: atomic writes and source hashes (public as :mod:`jaxbsd.io`).

A leaf: it imports nothing of jaxbsd, so every module may use it — the solver fingerprint
(:mod:`jaxbsd.solver.fingerprint`, which keys its cache by :func:`source_hash` and writes it
atomically) as well as :mod:`jaxbsd.io`, which re-exports these names and adds the
provenance of results on top of the fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import tempfile
from typing import Any, Iterable

__all__ = ["write_json_atomic", "write_bytes_atomic", "fsync_dir", "source_hash", "PACKAGE"]

#: The ``jaxbsd`` package directory (what :func:`source_hash` hashes).
PACKAGE = pathlib.Path(__file__).resolve().parent


def source_hash(files: Iterable[str] | None = None) -> str:
    """SHA-256 over the named files of the ``jaxbsd`` package (paths relative to it), or over
    every ``*.py`` file of the package when ``files`` is None; names and contents both count."""
    paths = sorted(PACKAGE.rglob("*.py")) if files is None else [PACKAGE / f for f in sorted(files)]
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


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
