"""JAX's persistent compilation cache, kept under ``$JAXBSD_CACHE/xla``.

A compiled XLA program is written to disk and read back by any later process that compiles the
same program (same computation, shapes, devices, flags and jax/jaxlib version), so a rerun of a
command skips XLA's compile. Tracing the Python function and lowering it to StableHLO still run in
every process: the cache key is computed from the lowered program.

The ``jaxbsd`` command turns it on (``--no-cache`` or ``JAXBSD_COMPILATION_CACHE=0`` turn it off);
from Python it is opt-in::

    import jaxbsd as jb
    jb.enable_compilation_cache()          # $JAXBSD_CACHE/xla, default ~/.cache/jaxbsd/xla

JAX treats the cache as trusted: a program read from it runs as it is. Keep it in a directory only
you can write to.
"""

from __future__ import annotations

import os
import pathlib

from jaxbsd.data.paths import cache_dir

__all__ = ["CACHE_ENV", "DISABLE_ENV", "compilation_cache_dir", "default_compilation_cache_dir",
           "enable_compilation_cache", "enabled_by_environment"]

#: The environment variable naming jaxbsd's cache directory (the compilation cache is its ``xla``).
CACHE_ENV = "JAXBSD_CACHE"
#: The environment variable that turns the ``jaxbsd`` command's compilation cache off (``0``).
DISABLE_ENV = "JAXBSD_COMPILATION_CACHE"

_OFF = frozenset({"0", "false", "no", "off"})


def default_compilation_cache_dir() -> pathlib.Path:
    """``$JAXBSD_CACHE/xla`` (default ``~/.cache/jaxbsd/xla``); it may not exist yet."""
    return cache_dir() / "xla"


def compilation_cache_dir() -> pathlib.Path | None:
    """The directory JAX's persistent compilation cache is set to now, or None when it is off."""
    import jax

    path = jax.config.jax_compilation_cache_dir
    return pathlib.Path(path) if path and jax.config.jax_enable_compilation_cache else None


def enabled_by_environment() -> bool:
    """False when ``$JAXBSD_COMPILATION_CACHE`` says off (``0``, ``false``, ``no``, ``off``), else True."""
    return os.environ.get(DISABLE_ENV, "").strip().lower() not in _OFF


def enable_compilation_cache(path: str | os.PathLike | None = None) -> pathlib.Path:
    """Turn on JAX's persistent compilation cache in ``path``; return the directory.

    Every program compiled from then on in this process is written there, however short its
    compile (``jax_persistent_cache_min_compile_time_secs`` 0, no minimum entry size), and read
    back instead of compiled by any later process that compiles the same program. Calling it again
    with the same directory changes nothing; another directory replaces the first (programs
    already compiled in this process stay in memory either way).

    Args:
      path: the cache directory, created if absent. Default: ``$JAXBSD_CACHE/xla``
        (:func:`default_compilation_cache_dir`).

    Returns:
      The cache directory, absolute.

    Raises:
      ValueError: ``path`` exists and is not a directory (naming it).
      OSError: the directory cannot be created.
    """
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    directory = pathlib.Path(path).expanduser() if path is not None else default_compilation_cache_dir()
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"path {str(directory)!r}: exists and is not a directory (the compilation cache's)")
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    current = compilation_cache_dir()
    if current is not None and current.resolve() == directory and _settings_hold():
        return directory
    # JAX opens its cache once per process, at the first compile that looks for it; a new
    # directory is only read after that handle is dropped.
    compilation_cache.reset_cache()
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    # Cache every program: the compression runs many small ones, each under jax's 1 s default.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    return directory


def _settings_hold() -> bool:
    import jax

    return (jax.config.jax_persistent_cache_min_compile_time_secs == 0
            and jax.config.jax_persistent_cache_min_entry_size_bytes < 0)
