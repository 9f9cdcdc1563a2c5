"""The paper-reproduction scripts in ``experiments/``, run end to end in their smallest modes.

Each script runs as a subprocess (the scripts set process-wide JAX options such as x64), writes
into a temporary folder, and the tests check what a user relies on: machine-readable results
whose numbers are consistent with each other, PNG plots, and resuming after a kill.

The script runs take minutes (they train a small model when ``checkpoints/`` has none), so
they are marked slow and run in CI's separate slow step; the verdict helper is tested fast.
"""

from __future__ import annotations

import hashlib
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

ROOT = pathlib.Path(__file__).resolve().parents[1]  # experiments/ is on sys.path: pyproject's pytest pythonpath
slow = pytest.mark.slow

needs_cifar10 = pytest.mark.skipif(
    not default_root("cifar10") or not default_root("cifar10").exists(),
    reason="no CIFAR-10 copy under $JAXBSD_DATA (cifar10-jpg.zip)",
)

needs_fashion_mnist = pytest.mark.skipif(
    not default_root("fashion-mnist").is_dir(),
    reason="dataset-fashion-mnist is not installed (apt-get install -y dataset-fashion-mnist)",
)


def _env(tmp_path: pathlib.Path) -> dict:
    """The scripts' environment: this checkout's ``jaxbsd`` first (an editable install may be another
    tree's) and its ``experiments/`` (the dry-resume script imports the studies)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "experiments"), *filter(None, [env.get("PYTHONPATH")])])
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


@slow
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


def _first(out: pathlib.Path, pattern: str) -> pathlib.Path | None:
    found = sorted(out.glob(pattern))
    return found[0] if found else None


def _kill_after(args: list[str], out: pathlib.Path, pattern: str, tmp_path: pathlib.Path) -> pathlib.Path:
    """Run a script, SIGKILL it as soon as a file matching ``pattern`` exists under ``out``."""
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=_env(tmp_path), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 900
        found = None
        while time.monotonic() < deadline and proc.poll() is None:
            found = _first(out, pattern)
            if found is not None:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the smoke run finished before it could be killed"
        assert found is not None, "no unit finished in time"
        os.killpg(proc.pid, signal.SIGKILL)  # a hard kill: no cleanup code runs
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return found


# --------------------------------------------------------------------------- verdicts (fast)


def test_paired_verdict_on_constructed_data():
    import verdicts

    kw = dict(better="holds", worse="does not hold")
    win = verdicts.paired_verdict([95.1, 94.8, 95.3, 95.0], [93.0, 92.9, 93.4, 92.7], **kw)
    assert win["verdict"] == "holds" and win["p_ttest"] < 0.05 and win["wins"] == 4 and win["losses"] == 0
    assert win["mean_diff"] == pytest.approx(2.05)
    assert win["p_sign"] == pytest.approx(0.125)  # 4 of 4 pairs: 2 * 0.5^4
    loss = verdicts.paired_verdict([90.0, 90.5, 89.8], [92.1, 92.4, 92.0], **kw)
    assert loss["verdict"] == "does not hold" and loss["p_ttest"] < 0.05 and loss["mean_diff"] < 0
    noise = verdicts.paired_verdict([91.0, 92.5, 90.2], [91.4, 91.1, 91.3], **kw)
    assert noise["verdict"] == "within noise" and noise["p_ttest"] >= 0.05
    # no spread at all, a single pair, identical runs: never a verdict by accident
    assert verdicts.paired_verdict([91.0, 91.0], [91.0, 91.0], **kw)["verdict"] == "within noise"
    assert verdicts.paired_verdict([99.0], [1.0], **kw)["verdict"] == "within noise"
    # the labels are the caller's: FB/BF uses its own
    fbbf = verdicts.paired_verdict([74.5, 74.4, 74.6], [71.0, 71.2, 70.9], better="BF better", worse="FB better")
    assert fbbf["verdict"] == "BF better"
    with pytest.raises(ValueError, match="paired"):
        verdicts.paired_verdict([1.0, 2.0], [1.0], **kw)


# --------------------------------------------------------------------------- fidelity (fast)


def test_fidelity_metrics_against_scipy():
    """Relative logit error, KL(original ‖ compressed), top-1 agreement and accuracy, against
    scipy's softmax and entropy (an independent oracle)."""
    import fidelity
    import numpy as np
    from scipy.special import softmax
    from scipy.stats import entropy

    rng = np.random.default_rng(0)
    z0 = rng.normal(size=(50, 10)) * 3
    z = z0 + rng.normal(size=(50, 10))
    labels = rng.integers(0, 10, 50)
    got = fidelity.fidelity(z, z0, labels)
    kl = np.mean([entropy(p, q) for p, q in zip(softmax(z0, axis=1), softmax(z, axis=1))])
    assert got["kl"] == pytest.approx(kl, rel=1e-10) and got["kl"] > 0
    assert got["relative_error"] == pytest.approx(np.linalg.norm(z - z0) ** 2 / np.linalg.norm(z0) ** 2)
    assert got["agreement"] == pytest.approx(100 * np.mean(z.argmax(1) == z0.argmax(1)))
    assert got["accuracy"] == pytest.approx(100 * np.mean(z.argmax(1) == labels))
    same = fidelity.fidelity(z0, z0, z0.argmax(1))
    assert same == {"relative_error": 0.0, "kl": pytest.approx(0.0, abs=1e-12), "agreement": 100.0, "accuracy": 100.0}
    # a class whose probability underflows to 0 in the compressed model: finite KL, not inf/NaN
    far = fidelity.fidelity(np.array([[0.0, -2000.0]]), np.array([[1.0, 0.0]]), np.array([0]))
    p = softmax([1.0, 0.0])
    assert np.isfinite(far["kl"]) and far["kl"] == pytest.approx(p[0] * np.log(p[0]) + p[1] * (np.log(p[1]) + 2000))
    with pytest.raises(ValueError, match="labels"):
        fidelity.fidelity(z, z0, labels[:3])


