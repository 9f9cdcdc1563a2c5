"""Peak memory of one block: a run one MLP at a time holds one step's tokens, not every MLP's.

Oracle: ``jax.live_arrays()`` (every buffer JAX holds alive), counted at the start of each step by
the number of calibration-token rows: the planning capture records every MLP's inputs and outputs,
and each planning site gathers its check and held-out tokens; a run that kept them all would hold
several such arrays per MLP until the end.
"""

from __future__ import annotations

import gc
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxbsd as jb
from jaxbsd.compression import engine
from jaxbsd.compression.api import BatchCalibration
from jaxbsd.compression.engine import Plan
from jaxbsd.compression.surgery import unfed_by
from residual_stack import ResidualStack

BLOCKS, WINDOWS, T, WIDTH = 4, 8, 37, 8
N = WINDOWS * T  # 296 calibration tokens: above the 256 sampling points, so those are not counted


def _stack(rngs):
    return ResidualStack(BLOCKS, WIDTH, 16, rngs)


def _token_arrays(rows: set[int]) -> int:
    gc.collect()
    return sum(1 for a in jax.live_arrays() if a.ndim == 2 and a.shape[0] in rows)


def _compress(refine, rows: set[int], allocation: str = "uniform") -> tuple[list[int], int]:
    """The token arrays alive at the start of each step, and after the run."""
    x = jax.random.normal(jax.random.key(1), (WINDOWS, T, WIDTH), jnp.float64)
    at_start = []

    def progress(event):
        if event.kind == "start":
            at_start.append(_token_arrays(rows))

    model, _ = jb.compress_model(_stack(nnx.Rngs(0)), x, key=jax.random.key(0), mlps=None, method="prune",
                                 reduction=0.3, refine=refine, allocation=allocation,
                                 execution=jb.Execution(progress=progress))
    del model, x
    return at_start, _token_arrays(rows)


def test_a_run_without_refinement_holds_only_the_first_steps_planning_site():
    # No tokens are reserved: a site's check tokens are all N. Step 1 reuses its planning site (its
    # check inputs and outputs: 2 arrays); every later step captures its own, after the last was let go.
    at_start, after = _compress(None, {N})
    assert len(at_start) == BLOCKS
    assert at_start[0] <= 2 and at_start[1:] == [0] * (BLOCKS - 1), at_start
    assert after == 0


def test_a_refined_run_holds_the_consistent_targets_of_the_steps_to_come_and_nothing_else():
    refine = jb.Refine(steps=5)
    R = Plan.reserved_tokens(refine, N)
    at_start, after = _compress(refine, {N, N - R, R})
    # Step k: the original model's outputs of the MLPs not yet compressed (the "consistent" target,
    # one array each), and at step 1 its planning site's check and held-out inputs and outputs.
    assert at_start[0] <= BLOCKS + 4, at_start
    assert at_start[1:] == [BLOCKS - k for k in range(1, BLOCKS)], at_start
    assert after == 0


def test_a_greedy_run_lets_the_planning_sites_go_once_the_ranks_are_chosen():
    # The greedy allocation builds its candidates on the planning tokens. Once the ranks are chosen,
    # each step still to come keeps only its build at its chosen rank (which it reuses: 2 token
    # arrays), not its planning site's arrays; each goes as its step is done.
    at_start, after = _compress(None, {N}, allocation="greedy")
    assert at_start == [2 * (BLOCKS - k) for k in range(BLOCKS)], at_start
    assert after == 0


@pytest.mark.parametrize("target", ["local", "consistent"])
def test_the_batch_source_keeps_planning_outputs_only_for_the_consistent_target(target):
    x = jax.random.normal(jax.random.key(1), (2, 5, WIDTH), jnp.float64)
    model = _stack(nnx.Rngs(0))
    paths = [f"blocks.{i}.mlp" for i in range(BLOCKS)]
    source = BatchCalibration(x, paths, jax.random.key(0), None, keep_outputs=target == "consistent")
    tokens, _ = source.capture(model, paths, engine.PLAN)
    assert len(source._outputs) == (BLOCKS if target == "consistent" else 0)
    Y = source.reference(model, paths[0], 1)  # handed over (or captured again): the same values either way
    assert bool(jnp.array_equal(Y, tokens[paths[0]][1]))
    assert paths[0] not in source._outputs


def test_release_host_memory_runs_where_the_c_library_has_no_malloc_trim(monkeypatch):
    engine.release_host_memory()
    monkeypatch.setattr(engine, "_TRIM", None)
    engine.release_host_memory()  # a gc.collect() alone


# --------------------------------------------------------------------------- one forward pass back to front


