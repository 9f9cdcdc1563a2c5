"""No committed result can go stale silently, and staleness follows the solver's numbers.

Every JSON under ``experiments/results/`` and ``benchmarks/`` records its provenance; one
computed with the solver records the solver's numerical fingerprint (:mod:`jaxbsd.solver.fingerprint`).
This test (run by ``.ci/run`` with the default suite) recomputes the fingerprint and fails for a
result whose recorded one moved beyond :data:`jaxbsd.solver.fingerprint.RTOL`, naming it, the moved
entries and the command that regenerates it. The issue's acceptance, in a clone of the
committed tree: a comment-only commit to ``jaxbsd/solver/cmtf.py`` keeps every result current;
multiplying a least-squares cutoff by 1e6 stales them. The README's result tables are
generated from those files (``experiments/report.py``), and so are the documentation site's.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from jaxbsd.solver import fingerprint as fp
from jaxbsd.io import provenance

import report  # experiments/ is on sys.path: pyproject's pytest pythonpath

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: How to multiply each least-squares cutoff of ``jaxbsd/solver/linalg.py`` by 1e6: (old text, new text).
#: The one place to update when the solver's code is rewritten; the test asserts the old text
#: occurs exactly once, so a rewrite that removes it fails loudly instead of testing nothing.
CUTOFF_PATCHES = {
    # _pinv_relative_cutoff: eigenvalues at or below r · eps · max|λ| are dropped (the same relative cutoff
    # bounds the condition number under which the Cholesky path is taken).
    "pinv": ("return A.shape[-1] * jnp.finfo(A.dtype).eps",
             "return 1e6 * A.shape[-1] * jnp.finfo(A.dtype).eps"),
    # _lstsq: singular values below max(k, ν) · eps · σ_max are dropped (rcond=None).
    "lstsq": ("jnp.linalg.lstsq(A, b, rcond=None)",
              "jnp.linalg.lstsq(A, b, rcond=1e6 * max(A.shape) * float(jnp.finfo(A.dtype).eps))"),
}
#: The fingerprint case built to see each cutoff.
CUTOFF_CASES = {"pinv": "near_singular_pinv", "lstsq": "near_singular_lstsq"}


def _solver_results() -> list[pathlib.Path]:
    return [p for p in report.result_files()
            if any(k in (json.loads(p.read_text()).get("provenance") or {}) for k in report.SOLVER_KEYS)]


@pytest.mark.slow  # recomputes the fingerprint (12 s cold); CI runs report.py --check right after the fast suite
def test_every_committed_result_is_current():
    files = report.result_files()
    assert files, "no committed results found"
    assert report.stale_results(files) == []


def test_readme_and_docs_tables_are_generated_from_the_results():
    targets = report.target_files()
    # The README keeps the headline tables, the documentation site the full ones.
    assert {ROOT / "README.md", ROOT / "docs" / "results.md", ROOT / "docs" / "performance.md"} <= set(targets)
    for path in targets:
        text = path.read_text()
        assert report.render(text) == text, f"{path.name}: tables out of date: run python experiments/report.py"


def _write(path, payload):
    path.write_text(json.dumps(payload))
    return path


@pytest.mark.slow  # computes the fingerprint: 12 s cold
def test_the_guard_refuses_a_moved_fingerprintless_or_unprovenanced_result(tmp_path):
    current = fp.solver_fingerprint()
    # A result written now passes ...
    fresh = _write(tmp_path / "current.json", {"provenance": provenance("python x.py")})
    assert report.stale_results([fresh]) == []
    committed = _solver_results()[0]
    payload = json.loads(committed.read_text())
    name = sorted(current)[0]
    # ... so does a committed one whose fingerprint differs within tolerance (rounding) ...
    payload["provenance"]["solver_fingerprint"] = {**current, name: current[name] * (1 + fp.RTOL / 10)}
    assert report.stale_results([_write(tmp_path / committed.name, payload)]) == []
    # ... one whose fingerprint moved beyond it fails, naming the file, the entry and the command ...
    payload["provenance"]["solver_fingerprint"] = {**current, name: current[name] * (1 + 10 * fp.RTOL)}
    problems = report.stale_results([_write(tmp_path / committed.name, payload)])
    assert len(problems) == 1 and "stale" in problems[0] and committed.name in problems[0]
    assert name in problems[0] and payload["provenance"]["command"] in problems[0]
    # ... so does a solver result with no fingerprint (a source hash alone no longer vouches) ...
    del payload["provenance"]["solver_fingerprint"]
    problems = report.stale_results([_write(tmp_path / committed.name, payload)])
    assert len(problems) == 1 and "no solver_fingerprint" in problems[0]
    # ... and a result with no provenance at all.
    bare = _write(tmp_path / "bare.json", {"command": "python x.py", "results": {}})
    assert "no provenance" in report.stale_results([bare])[0]


def test_a_result_computed_without_the_solver_needs_no_fingerprint(tmp_path):
    result = _write(tmp_path / "train.json", {"provenance": provenance("jaxbsd train", solver=False)})
    assert "solver_fingerprint" not in json.loads(result.read_text())["provenance"]
    assert report.stale_results([result], fingerprint={"x": 1.0}) == []


@pytest.mark.parametrize("old, new, moved", [
    (1.0, 1.0 + 1e-10, False), (1.0, 1.0 + 1e-8, True), (-2.0, -2.0 - 1e-8, True), (0.0, 1e-16, False),
    (0.0, 1e-13, True), (1.0, float("nan"), True),
])
def test_compare_fingerprints_applies_the_tolerance(old, new, moved):
    out = fp.compare_fingerprints({"a": old, "b": 3.0}, {"a": new, "b": 3.0}, rtol=1e-9, atol=1e-15)
    assert (out != []) == moved
    if moved:
        assert len(out) == 1 and out[0].startswith("a:") and repr(old) in out[0]


def test_compare_fingerprints_reports_missing_and_new_entries():
    out = fp.compare_fingerprints({"a": 1.0, "b": 2.0}, {"a": 1.0, "c": 2.0})
    assert [line.split(":")[0] for line in out] == ["b", "c"]
    assert fp.compare_fingerprints({}, {"a": 1.0}) != []


@pytest.mark.parametrize("name", sorted(report.TABLES))
def test_each_generated_table_renders(name):
    assert report.TABLES[name]().strip()


def test_every_generator_has_a_block_and_every_block_a_generator():
    """Each report marker in the README and the docs pages is one the generator sees (a name it
    cannot parse would leave a table silently ungenerated), and every table is shown somewhere."""
    opened = [name for path in report.target_files() for name in report.MARKER.findall(path.read_text())]
    assert opened and set(opened) == set(report.TABLES)
    assert all(name.startswith("headline-") for name in report.MARKER.findall(report.README.read_text()))


def test_check_names_the_out_of_date_file(tmp_path, monkeypatch, capsys):
    """--check fails on a docs page whose generated block was edited by hand, naming the page."""
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "README.md").write_text("<!-- report:training -->\n" + report.TABLES["training"]() + "\n<!-- /report:training -->\n")
    (root / "docs" / "page.md").write_text("# Page\n\n<!-- report:training -->\nhand-typed\n<!-- /report:training -->\n")
    monkeypatch.setattr(report, "ROOT", root)
    monkeypatch.setattr(report, "target_files", lambda: [root / "README.md", root / "docs" / "page.md"])
    monkeypatch.setattr(report, "result_files", lambda: [])
    assert report.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "docs/page.md" in err and "README.md" not in err
    assert report.main([]) == 0 and report.main(["--check"]) == 0
    assert "hand-typed" not in (root / "docs" / "page.md").read_text()


@pytest.mark.parametrize("marker", ["<!-- report:Synthetic -->\nx\n<!-- /report:Synthetic -->",
                                    "<!-- report:synthetic -->x<!-- /report:synthetic -->"])
def test_malformed_block_is_refused(marker):
    with pytest.raises(ValueError, match="malformed"):
        report.render("intro\n" + marker + "\n")


@pytest.mark.slow  # computes the fingerprint: 12 s cold
def test_the_fingerprint_is_finite_covers_every_case_and_is_cached():
    values = fp.solver_fingerprint()
    assert sorted({k.split(".")[0] for k in values}) == sorted(fp.CASES)
    assert all(np.isfinite(v) and v > 0 for v in values.values())
    assert fp.solver_fingerprint() == values


@pytest.mark.slow  # computes the 22-entry fingerprint three times: ~25 s on 2 cores
def test_the_value_cache_is_keyed_by_the_sources_and_survives_a_corrupt_file(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXBSD_CACHE", str(tmp_path))
    compute = fp._fingerprint.__wrapped__  # the uncached-in-memory function
    values = dict(compute(True))
    path = fp._cache_file()
    assert path.is_relative_to(tmp_path) and json.loads(path.read_text()) == values
    # A stored file is what a byte-identical package reads back (marked here to see it) ...
    path.write_text(json.dumps({**values, "marker.value": 1.0}))
    assert dict(compute(True))["marker.value"] == 1.0
    # ... a corrupt one is recomputed and replaced, and cache=False never reads it.
    path.write_text("{not json")
    assert dict(compute(True)) == values and json.loads(path.read_text()) == values
    path.write_text(json.dumps({**values, "marker.value": 1.0}))
    assert dict(compute(False)) == values
    # The key covers the package's sources: another source hash, another file.
    monkeypatch.setattr(fp, "_SOURCES_AT_IMPORT", "0" * 64)
    assert fp._cache_file() != path


# Slow step: every fingerprint case solved twice more (the fast suite checks the committed
# results against the fingerprint itself).
@pytest.mark.slow
@pytest.mark.parametrize("scale", [1e-15, 1e-14])
def test_rounding_level_perturbations_stay_within_tolerance(scale):
    """Robustness: the fingerprint must not move across machines, BLAS builds or fusion
    decisions. Perturbing every input of every case by ``scale`` relative (about 5 and 45 ulps,
    more than the rounding differences between two builds) moves no entry beyond ``RTOL``.
    Measured when the tolerance was set: at most 3.1e-11 relative (see jaxbsd.solver.fingerprint.RTOL)."""
    rng = np.random.default_rng(0)
    worst = {}
    for name, case in fp.CASES.items():
        base = fp.case_values(name)
        inputs = tuple(np.asarray(a) * (1 + scale * rng.standard_normal(np.shape(a))) for a in case.inputs())
        perturbed = fp.case_values(name, inputs)
        assert perturbed != base, f"{name}: the perturbation changed nothing (is the case reading its inputs?)"
        worst.update({k: abs(perturbed[k] - base[k]) / abs(base[k]) for k in base})
    assert max(worst.values()) < fp.RTOL, {k: f"{v:.1e}" for k, v in worst.items() if v >= fp.RTOL}


# --------------------------------------------------------------------------- the acceptance


def _clone(tmp_path: pathlib.Path) -> pathlib.Path:
    """A clone of the committed tree (HEAD) of this checkout."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", "--shared", "--no-checkout", str(ROOT), str(clone)], check=True)
    subprocess.run(["git", "checkout", "--quiet", "--detach", head.stdout.strip()], cwd=clone, check=True)
    return clone