@pytest.mark.parametrize("limit", [None, 100])
def test_held_out_images_avoid_every_calibration_draw(limit):
    import fidelity
    import numpy as np

    from jaxbsd.compression.blockwise import capture_indices

    n, capture, seed, steps = 1000, 64, 3, 4
    held = fidelity.heldout_indices(n, capture, seed, steps, limit)
    drawn = set(np.concatenate([capture_indices(n, capture, seed, s) for s in range(steps + 1)]).tolist())
    assert not drawn & set(held.tolist()) and np.all(np.diff(held) > 0)
    assert held.size == (n - len(drawn) if limit is None else limit)


@pytest.mark.parametrize("preset", ["FULL", "QUICK"])
def test_fidelity_rebuilds_the_training_free_units(preset):
    """The study's claim: each model is the training-free study's unit of the same method, ρ
    and seed — the same ``jaxbsd.compression.blockwise`` configuration, not one that merely looks alike."""
    import argparse

    import compression_study
    import fidelity
    import training_free

    args = argparse.Namespace(degree=3, dof=4, samples=None)
    plan, reference = getattr(fidelity, preset), getattr(training_free, preset)
    for key in ("model", "dataset", "blocks", "test_subset", "train_subset"):
        assert plan[key] == reference[key]
    for method in plan["methods"]:
        for rho in plan["budgets"]:
            assert (compression_study.unit_config(method, rho, 1, plan, args)
                    == compression_study.unit_config(method, rho, 1, reference, args))


def test_a_unit_whose_configuration_changed_starts_over(tmp_path):
    import units

    unit = tmp_path / "auto-rho0500-seed0"
    (unit / "model" / "3").mkdir(parents=True)
    (unit / "steps.json").write_text("[]")
    units.save_unit(unit / "unit.json", "tag-a", {"accuracy": 1.0})
    logged = []
    assert units.resume_unit(unit, "tag-a", "u", logged.append) == {"accuracy": 1.0}
    assert sorted(p.name for p in unit.iterdir()) == ["model", "steps.json", "unit.json"]  # kept as it is
    assert units.resume_unit(unit, "tag-b", "u", logged.append) is None
    assert unit.is_dir() and not list(unit.iterdir())  # another run's state would be refused by compress()
    assert "starting over" in logged[-1]


def test_order_verdict_pairs_by_basis_and_seed():
    import full_compression

    def run(order, basis, seed, acc):
        return {"order": order, "basis": basis, "seed": seed, "steps": [{"acc_ft": acc / 100}]}

    # Per basis, BF leads by 1 point on seeds 0-2; an FB run without its BF partner is left out.
    runs = [run("FB", b, s, 70.0 + s + off) for b, off in (("a", 0.0), ("b", 5.0)) for s in range(3)]
    runs += [run("BF", b, s, 71.0 + s + off + 0.01 * s) for b, off in (("a", 0.0), ("b", 5.0)) for s in range(3)]
    runs.append(run("FB", "a", 7, 10.0))
    v = full_compression.order_verdict(runs)
    assert v["pairs"] == 6 and v["seeds"] == [0, 1, 2]
    assert v["mean_diff"] == pytest.approx(1.01) and v["verdict"] == "BF better"
    one = full_compression.order_verdict([r for r in runs if r["basis"] == "b"])
    assert one["pairs"] == 3 and one["mean_diff"] == pytest.approx(1.01)


def test_source_line_names_the_machine_that_computed_the_runs():
    import report

    prov = {"provenance": {"command": "python x.py", "commit": "0123456789abc"}, "wall_seconds": 30.0}
    assert "2-core CPU machine" in report._source_line(prov)
    gpu = prov | {"machines": ["NVIDIA H200 (gpu), jax 0.11.2"], "run_seconds_total": 372.0}
    line = report._source_line(gpu)
    assert "6.2 min on NVIDIA H200 (gpu)" in line and "CPU machine" not in line
    kept = prov | {"runs": [{"seconds": 3600.0}, {"seconds": 1800.0}, {"note": "infeasible"}]}
    assert "runs: 1.5 h on the 2-core CPU machine over several sessions; this assembly 0.5 min" in \
        report._source_line(kept)


