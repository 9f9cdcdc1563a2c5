"""No committed result can go stale silently.

Every JSON under ``experiments/results/`` and ``benchmarks/`` records its provenance; one
computed with the solver is stale as soon as a solver file changes, and this test (run by
``.ci/run`` with the default suite) fails naming it and the command that regenerates it. The
result tables of the README and the documentation site are generated from those files
(``experiments/report.py``).
"""

import json
import pathlib
import shutil
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
import report  # noqa: E402

from jaxbsd.io import SOLVER_FILES, provenance, source_hash  # noqa: E402


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


def test_the_guard_fails_on_a_stale_or_unprovenanced_result(tmp_path):
    # A current result passes ...
    current = _write(tmp_path / "current.json", {"provenance": provenance("python x.py")})
    assert report.stale_results([current]) == []
    # ... a copy of a committed result whose solver files have since changed fails, naming the
    # file and the command that regenerates it ...
    committed = next(p for p in report.result_files() if "solver_hash" in json.loads(p.read_text())["provenance"])
    stale = tmp_path / committed.name
    shutil.copy(committed, stale)
    payload = json.loads(stale.read_text())
    payload["provenance"]["solver_hash"] = "0" * 64
    _write(stale, payload)
    problems = report.stale_results([stale])
    assert len(problems) == 1 and "stale" in problems[0] and payload["provenance"]["command"] in problems[0]
    # ... and so does a result with no provenance at all.
    bare = _write(tmp_path / "bare.json", {"command": "python x.py", "results": {}})
    assert "no provenance" in report.stale_results([bare])[0]


def test_editing_a_solver_file_makes_results_stale(tmp_path, monkeypatch):
    """The hash really covers the solver files: a one-byte edit of a copy changes it."""
    import jaxbsd.io as jio

    package = tmp_path / "jaxbsd"
    shutil.copytree(jio.PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(jio, "PACKAGE", package)
    before = source_hash(SOLVER_FILES)
    # The copy is not a git checkout, so the commit is given by hand; the hashes are the copy's.
    result = _write(tmp_path / "r.json", {"provenance": {"command": "python x.py", "commit": "test",
                                                         "source_hash": source_hash(), "solver_hash": before}})
    assert report.stale_results([result]) == []
    (package / "cmtf.py").write_text((package / "cmtf.py").read_text() + "\n# edit\n")
    assert source_hash(SOLVER_FILES) != before
    assert "stale" in report.stale_results([result])[0]


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
