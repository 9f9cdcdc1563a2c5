"""Progress of ``jb.compress_model`` (``jb.Execution(progress=...)``): what it reports, not when.

Oracles: the report returned at the end (the events must describe the same MLPs, ranks and
parameter counts), and the run without progress (the numbers must be the same, bit for bit).
"""

from __future__ import annotations

import sys

import jax
import numpy as np
import pytest
from flax import nnx
from test_compress_model import PATHS, SPEC, Net, calibration

import jaxbsd as jb
from jaxbsd.compression import progress
from jaxbsd.compression.progress import MLPProgress

REFINE = jb.Refine(steps=6, batch_size=16)


def _compress(execution):
    return jb.compress_model(Net(), calibration(), mlps=PATHS, reduction=0.3, method="prune", mlp_specs=SPEC,
                             refine=REFINE, execution=execution, key=jax.random.key(0))


def test_a_callback_gets_a_start_before_each_mlp_and_one_event_as_each_finishes():
    events: list[MLPProgress] = []
    _, report = _compress(jb.Execution(progress=events.append))
    assert [e.kind for e in events] == ["start", "done", "start", "done"]
    done = [e for e in events if e.kind == "done"]
    assert [e.paths for e in done] == [(r.path,) for r in report.mlps] == [(PATHS[1],), (PATHS[0],)]  # back to front
    by_path = {r.path: r for r in report.mlps}
    for e in done:
        r = by_path[e.paths[0]]
        assert (e.ranks, e.params_before, e.params_after) == ((r.rank,), r.params_before, r.params_after)
        assert e.output_error == pytest.approx(r.output_error) and e.seconds >= 0
        assert e.total == 2
    assert [e.position for e in events] == [1, 1, 2, 2]


def test_progress_true_prints_a_line_as_each_mlp_starts_and_finishes(capsys):
    _compress(jb.Execution(progress=True))
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 4, lines
    assert lines[0].startswith(f"[1/2] {PATHS[1]}: prune at rank") and lines[0].endswith("...")
    assert lines[1].startswith(f"[1/2] {PATHS[1]}: prune rank") and "output error" in lines[1]
    assert lines[2].startswith(f"[2/2] {PATHS[0]}:") and lines[3].startswith(f"[2/2] {PATHS[0]}: prune rank")


def test_bars_on_a_terminal_change_no_number(capsys, monkeypatch):
    quiet, _ = _compress(None)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    loud, _ = _compress(jb.Execution(progress=True))
    err = capsys.readouterr().err
    assert "refinement steps" in err  # the bar of the refinement's compiled loop
    assert f"{REFINE.steps}/{REFINE.steps}" in err  # advanced by the loop's reports to its last step
    for (path, a), (_, b) in zip(nnx.to_flat_state(nnx.state(quiet, nnx.Param)),
                                 nnx.to_flat_state(nnx.state(loud, nnx.Param))):
        np.testing.assert_array_equal(np.asarray(a[...]), np.asarray(b[...]), err_msg=str(path))


def test_a_bad_progress_option_is_refused():
    with pytest.raises(ValueError, match="progress"):
        jb.Execution(progress="yes")
    assert not progress.bars_wanted()


def test_a_group_and_a_resumed_run_each_get_one_line():
    group = MLPProgress(kind="start", position=1, total=6, paths=("a.mlp", "b.mlp", "c.mlp"), method="bsd",
                        ranks=(300, 300, 300), params_before=3 * 1000)
    assert progress.format_event(group) == "[1-3/6] 3 MLPs as one program (a.mlp …): bsd at rank 300 (3,000 parameters) ..."
    resumed = MLPProgress(kind="resumed", position=4, total=6, paths=(), method="bsd")
    assert progress.format_event(resumed) == "resumed: 3 of 6 MLPs were done by an earlier run"