def test_report_generators_say_when_no_result_is_committed(monkeypatch, tmp_path):
    import report

    monkeypatch.setattr(report, "RESULTS", tmp_path)
    for name in ("comparison", "fb-bf", "vit-cifar10", "swin-cifar10", "budget-study", "training-free"):
        assert "No current result committed" in report.TABLES[name]()
    assert "No Swin / CIFAR-10 result committed" in report.TABLES["headline-swin-cifar10"]()


def test_renamed_checkpoints_keep_the_keys_of_committed_studies():
    """The trained models lost their ``.npz`` suffix; the studies' resume tags and protocol keys
    must still spell the old names, else every committed unit would be recomputed."""
    import checkout
    import trained

    for name in ("deit-usps", "vit-usps", "vit-cifar10"):
        recorded = checkout.rel_path(checkout.CHECKPOINTS / name)  # as load_or_train records it
        assert recorded == f"checkpoints/{name}" and (ROOT / recorded).is_dir()
        assert trained.checkpoint_key(recorded) == f"checkpoints/{name}.npz"
    assert trained.checkpoint_key("/elsewhere/checkpoints/x") == "/elsewhere/checkpoints/x"  # other paths as given
    units = sorted((ROOT / "experiments/results/state").glob("full_compression*/vit-cifar10/*/unit.json"))
    assert units
    for unit in units:  # full_compression: the tag names the checkpoint and its digest names the directory
        tag = json.loads(unit.read_text())["tag"]
        assert json.loads(tag)["ckpt"] == trained.checkpoint_key(checkout.rel_path(checkout.CHECKPOINTS / "vit-cifar10"))
        assert unit.parent.name.endswith(hashlib.sha256(tag.encode()).hexdigest()[:8])
    # The recorded DeiT command names its teacher by the old path: it is read as the new one.
    args, _ = trained.training_command("deit", "usps")
    teacher = args[args.index("--teacher") + 1]
    assert teacher == "checkpoints/vit-usps" and (ROOT / teacher).is_dir()


_DRY_RESUME = """
import json, pathlib, shlex, sys
import comparison, compression_study, full_compression
def fail(*args, **kwargs):
    raise AssertionError("a finished unit was not found under its key: it would be recomputed")
for module in (compression_study, full_compression):
    module.compress = module.load_checkpoint = fail
command = shlex.split(json.loads(pathlib.Path(sys.argv[1]).read_text())["command"])
module = comparison if command[1].endswith("comparison.py") else full_compression
sys.exit(module.main(command[2:] + ["--out", sys.argv[2]]))
"""


@pytest.mark.parametrize("method, fields", [
    ("bsd", {}),
    ("bsd-greedy", {"allocation": "greedy"}),
    ("bsd-warm", {"warm_start": True, "selection": "output"}),
    ("bsd-warm-nu8-s4-it100", {"warm_start": True, "selection": "output", "dof": 8, "samples_per_rank": 4,
                               "max_iter": 100}),
    ("bsd-warm-lam4", {"warm_start": True, "selection": "output", "lam": 4.0}),
])
def test_bsd_variants_set_only_their_own_fields(method, fields):
    import argparse

    import compression_study as study
    from refinement import Setting

    assert study.bsd_variant(method) == fields
    args = argparse.Namespace(degree=3, dof=4, samples=None)
    plan = {"max_iter": 300, "epochs": 0, "val_fraction": 0.0}
    got = study.unit_config(Setting(method), 0.2, 1, plan, args).to_dict()
    base = study.unit_config(Setting("bsd"), 0.2, 1, plan, args).to_dict()
    changed = {k for k in got if got[k] != base.get(k)} | {k for k in base if k not in got}
    assert changed == {{"dof": "basis"}.get(k, k) for k in fields}


def test_the_variant_that_contains_pruning_is_the_recipe():
    """``bsd-aug``: the study's unit builds ``methods.bsd.augmented("gelu")`` (the flat form's warm start
    is True, not None: every study MLP has a two-layer spec), at the study's λ and sweeps; ``auto-aug``:
    ``auto`` with that decoupling as its candidate. Their identities round-trip through the flat form."""
    import argparse
    import dataclasses

    import compression_study as study
    from refinement import Setting

    from jaxbsd.compression.config import CompressionConfig
    from jaxbsd.compression.methods.bsd import augmented

    args = argparse.Namespace(degree=3, dof=4, samples=None)
    plan = {"max_iter": 300, "epochs": 0, "val_fraction": 0.0}
    recipe = dataclasses.replace(augmented("gelu"), warm_start=True)
    config = study.unit_config(Setting("bsd-aug"), 0.2, 1, plan, args)
    assert config.method == recipe and study.method_name("bsd-aug").startswith("B-spline (augmented")
    auto = study.unit_config(Setting("auto-aug"), 0.2, 1, plan, args).method
    assert auto.name == "auto" and auto.judge == "model"
    assert dataclasses.replace(auto.bsd, warm_start=True) == recipe
    for c in (config, study.unit_config(Setting.parse("auto-aug-ref300"), 0.2, 1, plan, args)):
        assert CompressionConfig.from_dict(c.to_dict()).to_dict() == c.to_dict()


