"""experiments/lm_compression.py (issue 23, item 4): its helpers against independent oracles,
the LM's plain-MLP option, and (slow) the --quick study end to end with a resume."""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbsd as jb

from jaxbsd.models import GatedMLP, LMConfig
from jaxbsd.models.layers import ACTIVATIONS, MLP

import lm_compression as lc  # experiments/ is on sys.path: pyproject's pytest pythonpath
from refinement import Setting

ROOT = pathlib.Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- calibration windows


@pytest.mark.parametrize("count,context,seed", [(1, 5, 0), (7, 16, 3), (50, 1, 11)])
def test_calibration_windows_are_contiguous_slices_drawn_by_the_seed(count, context, seed):
    stream = np.arange(500, dtype=np.int64)  # id i at position i: a row's start can be read back
    w = lc.calibration_windows(stream, count, context, seed)
    assert w.shape == (count, context) and w.dtype == np.int32
    starts = w[:, 0]
    # oracle: each row is stream[s : s + context] (the stream is 0..499, so the row is s, s+1, ...)
    np.testing.assert_array_equal(w, starts[:, None] + np.arange(context)[None, :])
    assert starts.min() >= 0 and starts.max() <= len(stream) - context
    np.testing.assert_array_equal(lc.calibration_windows(stream, count, context, seed), w)  # same seed, same draw
    expected = np.random.default_rng(seed).integers(0, len(stream) - context + 1, size=count)
    np.testing.assert_array_equal(starts, expected)


def test_calibration_windows_differ_across_seeds_and_reject_bad_arguments():
    stream = np.arange(10_000)
    a, b = (lc.calibration_windows(stream, 8, 32, s) for s in (0, 1))
    assert not np.array_equal(a, b)
    for kwargs, word in (({"count": 0}, "count"), ({"context": True}, "context"), ({"context": 20_000}, "ids")):
        args = {"count": 2, "context": 4, **kwargs}
        with pytest.raises(ValueError, match=word):
            lc.calibration_windows(stream, args["count"], args["context"], 0)


# --------------------------------------------------------------------------- test subset


@pytest.mark.parametrize("n,chars,segments", [(1000, 100, 4), (1003, 90, 9), (5000, 2000, 1)])
def test_test_subset_takes_evenly_spaced_pieces_covering_both_ends(n, chars, segments):
    ids = np.arange(n)
    sub, starts = lc.test_subset(ids, chars, segments)
    piece = chars // segments
    assert len(sub) == piece * segments and len(starts) == segments
    assert starts[0] == 0  # the first piece at the start, the last one ends at the end
    assert segments == 1 or starts[-1] == n - piece
    gaps = np.diff(starts)
    assert gaps.size == 0 or gaps.max() - gaps.min() <= 1  # evenly spaced (to rounding)
    np.testing.assert_array_equal(sub, np.concatenate([np.arange(s, s + piece) for s in starts]))


def test_test_subset_keeps_a_short_stream_whole_and_validates():
    ids = np.arange(50)
    sub, starts = lc.test_subset(ids, 100, 4)
    np.testing.assert_array_equal(sub, ids)
    assert starts == [0]
    with pytest.raises(ValueError, match="chars"):
        lc.test_subset(ids, 1, 1)
    with pytest.raises(ValueError, match="segments"):
        lc.test_subset(ids, 10, 6)


# --------------------------------------------------------------------------- budget


@pytest.mark.parametrize("reduction", [0.0, 0.1, 0.2, 0.35])
@pytest.mark.parametrize("P,mlps,m,dof", [(865_664, [147_456] * 4, 128, 4), (30_000, [9216, 9216], 32, 4)])
def test_bsd_rank_is_the_largest_rank_within_the_whole_model_budget(P, mlps, m, dof, reduction):
    rank = lc.bsd_rank(P, mlps, m, m, dof, reduction)

    def params(r):  # the model with every MLP replaced by a rank-r decoupling
        return P - sum(mlps) + len(mlps) * r * (m + m + dof)

    assert params(rank) <= (1 - reduction) * P < params(rank + 1)  # brute-force oracle: largest r that fits