def _stale_in(clone: pathlib.Path, tmp_path: pathlib.Path) -> dict:
    """The clone's own ``stale_results`` over its committed results, in a fresh process that
    imports the clone's ``jaxbsd`` and recomputes the fingerprint (an empty value cache)."""
    script = ("import json; import report, jaxbsd; "
              "print(json.dumps({'package': jaxbsd.__file__, 'files': [str(p) for p in report.result_files()], "
              "'problems': report.stale_results(report.result_files())}))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(clone), str(clone / "experiments")]),
           "JAXBSD_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", script], cwd=clone, env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert pathlib.Path(result["package"]).is_relative_to(clone)
    return result


# The two acceptance tests recompute the fingerprint from scratch in a fresh process on a clone
# (every case's solver compiles again): 11 s and 18 s on the quiet machine, nothing a test can cut.
@pytest.mark.slow
def test_a_comment_only_commit_to_the_solver_keeps_every_result_current(tmp_path):
    clone = _clone(tmp_path)
    cmtf = clone / "jaxbsd" / "solver" / "cmtf.py"
    cmtf.write_text(cmtf.read_text().replace('"""R-CMTF-BSD:', '# A comment that changes no number.\n"""R-CMTF-BSD:', 1)
                    + "\n# Another one.\n")
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid"]
    subprocess.run([*git, "commit", "--quiet", "-am", "comment only"], cwd=clone, check=True)
    result = _stale_in(clone, tmp_path)
    assert len(result["files"]) == len(report.result_files())
    assert result["problems"] == []


@pytest.mark.slow  # a fresh process recomputes the fingerprint: 18 s (see above)
@pytest.mark.parametrize("cutoff", ["pinv", "lstsq"])
def test_multiplying_a_least_squares_cutoff_by_1e6_stales_every_solver_result(tmp_path, cutoff):
    clone = _clone(tmp_path)
    linalg = clone / "jaxbsd" / "solver" / "linalg.py"
    old, new = CUTOFF_PATCHES[cutoff]
    source = linalg.read_text()
    assert source.count(old) == 1, f"update CUTOFF_PATCHES[{cutoff!r}]: {old!r} is not in jaxbsd/solver/linalg.py once"
    linalg.write_text(source.replace(old, new))
    assert linalg.read_text() != source
    problems = _stale_in(clone, tmp_path)["problems"]
    solver_results = _solver_results()
    assert solver_results and len(problems) == len(solver_results)
    for path, problem in zip(solver_results, problems):
        assert path.name in problem and "stale" in problem and CUTOFF_CASES[cutoff] in problem
