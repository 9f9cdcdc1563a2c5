"""Small, safe file I/O for results: atomic writes, reads that say what went wrong."""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
from typing import Any, Iterable

__all__ = ["write_json_atomic", "write_bytes_atomic", "read_json"]


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> pathlib.Path:
    """Write ``data`` to a temporary file beside ``path``, then rename it into place.

    A crash mid-write leaves the previous file (or none), never a truncated one.
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
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