def test_bsd_rank_rejects_an_unreachable_budget():
    with pytest.raises(ValueError, match="cannot be met"):
        lc.bsd_rank(1000, [100], 8, 8, 4, 0.5)
    with pytest.raises(ValueError, match="reduction"):
        lc.bsd_rank(1000, [100], 8, 8, 4, 1.0)


# --------------------------------------------------------------------------- records and summary


def _unit(method, seed, free, tuned, status="ok"):
    if status != "ok":
        return {"method": method, "reduction": 0.2, "seed": seed, "status": status, "seconds": 1.0}
    return {"method": method, "reduction": 0.2, "seed": seed, "status": "ok", "params": 100 + seed,
            "reduction_achieved": 0.21, "ranks": {"blocks.0.mlp": 5}, "output_errors": {"blocks.0.mlp": 0.1 * (seed + 1)},
            "num_samples": 128, "seconds": 9.0,
            "settings": {"training-free": {"test_bpc": free, "seconds": 4.0},
                         "fine-tuned": {"test_bpc": tuned, "seconds": 5.0}}}


def test_runs_of_gives_one_run_per_setting_with_the_unit_fields():
    runs = lc.runs_of(_unit("svd", 1, 3.0, 2.5))
    assert [r["setting"] for r in runs] == list(lc.SETTINGS)
    assert [r["test_bpc"] for r in runs] == [3.0, 2.5]
    assert [r["seconds"] for r in runs] == [4.0, 9.0]  # fine-tuned: compression and fine-tuning
    assert all(r["method"] == "svd" and r["seed"] == 1 and r["params"] == 101 for r in runs)
    bad = lc.runs_of(_unit("svd", 0, None, None, status="infeasible"))
    assert [r["test_bpc"] for r in bad] == [None, None] and all(r["status"] == "infeasible" for r in bad)


def test_summary_means_and_paired_verdicts_against_bsd():
    free = {"bsd": [2.50, 2.60, 2.55], "svd": [3.00, 3.12, 3.04], "prune": [2.40, 2.70, 2.58]}
    units = [_unit(m, s, v, v - 0.3) for m, vals in free.items() for s, v in enumerate(vals)]
    plan = {"budgets": (0.2,), "methods": tuple(map(Setting, ("bsd", "svd", "prune")))}
    rows, verdicts = lc.summarize([r for u in units for r in lc.runs_of(u)], plan)
    assert len(rows) == 2 * 3
    for row in rows:
        vals = np.asarray(free[row["method"]]) - (0.3 if row["setting"] == "fine-tuned" else 0.0)
        assert row["bpc_mean"] == pytest.approx(vals.mean()) and row["bpc_std"] == pytest.approx(vals.std())
        assert row["output_error_mean"] == pytest.approx(0.2) and row["seeds"] == 3
    v = verdicts["training-free 0.2"]
    # svd is worse than bsd by 0.50, 0.52, 0.49 bpc: a consistent paired difference
    assert v["svd"]["verdict"] == "holds" and v["svd"]["mean_diff"] == pytest.approx(0.47 + 1 / 30, abs=1e-9)
    assert v["prune"]["verdict"] == "within noise"  # -0.10, +0.10, +0.03
    assert "bsd" not in v
    assert next(r for r in rows if r["method"] == "svd")["verdict_vs_bsd"] == "holds"


def test_summary_marks_a_method_without_runs_infeasible():
    units = [_unit("bsd", 0, 2.5, 2.4), _unit("svd", 0, None, None, status="infeasible")]
    rows, _ = lc.summarize([r for u in units for r in lc.runs_of(u)], {"budgets": (0.2,), "methods": (Setting("bsd"), Setting("svd"))})
    assert [r["status"] for r in rows if r["method"] == "svd"] == ["infeasible", "infeasible"]