def test_the_variant_grammar_keeps_the_tags_of_committed_units():
    """A unit resumes only while its tag (its configuration) is unchanged: the committed
    training-free B-spline units must still match what ``unit_config`` builds for them."""
    import argparse

    import compression_study as study
    from refinement import Setting

    state = ROOT / "experiments" / "results" / "state" / "training_free_deit_usps"
    units = sorted(state.glob("*/bsd*-rho*-seed*/unit.json"))
    assert units, "no committed training-free B-spline unit"
    args = argparse.Namespace(degree=3, dof=4, samples=None)
    plan = {"max_iter": 300, "epochs": 0, "val_fraction": 0.0}
    for path in units:
        saved = json.loads(path.read_text())
        tag, record = json.loads(saved["tag"]), saved["record"]
        config = study.unit_config(Setting.parse(record["method"]), record["reduction"], record["seed"], plan, args)
        assert config.to_dict() == tag["config"], path


@pytest.mark.parametrize("method", ["bsd-", "bsd-nu", "bsd-fast", "bsd-it10x", "bsd-lam"])
def test_unknown_variants_are_refused(method):
    import compression_study as study

    with pytest.raises(ValueError, match="unknown B-spline option"):
        study.bsd_variant(method)


@slow
@needs_cifar10
@pytest.mark.parametrize("stem", ["comparison", "full_compression_vit_cifar10",
                                  "full_compression_paper_budget_vit_cifar10"])
