"""Where the data lives: the data directory ``$JAXBSD_DATA`` and the cache directory ``$JAXBSD_CACHE``.

Nothing is downloaded and no location is guessed from where the package is installed: every
data set is read from a local copy under :func:`data_dir` (or a path passed as ``root``), and
what is derived from it (decoded arrays, extracted models) is kept under :func:`cache_dir`.
"""

from __future__ import annotations

import os
import pathlib

__all__ = ["DATA_ENV", "cache_dir", "data_dir"]

#: The environment variable naming the data directory.
DATA_ENV = "JAXBSD_DATA"


def data_dir() -> pathlib.Path | None:
    """The data directory named by ``$JAXBSD_DATA``, or None when the variable is unset or empty."""
    env = os.environ.get(DATA_ENV)
    return pathlib.Path(env).expanduser() if env else None


def cache_dir() -> pathlib.Path:
    """The cache directory: ``$JAXBSD_CACHE``, default ``~/.cache/jaxbsd`` (it may not exist yet)."""
    env = os.environ.get("JAXBSD_CACHE")
    return pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "jaxbsd"