def test_fit_summary_finding_states_the_ratio_of_gated_to_plain_errors():
    fits = [{"kind": k, "rank": 8, "seed": s, "params_mlp": 10, "params_decoupled": 5, "error_J": e, "error_F": e / 2,
             "output_error": 2 * e} for k, errs in (("gated", [0.4, 0.6]), ("plain", [0.1, 0.1])) for s, e in enumerate(errs)]
    rows, finding = lc.fit_summary(fits)
    gated = next(r for r in rows if r["kind"] == "gated")
    assert gated["error_J_mean"] == pytest.approx(0.5) and gated["error_J_std"] == pytest.approx(0.1)
    assert "harder to decouple at every rank" in finding and "5x" in finding  # 0.5 / 0.1
    _, reverse = lc.fit_summary([dict(f, kind={"gated": "plain", "plain": "gated"}[f["kind"]]) for f in fits])
    assert "not uniformly harder" in reverse and "0.2x" in reverse


def test_contain_summary_pairs_the_contained_decoupling_with_pruning_per_seed():
    """The plain twin's rows: each fit method's mean error and parameters, the worst (largest) per-seed
    ratio of the contained decoupling to pruning, the sweeps kept; the gated fits and other ranks apart."""
    def fit(kind, rank, seed, e, params, method=None, sweep=None):
        f = {"kind": kind, "rank": rank, "seed": seed, "params_mlp": 100, "params_decoupled": params, "output_error": e}
        return f if method is None else {**f, "method": method, "sweep_kept": sweep}

    fits = [fit("plain", 8, 0, 0.30, 90), fit("plain", 8, 1, 0.50, 90), fit("gated", 8, 0, 9.0, 90)]
    contained = [fit("plain", 8, 0, 0.20, 80, "contain", 0), fit("plain", 8, 1, 0.33, 80, "contain", 4),
                 fit("plain", 8, 0, 0.20, 80, "prune"), fit("plain", 8, 1, 0.30, 80, "prune"),
                 fit("plain", 4, 0, 0.5, 40, "contain", 0), fit("plain", 4, 0, 0.5, 40, "prune")]
    rows = {r["rank"]: r for r in lc.contain_summary(fits, contained)}
    assert sorted(rows) == [4, 8]
    row = rows[8]
    assert row["worst_ratio"] == pytest.approx(1.1)  # seed 1: 0.33 / 0.30 (seed 0: 1.0)
    assert row["sweeps_kept"] == [0, 4] and row["params_mlp"] == 100
    assert row["contain"]["params"] == row["prune"]["params"] == 80 and row["bsd"]["params"] == 90
    assert row["bsd"]["output_error_mean"] == pytest.approx(0.40) and row["bsd"]["seeds"] == 2  # plain only
    assert row["prune"]["output_error_mean"] == pytest.approx(0.25)
    assert "bsd" not in rows[4] and rows[4]["worst_ratio"] == pytest.approx(1.0)
    plan = {"max_iter": 5}
    assert lc.fit_method("contain", plan, 64).contain and not lc.fit_method("bsd", plan, 64).contain
    assert lc.fit_method("prune", plan, 64) == jb.get_method("prune")


# --------------------------------------------------------------------------- the plain-MLP twin


def test_build_lm_plain_has_two_layer_gelu_mlps_of_the_same_shape():
    config = LMConfig.tiny()
    model = lc.build_lm(config, "plain")
    for block in model.blocks:
        assert isinstance(block.mlp, MLP) and block.mlp.fc1.kernel[...].shape == (config.dim, config.mlp_dim)
    mlp = model.blocks[0].mlp
    x = jax.random.normal(jax.random.key(1), (3, config.dim), jnp.float32)
    h = ACTIVATIONS["gelu"](x @ mlp.fc1.kernel[...] + mlp.fc1.bias[...][None, :])
    expected = h @ mlp.fc2.kernel[...] + mlp.fc2.bias[...][None, :]
    np.testing.assert_allclose(mlp(x), expected, rtol=1e-5, atol=1e-6)
    assert model(jnp.zeros((2, 5), jnp.int32)).shape == (2, 5, config.vocab_size)
    assert isinstance(lc.build_lm(config, "gated").blocks[0].mlp, GatedMLP)
    with pytest.raises(ValueError, match="mlp"):
        lc.build_lm(config, "moe")


