"""What every study writes: the command that reproduces it, its provenance, strict JSON, and the
wall time and machine of a run.

* :func:`command_line` — ``python experiments/<script> ...`` of the running study; records its
  provenance once, when it starts (and fails unless ``jaxbsd`` is this checkout's:
  :func:`checkout.require_checkout_jaxbsd`);
* :func:`write_json` — strict JSON (NaN → null), atomic, always with a ``provenance`` entry;
  :func:`jsonable` — the conversion it applies; :func:`read_json` (:mod:`jaxbsd.io`'s);
* :func:`machine` — the accelerator and JAX version of a unit; :class:`Timer` — wall seconds.
"""

from __future__ import annotations

import math
import os
import pathlib
import shlex
import sys
import time
from typing import Any, Sequence

import jax
import numpy as np

from jaxbsd.io import provenance, read_json, write_json_atomic

from checkout import require_checkout_jaxbsd
from refinement import Setting

__all__ = ["command_line", "jsonable", "write_json", "read_json", "machine", "Timer"]

#: Provenance of the running experiment, taken when it starts (:func:`command_line`), so the
#: commit and source hashes a result records are those of the code that computed it.
_RUN_PROVENANCE: dict | None = None


def command_line(script: str, argv: Sequence[str] | None) -> str:
    """The command that reproduces this run (``python experiments/<script> ...``); also records
    the run's provenance (commit, source hashes) for :func:`write_json`."""
    global _RUN_PROVENANCE
    require_checkout_jaxbsd()
    args = list(sys.argv[1:] if argv is None else argv)
    command = " ".join(["python", f"experiments/{script}", *map(shlex.quote, map(str, args))])
    _RUN_PROVENANCE = provenance(command)
    return command


def jsonable(x: Any) -> Any:
    """``x`` with numpy/JAX scalars and arrays turned into Python numbers and lists, non-finite
    floats into ``None`` (strict JSON has no NaN), and a method :class:`refinement.Setting` into
    its name."""
    if isinstance(x, Setting):
        return x.name
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (np.ndarray, jax.Array)):
        return jsonable(np.asarray(x).tolist())
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        x = float(x)
        return x if math.isfinite(x) else None
    if isinstance(x, pathlib.Path):
        return str(x)
    return x


def write_json(path: str | os.PathLike, payload: dict) -> pathlib.Path:
    """Write ``payload`` as strict JSON (NaN → null), atomically (:mod:`jaxbsd.io`), with a
    ``provenance`` entry (command, commit, source hashes: see :func:`jaxbsd.io.provenance`)
    taken when the run started, so no result can be written without one."""
    payload = dict(payload)
    payload.setdefault("provenance", _RUN_PROVENANCE or provenance(str(payload.get("command", "unknown"))))
    return write_json_atomic(path, jsonable(payload))


def machine() -> str:
    """The accelerator a unit ran on and the JAX version, e.g. ``"NVIDIA H200 (gpu), jax 0.11.2"``:
    a study that resumes across machines records, per unit, which figures came from where."""
    return f"{jax.devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}"


class Timer:
    """Wall-clock seconds since construction (``Timer()()``)."""

    def __init__(self):
        self.start = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.start
