"""The paper-reproduction scripts in ``experiments/``, run end to end in their smallest modes.

Each script runs as a subprocess (the scripts set process-wide JAX options such as x64), writes
into a temporary folder, and the tests check what a user relies on: machine-readable results
whose numbers are consistent with each other, PNG plots, and resuming after a kill.

These take minutes (they train a small model when ``checkpoints/`` has none), so they are
marked slow and run in CI's separate slow step.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from jaxbsd.data import default_root

ROOT = pathlib.Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

needs_fashion_mnist = pytest.mark.skipif(
    not default_root("fashion-mnist").is_dir(),
    reason="dataset-fashion-mnist is not installed (apt-get install -y dataset-fashion-mnist)",
)


def _env(tmp_path: pathlib.Path) -> dict:
    env = dict(os.environ)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env["JAXBSD_CACHE"] = env.get("JAXBSD_CACHE") or str(tmp_path / "cache")
    return env


def _run(script: str, *args: str, tmp_path: pathlib.Path, timeout: float = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / script), *args], cwd=ROOT,
                          env=_env(tmp_path), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{script} {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def _is_png(path: pathlib.Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@needs_fashion_mnist
def test_ablation_smoke_writes_every_run_and_resumes(tmp_path):
    out = tmp_path / "out"
    first = _run("ablation.py", "--smoke", "--out", str(out), tmp_path=tmp_path)
    result = json.loads((out / "ablation_smoke_fashion-mnist.json").read_text())
    grid = result["grid"]
    runs = result["runs"]
    configs = len(grid["ranks"]) * (len(grid["pd"]) + len(grid["dofs"]) * len(grid["spline_degrees"])) * 2
    assert len(runs) == configs * len(grid["lams"]) * grid["restarts"]
    for r in runs:
        assert 0.0 <= r["accuracy"] <= 100.0
        assert r["error_J"] is not None and math.isfinite(r["error_J"]) and r["error_J"] >= 0
        assert r["error_F"] is not None and math.isfinite(r["error_F"]) and r["error_F"] >= 0
        assert r["finite_logits"]
        assert r["status"] in ("converged", "max_iterations", "diverged", "nonfinite")
    # both variants at the paper's smallest λ ran (the non-robust one is the fragile one)
    assert {(r["variant"], r["lam"]) for r in runs} >= {("CMTF", 1e-6), ("R-CMTF", 1e-6)}
    # savings depend only on rank and basis: SP = 100 (1 - r (m + n + nu) / (2 delta m^2))
    m, hidden = result["mlp"]["in"], result["mlp"]["hidden"]
    for r in runs:
        p_bsd = r["rank"] * (m + m + r["basis"]["dof" if r["basis"]["kind"] == "BSpline" else "degree"]
                             + (0 if r["basis"]["kind"] == "BSpline" else 1))
        assert r["params_bsd"] == p_bsd
        assert r["savings"] == pytest.approx(100 * (1 - p_bsd / (2 * m * hidden)))
    # the heatmap cells are means of the runs
    cell = result["grids"]["accuracy"]["R-CMTF"][repr(grid["lams"][-1])]["PD"][0][0]
    vals = [r["accuracy"] for r in runs if r["variant"] == "R-CMTF" and r["lam"] == grid["lams"][-1]
            and r["column"] == "PD" and r["rank"] == grid["ranks"][0]]
    assert cell == pytest.approx(sum(vals) / len(vals))
    for metric in ("accuracy", "error_J", "error_F", "savings"):
        assert _is_png(out / f"ablation_smoke_fashion-mnist_{metric}.png")
    assert result["command"].startswith("python experiments/ablation.py --smoke")

    # a rerun of the same command resumes from the state file instead of solving again
    second = _run("ablation.py", "--smoke", "--out", str(out), tmp_path=tmp_path)
    assert "resuming" in second.stderr and "resuming" not in first.stderr
    again = json.loads((out / "ablation_smoke_fashion-mnist.json").read_text())
    assert again["runs"] == runs


def _first_state(out: pathlib.Path) -> pathlib.Path | None:
    found = sorted((out / "state").glob("full_compression_smoke/*/*/steps.json"))
    return found[0] if found else None


@needs_fashion_mnist
def test_full_compression_killed_midway_resumes_from_last_finished_step(tmp_path):
    out = tmp_path / "out"
    args = [sys.executable, str(ROOT / "experiments" / "full_compression.py"), "--smoke", "--out", str(out)]
    proc = subprocess.Popen(args, cwd=ROOT, env=_env(tmp_path), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 900
        state = None
        while time.monotonic() < deadline and proc.poll() is None:
            state = _first_state(out)
            if state is not None:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the smoke run finished before it could be killed"
        assert state is not None, "no step finished in time"
        os.killpg(proc.pid, signal.SIGKILL)  # a hard kill: no cleanup code runs
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert not (out / "full_compression_smoke_vit_fashion-mnist.json").exists()
    saved = json.loads(state.read_text())["steps"]
    assert 1 <= len(saved) < 3

    resumed = _run("full_compression.py", "--smoke", "--out", str(out), tmp_path=tmp_path)
    assert f"seed 0: resuming after step {len(saved)} from" in resumed.stderr
    result = json.loads((out / "full_compression_smoke_vit_fashion-mnist.json").read_text())
    run = next(r for r in result["runs"] if str(state.parent.relative_to(out)) in r["state_dir"])
    # the finished steps were kept, not recomputed: their records (wall times included) are identical
    for before, after in zip(saved, run["steps"]):
        assert after["seconds_compress"] == before["seconds_compress"]
        assert after["seconds_finetune"] == before["seconds_finetune"]
        assert after["acc_ft"] == before["acc_ft"] and after["acc_cmtf"] == before["acc_cmtf"]
    assert [s["step"] for s in run["steps"]] == [1, 2, 3]
    # every run of the plan finished and the table is built from them
    plan = result["plan"]
    assert len(result["runs"]) == 2 * len(plan["bases"]) * plan["runs"]
    for order in ("FB", "BF"):
        cells = result["tables"][order]["FT (3)"][plan["bases"][0]]
        assert len(cells["values"]) == plan["runs"]
        assert cells["mean"] == pytest.approx(sum(cells["values"]) / plan["runs"])
    fb_blocks = [s["block"] for s in result["runs"][0]["steps"]]
    assert result["runs"][0]["order"] == "FB" and fb_blocks == [0, 1, 2]
    assert _is_png(out / "full_compression_smoke_vit_fashion-mnist.png")
    assert (out / "full_compression_smoke_vit_fashion-mnist.csv").read_text().startswith("order,step,")


def test_comparison_smoke_respects_the_parameter_budget(tmp_path):
    out = tmp_path / "out"
    _run("comparison.py", "--smoke", "--out", str(out), tmp_path=tmp_path)
    result = json.loads((out / "comparison_smoke.json").read_text())
    rows = {r["method"]: r for r in result["rows"]}
    original = rows["DeiT"]["params"]
    for budget in result["plan"]["budgets"]:
        tag = f"({100 * budget:.0f} %)"
        svd, drone, bsd = rows[f"SVD {tag}"], rows[f"DRONE {tag}"], rows[f"B-spline {tag}"]
        assert svd["params"] == drone["params"] <= (1 - budget) * original
        assert bsd["params"] <= svd["params"]  # never more parameters than the baseline it is compared with
        for r in (svd, drone, bsd):
            assert 0.0 <= r["accuracy"] <= 100.0
            assert r["reduction"] == pytest.approx(100 * (1 - r["params"] / original))
    assert _is_png(out / "comparison_smoke.png")
    assert (out / "comparison_smoke.csv").read_text().startswith("method,top1_accuracy")
