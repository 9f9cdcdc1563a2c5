"""Resumable units of work, the machinery the studies share.

A study is a list of units (one per method, ρ, seed...). A unit has a hashed identity: its
*tag* (a JSON string of everything that determines its result: configuration, block order,
protocol) and a state folder named after it, usually under ``<out>/state/<study>/protocol-<key>/``
with ``key = protocol_key(protocol)``. A finished unit is ``unit.json`` = ``{"tag", "record"}``
(:func:`save_unit`, atomic) and is never recomputed under the same tag (:func:`resume_unit`); one
saved under another tag starts over. An unfinished ``jaxbsd.compress(state_dir=...)`` run resumes
after its last finished step (:func:`finished_steps`, :func:`resumed_seconds`).

:data:`KNOB_TAGS` / :func:`knob_suffix` name a distillation ablation's units and result file by
the knobs that differ from the study's headline plan.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
from typing import Any, Callable, Sequence

from jaxbsd.io import read_json, write_json_atomic

from checkout import rel_path
from output import jsonable

__all__ = ["protocol_key", "finished_steps", "resumed_seconds", "unit_done", "resume_unit", "save_unit",
           "save_infeasible", "KNOB_TAGS", "knob_suffix"]


def protocol_key(protocol: dict, digits: int = 10) -> str:
    """The first ``digits`` hex digits of the SHA-256 of ``protocol`` as sorted-key JSON: the name of
    a study's state folder ``protocol-<key>`` (the model, data and block order it fixes)."""
    return hashlib.sha256(json.dumps(protocol, sort_keys=True).encode()).hexdigest()[:digits]


def finished_steps(state_dir: str | os.PathLike) -> int:
    """How many steps a ``jaxbsd.compress(state_dir=...)`` run has already finished (0 if none)."""
    path = pathlib.Path(state_dir) / "steps.json"
    try:
        return len(read_json(path).get("steps", []))
    except (OSError, ValueError):
        return 0


def resumed_seconds(state_dir: str | os.PathLike) -> float:
    """The wall seconds that the steps a ``jaxbsd.compress(state_dir=...)`` run already finished took
    when they ran (each step's own and its after-step seconds, from ``steps.json``; 0 if none): what a
    resumed unit adds to the seconds of the process that finishes it, so that its time is the whole
    compression's, not the last stretch's."""
    path = pathlib.Path(state_dir) / "steps.json"
    try:
        steps = read_json(path).get("steps", [])
    except (OSError, ValueError):
        return 0.0
    return float(sum(s.get("seconds", 0.0) + (s.get("seconds_finetune") or 0.0) for s in steps))


#: How a distillation knob that differs from a study's headline plan tags its units and result file
#: (``learning_rate=3e-4`` -> ``lr3``); the studies name which of these knobs they have, in order.
KNOB_TAGS: dict[str, Callable[[Any], str]] = {
    "images": lambda v: f"n{v}", "distill_windows": lambda v: f"n{v}", "steps": lambda v: f"s{v}",
    "learning_rate": lambda v: f"lr{round(v / 1e-4)}", "trainable": lambda v: v.replace("replaced+norms", "norms"),
    "schedule": str, "warmup": lambda v: f"w{v}", "variants": lambda v: "-".join(v), "lengths": str}


def knob_suffix(plan: dict, base: dict, knobs: Sequence[str], sep: str, skip: Sequence[str] = ()) -> str:
    """``sep``-joined tags (:data:`KNOB_TAGS`) of the ``knobs`` of ``plan`` that differ from ``base``,
    in the order of ``knobs``, but those in ``skip``; ``""`` if none. A study's ablation names its own
    result file with it, so it never overwrites the headline."""
    return "".join(sep + KNOB_TAGS[k](plan[k]) for k in knobs if k not in skip and plan[k] != base[k])


def unit_done(path: str | os.PathLike, tag: str) -> dict | None:
    """The record of a finished unit of work saved at ``path`` by :func:`save_unit` under the
    same ``tag`` (the protocol it was computed with), else None."""
    try:
        saved = read_json(path)
    except (OSError, ValueError):
        return None
    return saved.get("record") if isinstance(saved, dict) and saved.get("tag") == tag else None


def resume_unit(state_dir: pathlib.Path, tag: str, label: str, log: Callable[[str], None]) -> dict | None:
    """Where a resumable unit stands: its record if it finished before under the same ``tag``
    (``state_dir/unit.json``, logged as kept), else None, after logging the step an unfinished one
    resumes after (``compress(state_dir=...)``'s ``steps.json``), if any. A unit that finished
    under another tag (its configuration changed since) starts over: its run state is removed."""
    if (kept := unit_done(state_dir / "unit.json", tag)) is not None:
        log(f"  {label}: finished before, kept from {rel_path(state_dir / 'unit.json')}")
        return kept
    if (state_dir / "unit.json").exists():
        log(f"  {label}: finished before under another configuration; starting over")
        shutil.rmtree(state_dir)
        state_dir.mkdir()
    if done := finished_steps(state_dir):
        log(f"  {label}: resuming after step {done} from {rel_path(state_dir)}")
    return None


def save_unit(path: str | os.PathLike, tag: str, record: dict) -> None:
    """Save a finished unit's ``record`` atomically (a killed run never leaves half a file)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, jsonable({"tag": tag, "record": record}))


def save_infeasible(err: ValueError, record: dict, path: str | os.PathLike, tag: str, label: str, seconds: float,
                    log: Callable[[str], None]) -> dict:
    """The finished record of a unit whose budget cannot be met (``jb.compress_model`` /
    ``jaxbsd.compress`` refused it): ``record`` with ``status="infeasible"``, the reason and the
    seconds, saved as :func:`save_unit` does and logged. Any other ``ValueError`` is re-raised."""
    if "cannot be met" not in str(err):
        raise err
    record.update(status="infeasible", reason=str(err), seconds=seconds)
    log(f"  {label}: infeasible ({err})")
    save_unit(path, tag, record)
    return record