def test_committed_studies_find_every_finished_unit(tmp_path, stem):
    """A dry rerun of the committed command, on a copy of the committed state, with compression
    and checkpoint loading replaced by failures: every unit must be kept, record for record."""
    import shutil

    committed = json.loads((ROOT / "experiments/results" / f"{stem}.json").read_text())
    out = tmp_path / "out"
    shutil.copytree(ROOT / "experiments/results/state", out / "state")
    proc = subprocess.run([sys.executable, "-c", _DRY_RESUME, str(ROOT / "experiments/results" / f"{stem}.json"),
                           str(out)],
                          cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert proc.stderr.count("finished before, kept") == len(committed["runs"])
    produced = json.loads((out / f"{stem}.json").read_text())
    assert produced["runs"] == committed["runs"]
    assert produced.get("protocol_key") == committed.get("protocol_key")


# --------------------------------------------------------------------------- scripts (slow)


@slow
def test_comparison_smoke_resumes_after_a_kill_and_respects_every_budget(tmp_path):
    import report

    out = tmp_path / "out"
    unit = _kill_after([str(ROOT / "experiments" / "comparison.py"), "--smoke", "--out", str(out)], out,
                       "state/comparison_smoke/protocol-*/*/unit.json", tmp_path)
    assert not (out / "comparison_smoke.json").exists()
    kept = json.loads(unit.read_text())["record"]

    resumed = _run("comparison.py", "--smoke", "--out", str(out), tmp_path=tmp_path)
    assert f"{unit.parent.name}: finished before, kept" in resumed.stderr
    result = json.loads((out / "comparison_smoke.json").read_text())
    again = next(u for u in result["runs"] if u["state_dir"].endswith(unit.parent.name))
    assert again == kept  # the finished unit was not recomputed: identical record, wall time included
    plan = result["plan"]
    assert len(result["runs"]) == len(plan["budgets"]) * len(plan["methods"]) * plan["seeds"]
    assert {u["method"] for u in result["runs"]} == {"bsd", "svd", "drone", "bsd-greedy", "prune"}
    P = result["params_original"]
    for u in result["runs"]:
        assert u["status"] == "ok"
        assert u["params"] <= (1 - u["reduction"]) * P  # the budget, for every method and seed
        assert 0.0 <= u["accuracy"] <= 100.0
        for s in u["steps"]:  # S = max(128, 2r), recorded
            assert s["num_samples"] == max(128, 2 * s["rank"])
    for rho in plan["budgets"]:
        verdicts = result["verdicts"][repr(rho)]
        assert set(verdicts) == {"svd", "drone", "bsd-greedy", "prune"}
        for v in verdicts.values():
            assert v["verdict"] in ("holds", "does not hold", "within noise") and v["n"] == plan["seeds"]
    row = next(r for r in result["rows"] if r["method"] == "bsd")
    accs = [u["accuracy"] for u in result["runs"] if u["method"] == "bsd"]
    assert row["accuracy_mean"] == pytest.approx(sum(accs) / len(accs))
    assert result["provenance"]["command"].startswith("python experiments/comparison.py --smoke")
    assert result["wall_seconds"] > 0
    assert _is_png(out / "comparison_smoke.png")
    # the report renders the JSON
    import shutil

    shutil.copy(out / "comparison_smoke.json", tmp_path / "comparison.json")
    import unittest.mock

    with unittest.mock.patch.object(report, "RESULTS", tmp_path):
        text = report.TABLES["comparison"]()
    assert "B-spline (greedy)" in text and "No current result" in text  # DeiT there, ViT not


@slow
def test_training_free_quick_resumes_after_a_kill_and_records_every_run(tmp_path):
    """The training-free study in its CI size: no fine-tuning (accuracy after the last replacement
    is the accuracy recorded), the budget for every run, per-block output errors, verdicts
    against B-spline, a plot, and a killed run resumes keeping its finished units."""
    import report

    out = tmp_path / "out"
    unit = _kill_after([str(ROOT / "experiments" / "training_free.py"), "--quick", "--out", str(out)], out,
                       "state/training_free_quick/protocol-*/*/unit.json", tmp_path)
    kept = json.loads(unit.read_text())["record"]
    resumed = _run("training_free.py", "--quick", "--out", str(out), tmp_path=tmp_path)
    assert f"{unit.parent.name}: finished before, kept" in resumed.stderr
    result = json.loads((out / "training_free_quick.json").read_text())
    assert next(u for u in result["runs"] if u["state_dir"].endswith(unit.parent.name)) == kept
    plan = result["plan"]
    assert plan["epochs"] == 0 and len(result["runs"]) == len(plan["budgets"]) * len(plan["methods"]) * plan["seeds"]
    P = result["params_original"]
    for u in result["runs"]:
        assert u["status"] == "ok" and u["params"] <= (1 - u["reduction"]) * P
        assert set(u["output_errors"]) == {str(b) for b in result["blocks"]}
        assert all(0 <= e < 10 for e in u["output_errors"].values())
        for s in u["steps"]:
            assert s["acc_ft"] == s["acc_cmtf"] and s["seconds_finetune"] < 1  # nothing was trained
            assert s["output_error"] == u["output_errors"][str(s["block"])]
        assert u["accuracy"] == pytest.approx(100 * u["steps"][-1]["acc_cmtf"])
    prune = [u for u in result["runs"] if u["method"] == "prune"]
    assert prune and all(len(s["kept"]) == s["rank"] for u in prune for s in u["steps"])
    for rho in plan["budgets"]:
        v = result["verdicts"][repr(rho)]["prune"]
        assert v["n"] == plan["seeds"] and v["verdict"] in ("holds", "does not hold", "within noise")
    assert result["provenance"]["command"].startswith("python experiments/training_free.py --quick")
    assert _is_png(out / "training_free_quick.png") and (out / "training_free_quick.csv").is_file()
    import shutil
    import unittest.mock

    shutil.copy(out / "training_free_quick.json", tmp_path / "training_free_deit_usps.json")
    with unittest.mock.patch.object(report, "RESULTS", tmp_path):
        text = report.TABLES["training-free"]()
    assert "Pruning" in text and "(reference)" in text and "No current result" in text  # DeiT there, ViT not


@slow
def test_fidelity_quick_writes_every_run_with_its_distances(tmp_path):
    """The fidelity study in its CI size: every run's distances on the test inputs and on the
    held-out training images, within their ranges; the budget held; CSV, plot and table."""
    import shutil
    import unittest.mock

    import report

    out = tmp_path / "out"
    _run("fidelity.py", "--quick", "--out", str(out), tmp_path=tmp_path)
    result = json.loads((out / "fidelity_quick.json").read_text())
    plan = result["plan"]
    assert len(result["runs"]) == len(plan["budgets"]) * len(plan["methods"]) * plan["seeds"]
    for u in result["runs"]:
        assert u["status"] == "ok" and u["params"] <= (1 - u["reduction"]) * u["params_original"]
        assert u["heldout_images"] == plan["heldout_images"] and u["accuracy"] == u["test"]["accuracy"]
        for part in ("test", "heldout_train"):
            m = u[part]
            assert 0 < m["relative_error"] < 1 and 0 < m["kl"] < 1 and 50 < m["agreement"] <= 100
    assert result["provenance"]["command"].startswith("python experiments/fidelity.py --quick")
    assert _is_png(out / "fidelity_quick.png") and (out / "fidelity_quick.csv").is_file()
    shutil.copy(out / "fidelity_quick.json", tmp_path / "fidelity_deit_usps.json")
    with unittest.mock.patch.object(report, "RESULTS", tmp_path):
        text = report.TABLES["fidelity"]()
    assert "Pruning" in text and "the closest to the original on the test inputs" in text


@slow
@needs_fashion_mnist
def test_full_compression_both_captures_killed_midway_resumes(tmp_path):
    out = tmp_path / "out"
    state = _kill_after([str(ROOT / "experiments" / "full_compression.py"), "--smoke", "--out", str(out)], out,
                        "state/full_compression_smoke/*/*/steps.json", tmp_path)
    assert not (out / "full_compression_smoke_vit_fashion-mnist.json").exists()
    saved = json.loads(state.read_text())["steps"]
    assert 1 <= len(saved) < 3

    resumed = _run("full_compression.py", "--smoke", "--out", str(out), tmp_path=tmp_path)
    assert f"seed 0: resuming after step {len(saved)} from" in resumed.stderr
    result = json.loads((out / "full_compression_smoke_vit_fashion-mnist.json").read_text())
    run = next(r for r in result["runs"] if str(state.parent.relative_to(out)) in r["state_dir"])
    for before, after in zip(saved, run["steps"]):  # kept, not recomputed
        assert after["seconds_compress"] == before["seconds_compress"]
        assert after["acc_ft"] == before["acc_ft"] and after["acc_cmtf"] == before["acc_cmtf"]
    assert [s["step"] for s in run["steps"]] == [1, 2, 3]
    plan = result["plan"]
    assert plan["capture"] == ["current", "original"]
    assert len(result["runs"]) == 2 * 2 * len(plan["bases"]) * plan["runs"]
    for r in result["runs"]:
        assert all(s["capture"] == r["capture"] for s in r["steps"])
        for s in r["steps"]:  # what the experiments read: no per-epoch test accuracy any more
            assert "finetune_kept" in s and 0 <= s["acc_ft"] <= 1
            assert all(a is not None for a in s["finetune_val_acc"])
    for capture in plan["capture"]:
        for order in ("FB", "BF"):
            cells = result["tables"][capture][order]["FT (3)"][plan["bases"][0]]
            assert len(cells["values"]) == plan["runs"]
            assert cells["mean"] == pytest.approx(sum(cells["values"]) / plan["runs"])
        v = result["verdicts"][capture][plan["bases"][0]]
        assert v["verdict"] in ("BF better", "FB better", "within noise") and v["n"] == plan["runs"]
    fb = next(r for r in result["runs"] if r["order"] == "FB")
    assert [s["block"] for s in fb["steps"]] == [0, 1, 2]
    assert _is_png(out / "full_compression_smoke_vit_fashion-mnist.png")
    assert (out / "full_compression_smoke_vit_fashion-mnist.csv").read_text().startswith("capture,order,step,")

    # Another machine has only what git tracks of the state: each finished run's unit.json.
    for path in (out / "state").rglob("*"):
        if path.is_file() and path.name != "unit.json":
            path.unlink()
    again = _run("full_compression.py", "--smoke", "--out", str(out), tmp_path=tmp_path)
    assert again.stderr.count("finished before, kept") == len(result["runs"])
    rerun = json.loads((out / "full_compression_smoke_vit_fashion-mnist.json").read_text())
    assert rerun["runs"] == result["runs"] and rerun["tables"] == result["tables"]


@slow
@needs_fashion_mnist
def test_full_compression_budget_study_smoke(tmp_path):
    out = tmp_path / "out"
    _run("full_compression.py", "--smoke", "--budget-study", "--runs", "2", "--out", str(out), tmp_path=tmp_path)
    d = json.loads((out / "full_compression_budget_study_smoke.json").read_text())
    ours, paper = d["results"]["ours"], d["results"]["paper"]
    assert ours["image_epochs_per_step"] < paper["image_epochs_per_step"]
    assert len(ours["final_accuracy"]) == len(paper["final_accuracy"]) == 2
    assert [r["seed"] for r in ours["runs"]] == [r["seed"] for r in paper["runs"]] == d["seeds"]
    assert all(r["order"] == "BF" and r["config"]["basis"] == {"kind": "BSpline", "degree": 3, "dof": 4}
               for r in ours["runs"] + paper["runs"])
    assert d["difference"]["mean_diff"] == pytest.approx(paper["mean"] - ours["mean"])
    assert d["difference"]["verdict"] in ("paper budget better", "our budget better", "within noise")


@slow
@needs_cifar10
def test_full_compression_vit_cifar10_smoke_with_the_papers_table(tmp_path):
    out = tmp_path / "out"
    _run("full_compression.py", "--smoke", "--model", "vit", "--dataset", "cifar10", "--capture", "current",
         "--runs", "1", "--out", str(out), tmp_path=tmp_path)
    d = json.loads((out / "full_compression_smoke_vit_cifar10.json").read_text())
    assert d["paper"]["original"] == 75.47 and d["paper"]["BF"]["FT (3)"]["R-CMTF-BSD nu=4 d=3"] == [73.6, 0.091]
    assert len(d["runs"]) == 2 and all(len(r["steps"]) == 3 for r in d["runs"])
    assert "paper (vit + cifar10" in d["table"]


def test_a_distillation_ablation_names_its_own_units_and_result_file():
    """Every knob that differs from the headline plan tags the result file (an ablation never
    overwrites the headline) and, but for the images and the variant, which the unit names already
    carry, the unit names; the headline plan tags nothing."""
    import distill

    assert distill.knob_suffix(dict(distill.FULL), "_") == ""
    plan = dict(distill.FULL, images=1024, learning_rate=3e-4, schedule="constant", trainable="all",
                variants=("kl",))
    assert distill.knob_suffix(plan, "_") == "_n1024_lr3_all_constant_kl"
    assert distill.knob_suffix(plan, "-", skip=("images", "variants")) == "-lr3-all-constant"


def test_a_minilm_distillation_ablation_names_its_own_result_file():
    """The MiniLM script's knobs, in its order: the committed ablation's file name
    (``minilm_distill_s2000_all.json``) is what its command makes, and the headline plan tags nothing."""
    import minilm_distill

    assert minilm_distill.knob_suffix(dict(minilm_distill.FULL), "_") == ""
    plan = dict(minilm_distill.FULL, steps=2000, trainable="all")
    assert minilm_distill.knob_suffix(plan, "_") == "_s2000_all"
    plan = dict(plan, distill_windows=4096, learning_rate=1e-3, trainable="replaced+norms")
    assert minilm_distill.knob_suffix(plan, "-") == "-n4096-s2000-lr10-norms"
    plan = dict(plan, lengths="passages", variants=("emb",))  # a run of another loss: its own file too
    assert minilm_distill.knob_suffix(plan, "_") == "_n4096_s2000_lr10_norms_passages_emb"
    assert minilm_distill.knob_suffix(plan, "-", skip=("variants",)) == "-n4096-s2000-lr10-norms-passages"
    assert minilm_distill.knob_suffix(dict(minilm_distill.QUICK), "_", minilm_distill.QUICK) == ""


def test_the_minilm_study_cuts_the_slow_cells_beyond_their_seeds():
    import minilm

    plan = minilm.FULL
    assert minilm._cut(plan, "bsd", 0.5, 1) and minilm._cut(plan, "auto", 0.6, 2)
    assert not minilm._cut(plan, "bsd", 0.5, 0) and not minilm._cut(plan, "bsd", 0.7, 2)
    assert not minilm._cut(plan, "prune", 0.5, 2) and not minilm._cut(minilm.QUICK, "bsd", 0.9, 1)


def test_a_resumed_unit_counts_the_seconds_its_finished_steps_took(tmp_path):
    """``units.resumed_seconds`` reads back what the compression's own report says its steps took
    (the MiniLM study adds it to a resumed unit's seconds, which were once the last process's alone)."""
    import units
    import grouped_toy

    assert units.resumed_seconds(tmp_path / "none") == 0.0
    _, report = grouped_toy.run("prune", refine=True, state_dir=tmp_path / "run")
    expected = sum(r.seconds + r.seconds_finetune for r in report.mlps)
    assert len(report.mlps) == 3 and expected > 0
    assert units.resumed_seconds(tmp_path / "run") == pytest.approx(expected, rel=1e-9)


@pytest.fixture
def minilm_path():
    """The installed all-MiniLM-L6-v2's folder; the test is skipped where the wheel is not installed."""
    from jaxbsd.data import minilm_dir

    try:
        return minilm_dir()
    except FileNotFoundError as err:
        pytest.skip(f"all-minilm-l6-v2 not installed: {err}")


def test_minilm_distill_layer_errors_locate_a_perturbed_layer(minilm_path):
    """``minilm_distill.layer_errors``: zero for the original itself; with one layer's MLP output
    weights scaled, zero before that layer and positive from it on (the error's location), and the
    embedding's 1 − cos recomputed in numpy from the two encoders' embeddings."""
    import numpy as np
    from flax import nnx

    import minilm_distill
    from jaxbsd.models import bert as B

    original = B.from_pretrained(minilm_path)
    ids = B.calibration_windows(original, ["The weather is lovely today. " * 40], 16, 3, seed=0)
    assert minilm_distill.layer_errors(original, original, ids) == pytest.approx([0.0] * 7, abs=1e-6)  # float32
    model = nnx.clone(original)
    fc = model.bert.layers[3].mlp
    out = next(v for k, v in vars(fc).items() if isinstance(v, nnx.Linear) and v.kernel[...].shape[0] > v.kernel[...].shape[1])
    out.kernel[...] = out.kernel[...] * 1.5
    errs = minilm_distill.layer_errors(model, original, ids)
    assert errs[:3] == pytest.approx([0.0] * 3, abs=1e-10) and min(errs[3:6]) > 1e-4
    e, e0 = (np.asarray(m(ids, np.ones_like(ids)), np.float64) for m in (model, original))
    cos = np.sum(e * e0, -1) / (np.linalg.norm(e, axis=-1) * np.linalg.norm(e0, axis=-1))
    assert errs[6] == pytest.approx(float(np.mean(1 - cos)), rel=1e-3, abs=1e-6)


def test_minilm_distill_mixed_lengths_cut_a_share_of_the_windows_short_and_pad_them(minilm_path):
    """``minilm_distill.mixed_lengths``: the cut windows end in [SEP] at a length in [4, T), padded
    after it and masked; the others unchanged; about half cut; the layer targets zero on padding
    and the embedding the encoder's own on the padded batch."""
    import numpy as np

    import minilm_distill

    T, sep, pad = 32, 102, 0
    windows = np.random.default_rng(0).integers(1000, 2000, (400, T)).astype(np.int32)
    windows[:, 0], windows[:, -1] = 101, sep
    ids, mask = minilm_distill.mixed_lengths(windows, sep, pad, seed=3)
    lengths = mask.sum(1)
    cut = lengths < T
    assert 0.4 < cut.mean() < 0.6 and lengths.min() >= 4
    assert np.array_equal(ids[~cut], windows[~cut]) and np.all(mask[~cut] == 1)
    for i in np.flatnonzero(cut):
        n = lengths[i]
        assert np.all(mask[i, :n] == 1) and np.all(mask[i, n:] == 0) and ids[i, n - 1] == sep
        assert np.all(ids[i, n:] == pad) and np.array_equal(ids[i, : n - 1], windows[i, : n - 1])
    again = minilm_distill.mixed_lengths(windows, sep, pad, seed=3)
    assert np.array_equal(again[0], ids) and not np.array_equal(minilm_distill.mixed_lengths(windows, sep, pad, 4)[0], ids)

    import jax.numpy as jnp

    from jaxbsd.models import bert as B

    encoder = B.from_pretrained(minilm_path)
    batch = {"ids": jnp.asarray(ids[:8]), "mask": jnp.asarray(mask[:8])}
    emb, layers = minilm_distill.embedding_and_layers(encoder, batch)
    assert len(layers) == 6 and all(float(jnp.abs(x[mask[:8] == 0]).max(initial=0.0)) == 0.0 for x in layers)
    assert all(float(jnp.abs(x[mask[:8] == 1]).max()) > 0 for x in layers)
    np.testing.assert_allclose(np.asarray(emb), np.asarray(encoder(batch["ids"], batch["mask"])), rtol=1e-5, atol=1e-6)


def test_minilm_distill_teacher_targets_in_chunks_are_the_whole_batch_targets(minilm_path):
    """``teacher_outputs(..., batch_size=2)`` over 5 windows (2 + 2 + 1: a ragged last run of one
    window) gives each window the targets one pass over all of them gives, in order."""
    import numpy as np

    import jax
    import jax.numpy as jnp
    import minilm_distill
    from jaxbsd.compression.distill import teacher_outputs
    from jaxbsd.models import bert as B

    original = B.from_pretrained(minilm_path)
    ids = B.calibration_windows(original, ["Chunks of windows, one pass each. " * 40], 12, 5, seed=1)
    tok = original.tokenizer
    ids, mask = minilm_distill.mixed_lengths(ids, tok.token_to_id("[SEP]"), tok.token_to_id("[PAD]"), seed=3)
    batch = {"ids": jnp.asarray(ids), "mask": jnp.asarray(mask, jnp.int32)}
    forward = minilm_distill.embedding_and_layers
    whole, chunked = teacher_outputs(original, batch, forward), teacher_outputs(original, batch, forward, batch_size=2)
    assert jax.tree.structure(whole) == jax.tree.structure(chunked)
    for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(chunked)):
        assert a.shape == b.shape and a.shape[0] == 5
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5)