def test_plain_checkpoint_loads_back_bit_for_bit(tmp_path):
    config = LMConfig.tiny()
    model = lc.build_lm(config, "plain", seed=3)
    lc.save_checkpoint(tmp_path / "plain", model, {"mlp": "plain"})
    back = lc.load_lm(tmp_path / "plain", "plain")
    tokens = jnp.arange(10, dtype=jnp.int32).reshape(1, 10) % config.vocab_size
    np.testing.assert_array_equal(np.asarray(back(tokens)), np.asarray(model(tokens)))
    assert isinstance(back.blocks[1].mlp, MLP)


# --------------------------------------------------------------------------- end to end (slow)


def _run_quick(out: pathlib.Path, tmp_path: pathlib.Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAXBSD_CACHE": str(tmp_path / "cache"),  # this checkout's jaxbsd first
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "lm_compression.py"), "--quick", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-5000:]
    return proc


@pytest.mark.slow
@pytest.mark.skipif(not (pathlib.Path(os.environ.get("JAXBSD_DATA", "/nonexistent")) / "text").exists(),
                    reason="no pystdlib corpus under $JAXBSD_DATA/text")
def test_quick_study_end_to_end_and_resume(tmp_path, monkeypatch):
    import report

    out = tmp_path / "out"
    _run_quick(out, tmp_path)
    path = out / "lm_compression_quick.json"
    result = json.loads(path.read_text())
    plan = result["plan"]
    assert result["mode"] == "quick" and result["provenance"]["solver_fingerprint"]
    assert result["command"].startswith("python experiments/lm_compression.py --quick")
    assert len(result["runs"]) == len(plan["budgets"]) * len(plan["methods"]) * plan["seeds"] * 2
    P = result["params_original"]
    for run in result["runs"]:
        assert run["status"] == "ok" and run["params"] <= (1 - run["reduction"]) * P
        assert math.isfinite(run["test_bpc"]) and 0 < run["test_bpc"] < math.log2(98) + 1
        assert set(run["ranks"]) == set(result["mlps"]) and all(e >= 0 for e in run["output_errors"].values())
    cap = plan["calib_windows"] * result["context"]
    for unit in result["units"]:  # S = max(128, 2r) for the rank compress_model gave the decoupling (capped)
        if unit["method"] == "bsd":
            (rank,) = set(unit["ranks"].values())
            assert unit["num_samples"] == min(max(128, 2 * rank), cap)
    assert result["test_subset"]["characters"] == plan["test_chars"]
    kinds = {r["kind"] for r in result["fit"]["rows"]}
    assert kinds == {"gated", "plain"} and "rank 4" in result["fit"]["finding"]
    assert all(f["jacobian"] == "structured" for f in result["fit"]["runs"])
    # where containment applies (the plain twin): compress_model's bsd at pruning's parameters, never above its error
    contain = result["fit"]["contain"]["rows"]
    assert contain and all(r["contain"]["params"] == r["prune"]["params"] for r in contain)
    assert all(r["worst_ratio"] <= 1.01 for r in contain)
    png = out / "lm_compression_quick.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "lm_compression_quick.csv").read_text().count("\n") == len(result["rows"]) + 1
    # the report renders it
    monkeypatch.setattr(report, "_load", lambda name: result if name == "lm_compression.json" else None)
    table = report.lm_compression_table()
    assert "Finding:" in table and "| training-free |" in table
    # a second run keeps every unit and writes the same numbers
    again = _run_quick(out, tmp_path)
    units = len(result["units"]) + len(result["fit"]["runs"]) + len(result["fit"]["contain"]["runs"])
    assert again.stderr.count("finished before, kept") == units
    assert json.loads(path.read_text())["runs"] == result["runs"]
