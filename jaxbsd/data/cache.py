"""The on-disk cache of decoded image arrays: ``.npz`` files in ``jaxbsd.data.paths.cache_dir()``.

A cache file is named by its source's path, size and mtime (:func:`cache_path`), so a changed
source gets a new file; an unreadable or malformed one is ignored with a warning and rebuilt, and
one that cannot be written only costs the next load a decode.
"""

from __future__ import annotations

import hashlib
import io
import pathlib
import warnings
import zipfile

import numpy as np

from jaxbsd.data.paths import cache_dir
from jaxbsd.io import write_bytes_atomic

__all__ = ["cache_path", "read_cache", "write_cache"]

# Bump when the cached arrays' layout changes, so that old cache files are not picked up.
_CACHE_VERSION = 1


def cache_path(source: pathlib.Path) -> pathlib.Path:
    """Cache file for ``source``: a new name whenever its path, size or mtime changes."""
    stat = source.stat()
    key = f"{_CACHE_VERSION}\0{source.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return cache_dir() / f"{source.stem}-{digest}.npz"


def read_cache(path: pathlib.Path) -> dict[str, np.ndarray] | None:
    """The cached image-folder arrays, or None when absent, unreadable or malformed."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as cached:
            arrays = {key: cached[key] for key in ("train_x", "train_y", "test_x", "test_y")}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        warnings.warn(
            f"{path}: ignoring unreadable cache file ({err}); rebuilding it", stacklevel=3
        )
        return None
    for split in ("train", "test"):
        x, y = arrays[f"{split}_x"], arrays[f"{split}_y"]
        if (
            x.dtype != np.uint8
            or x.shape[1:] != (32, 32, 3)
            or y.dtype != np.int32
            or y.shape != x.shape[:1]
        ):
            warnings.warn(f"{path}: ignoring malformed cache file; rebuilding it", stacklevel=3)
            return None
    return arrays


def write_cache(path: pathlib.Path, arrays: dict[str, np.ndarray]) -> None:
    """Write atomically (:func:`jaxbsd.io.write_bytes_atomic`) so readers never see half a file."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # uncompressed: loading is then a plain read
    try:
        write_bytes_atomic(path, buffer.getvalue())
    except OSError as err:  # a read-only or full cache directory must not stop the load
        warnings.warn(f"{path}: cannot write cache ({err}); continuing without it", stacklevel=3)