def test_minilm_distill_calibration_passages_are_the_tokenizers_own_truncated_and_padded(minilm_path):
    """``minilm_distill.calibration_passages``: each row is the tokenizer's own encoding of its text
    truncated at ``seq_len`` (the Hugging Face tokenizer's truncation is the oracle), padded and
    masked after it; the drawn texts depend on the seed; a short passage embeds as ``encode`` embeds it
    alone; more passages than texts are refused."""
    import numpy as np

    import jax.numpy as jnp
    import minilm_distill
    from jaxbsd.models import bert as B

    encoder = B.from_pretrained(minilm_path)
    texts = ["A short passage.", "Another one, a little longer than the first of them.",
             "A long passage that runs past the cut. " * 12, "Tiny.", "The fifth text of five."]
    T = 16
    ids, mask = minilm_distill.calibration_passages(encoder, texts, T, 5, seed=0)
    assert ids.shape == mask.shape == (5, T)
    tok = encoder.tokenizer
    tok.no_padding()
    tok.enable_truncation(T)
    for row, m, text in zip(ids, mask, texts):  # all five drawn: sorted, in the texts' order
        expected = tok.encode(text).ids
        n = len(expected)
        assert m.sum() == n and np.all(m[:n] == 1) and np.all(m[n:] == 0)
        assert row[:n].tolist() == expected and np.all(row[n:] == encoder.bert.config.pad_token_id)
    assert mask[2].sum() == T and mask[0].sum() < T
    two = [minilm_distill.calibration_passages(encoder, texts, T, 2, seed=s)[0] for s in range(6)]
    assert len({r.tobytes() for r in two}) > 1
    emb = encoder(jnp.asarray(ids), jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(emb[0]), encoder.encode([texts[0]])[0], rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="count"):
        minilm_distill.calibration_passages(encoder, texts, T, 6, seed=0)