def _counted_run(monkeypatch, *, order="back-to-front", finetune=None, recapture=False):
    """The compressed model's leaves and the number of captures, with (``recapture``) every step
    made to capture its own tokens, as the engine did before planning tokens were set aside."""
    calls = []
    original = BatchCalibration.capture

    def capture(self, model, paths, stage):
        calls.append(stage)
        return original(self, model, paths, stage)

    monkeypatch.setattr(BatchCalibration, "capture", capture)
    if recapture:
        monkeypatch.setattr(engine, "unfed_by", lambda *a: False)
    x = jax.random.normal(jax.random.key(1), (WINDOWS, T, WIDTH), jnp.float64)
    model, report = jb.compress_model(_stack(nnx.Rngs(0)), x, key=jax.random.key(0), mlps=None, method="prune",
                                      reduction=0.3, refine=jb.Refine(steps=5),
                                      execution=jb.Execution(order=order, finetune=finetune))
    monkeypatch.undo()
    return jax.tree_util.tree_leaves(nnx.state(model)), calls, report


def test_back_to_front_captures_once_and_gives_what_a_capture_a_step_gives(monkeypatch):
    """Back to front no replacement feeds the MLPs still to come: the planning capture is the only
    one (a capture a step before), and the model is the one a capture a step gives."""
    leaves, calls, report = _counted_run(monkeypatch)
    again, recaptured, _ = _counted_run(monkeypatch, recapture=True)
    assert calls == [engine.PLAN] and len(recaptured) == BLOCKS  # planning, then steps 2..BLOCKS
    assert len(report.mlps) == BLOCKS
    for a, b in zip(leaves, again):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-14)  # bit-equal here


@pytest.mark.parametrize("case", ["front-to-back", "finetune"])
def test_a_step_fed_by_a_replacement_captures_its_own_tokens(monkeypatch, case):
    """Front to back every replacement feeds the MLPs after it, and fine-tuning changes every one:
    each step after the first captures again."""
    kwargs = {"order": "front-to-back"} if case == "front-to-back" else {"finetune": lambda model: None}
    _, calls, _ = _counted_run(monkeypatch, **kwargs)
    assert len(calls) == BLOCKS and calls[0] == engine.PLAN and engine.PLAN not in calls[1:], calls


@pytest.mark.parametrize("sequence, path, replaced, expected", [
    (["a", "b", "c"], "a", ["c", "b"], True),      # back to front
    (["a", "b", "c"], "b", ["a"], False),          # front to back: a feeds b
    (["a", "b", "a"], "b", ["a"], False),          # a module called again after b
    (["a", "b", "c", "b"], "a", ["b"], True),
    (["a", "b", "c", "b"], "b", ["c"], False),     # c runs between b's calls
    (["a", "b"], "x", [], False),                  # never called
    (["a", "b"], "a", ["x"], False),               # a replacement never seen
])
def test_unfed_by_reads_the_call_sequence(sequence, path, replaced, expected):
    assert unfed_by(sequence, path, replaced) is expected


def test_spilled_tokens_come_back_as_they_went_and_leave_no_file():
    store = engine.SpilledTokens()
    X, Y = np.arange(12.0).reshape(4, 3), np.arange(8, dtype=np.float32).reshape(4, 2)
    store.put("mlp", (jnp.asarray(X), jnp.asarray(Y)))
    folder = store._dir.name
    assert "mlp" in store and os.listdir(folder)
    back = store.take("mlp")
    assert "mlp" not in store and not os.listdir(folder)
    np.testing.assert_array_equal(np.asarray(back[0]), X)
    assert back[1].dtype == jnp.float32
    store.close()
    assert not os.path.exists(folder)


def test_with_mlps_found_by_discovery_the_run_makes_one_forward_pass(monkeypatch):
    """``mlps=None``: the discovery's recording forward pass is the planning capture, and back to front
    no step captures again: one forward pass for the whole run, the same model as with ``mlps`` given."""
    from jaxbsd.compression import surgery

    passes = []
    original = surgery._recording_forward
    monkeypatch.setattr(surgery, "_recording_forward", lambda *a: (passes.append(1), original(*a))[1])
    x = jax.random.normal(jax.random.key(1), (WINDOWS, T, WIDTH), jnp.float64)
    found, report = jb.compress_model(_stack(nnx.Rngs(0)), x, key=jax.random.key(0), mlps=None, method="prune",
                                      reduction=0.3, refine=jb.Refine(steps=5))
    assert len(passes) == 1 and len(report.mlps) == BLOCKS
    monkeypatch.undo()
    paths = [p for p, why in report.discovered.items() if why.startswith("chosen")]  # model order: the keys' order
    given, _ = jb.compress_model(_stack(nnx.Rngs(0)), x, key=jax.random.key(0), mlps=paths,
                                 method="prune", reduction=0.3, refine=jb.Refine(steps=5))
    for a, b in zip(jax.tree_util.tree_leaves(nnx.state(found)), jax.tree_util.tree_leaves(nnx.state(given))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-14)  # bit-equal here
