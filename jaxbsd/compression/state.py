"""Resume: a run's state directory, saved after each finished MLP and read back on a rerun.

``state_dir/model`` is a checkpoint (Orbax, atomic: :func:`jaxbsd.checkpoint.save_checkpoint`)
of the whole model after the last finished MLP, with the replaced modules recorded so that a
freshly built original model takes them back (:func:`jaxbsd.checkpoint.load_compressed`), and
the run's records in its metadata — model and records are written by one save, so they can never
disagree. ``state_dir/steps.json`` is a readable copy. A run is identified by a hash of its
configuration (``run_id``): a state of another run is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
from typing import Any

from jaxbsd.checkpoint import load_compressed, read_checkpoint_header, save_checkpoint
from jaxbsd.io import write_json_atomic

__all__ = ["RunState", "run_id", "CHECKPOINT"]

#: The state checkpoint in ``state_dir`` (model and records after the last finished step).
CHECKPOINT = "model"


def run_id(identity: Any) -> str:
    """A short hash of a run's JSON identity (configuration, model size, calibration digest…)."""
    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class RunState:
    """The state directory of one run.

    Args:
      directory: where the state lives (created on the first save).
      run_id: the run's identity (:func:`run_id`).
      resume: ``True`` (default): a state of this run is resumed, one of another run refused;
        ``False``: any state there is discarded and the run starts over.
    """

    def __init__(self, directory: str | os.PathLike, run_id: str, *, resume: bool = True):
        self.directory = pathlib.Path(directory)
        self.run_id = run_id
        self.resume = resume

    @property
    def checkpoint(self) -> pathlib.Path:
        return self.directory / CHECKPOINT

    def records(self) -> list[dict]:
        """The finished steps' records, read from the checkpoint's header only (no weights).

        Raises:
          ValueError: naming ``state_dir``: a checkpoint that is not a run state, or one of
            another run (configuration, order, model or calibration differ).
        """
        if not self.resume or not self.checkpoint.exists():
            return []
        meta = read_checkpoint_header(self.checkpoint).get("metadata", {})
        if not isinstance(meta, dict) or "steps" not in meta or "run_id" not in meta:
            raise ValueError(f"state_dir: {self.checkpoint} is not the state of a jaxbsd compression run")
        if meta["run_id"] != self.run_id:
            raise ValueError(
                f"state_dir: {self.checkpoint} belongs to a different run (configuration, order, model or "
                "calibration differ); use another state_dir, delete it, or pass resume=False to start over")
        return list(meta["steps"])

    def load(self, model) -> list[dict]:
        """The finished steps' records, with ``model`` (the original, as built) brought to the state
        after the last of them, in place. None finished: ``[]`` and the model untouched."""
        records = self.records()
        if records:
            load_compressed(self.checkpoint, model)
        elif not self.resume and self.directory.exists():
            shutil.rmtree(self.checkpoint, ignore_errors=True)
        return records

    def save(self, model, records: list[dict]) -> None:
        """Save ``model`` and ``records`` as the state after the last of them (atomically)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        payload = {"run_id": self.run_id, "steps": records}
        save_checkpoint(self.checkpoint, model, payload)
        write_json_atomic(self.directory / "steps.json", payload)