def test_every_committed_method_name_is_a_setting_whose_name_it_is():
    """The studies derive a unit's method label from its :class:`refinement.Setting` in one place;
    every label of a committed result reads back as a setting that derives the very same label, so
    the committed files keep resolving (their unit names, state folders and tables)."""
    from refinement import Refinement, Setting

    names = set()
    for path in (ROOT / "experiments" / "results").glob("*.json"):
        result = json.loads(path.read_text())
        if not isinstance(result, dict):
            continue
        names |= {r["method"] for r in result.get("runs", []) if isinstance(r, dict) and isinstance(r.get("method"), str)}
        methods = (result.get("plan") or {}).get("methods") if isinstance(result.get("plan"), dict) else None
        names |= {m for m in methods or [] if isinstance(m, str)}
    assert "prune-refc300b512" in names and "bsd-warm-ref150b512lr20" in names
    for name in names:
        assert Setting.parse(name).name == name
    assert Setting.parse("prune-ref150b512lr20") == Setting("prune", Refinement(150, "local", 512, 2e-3))
    assert Setting.parse("bsd-warm-refc300") == Setting("bsd-warm").with_refinement(300, "consistent")
    assert Setting.parse("-ref300") == Setting("-ref300") and not Setting.parse("bsd-nu8").refined
