"""Where a study runs: the checkout's folders, its ``jaxbsd``, and the persistent compile cache.

* :data:`ROOT` (the checkout), :data:`RESULTS` (``experiments/results``), :data:`CHECKPOINTS`
  (``checkpoints``), :data:`TRAINING_JSON` (the recorded training runs);
* :func:`rel_path` — a path as the results record it (relative to :data:`ROOT` where it lies inside);
* :func:`require_checkout_jaxbsd` — fails unless the imported ``jaxbsd`` is this checkout's, so the
  provenance a result records (:func:`output.command_line`) hashes the code that computed it;
* :func:`enable_compilation_cache` — compiled XLA programs persisted on disk.

Standard library and JAX only; imports nothing of ``experiments/``. The studies run as
``python experiments/<study>.py`` (``experiments/`` is then first on ``sys.path``, and the
checkout's ``jaxbsd`` comes from its editable install or from ``PYTHONPATH``).
"""

from __future__ import annotations

import os
import pathlib

import jax

__all__ = ["ROOT", "RESULTS", "CHECKPOINTS", "TRAINING_JSON", "rel_path", "require_checkout_jaxbsd",
           "enable_compilation_cache"]

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
CHECKPOINTS = ROOT / "checkpoints"
TRAINING_JSON = RESULTS / "training.json"


def rel_path(path: pathlib.Path) -> str:
    """``path`` relative to :data:`ROOT` when it lies inside the checkout, else as given."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def require_checkout_jaxbsd() -> None:
    """Raise ``SystemExit`` unless the imported ``jaxbsd`` is the one of this checkout (:data:`ROOT`):
    an editable install of another tree would compute, and hash into the provenance, other code.
    Run from the checkout with ``PYTHONPATH=.`` (or ``pip install -e .`` there) to fix it."""
    import jaxbsd

    where = pathlib.Path(jaxbsd.__file__).resolve()
    if not where.is_relative_to(ROOT):
        raise SystemExit(f"jaxbsd is imported from {where.parent}, not from this checkout ({ROOT}): "
                         f"run with PYTHONPATH={ROOT} (or pip install -e {ROOT})")


def enable_compilation_cache(path: str | os.PathLike | None = None) -> pathlib.Path:
    """Persist compiled XLA programs on disk, so reruns and other data sets skip compilation.

    The ablation compiles one solver program per (rank, basis, variant): ~200 programs of
    ~5–10 s each on two cores. Default location: ``$JAXBSD_CACHE/xla`` (``~/.cache/jaxbsd/xla``).
    """
    if path is None:
        base = os.environ.get("JAXBSD_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "jaxbsd")
        path = os.path.join(base, "xla")
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path

