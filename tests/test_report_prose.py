"""Figures in prose are references to committed results (``experiments/report.py``).

A figure in the README or a documentation page is written ``<!-- fig EXPR -->TEXT<!-- /fig -->``:
``report.py`` renders ``EXPR`` against the committed result JSON, and ``--check`` fails when
``TEXT`` no longer matches, and when a result-like number (a percentage, a p-value, a "×" ratio,
a signed difference, a time or difference with decimals) sits outside a generated region and is
not marked ``<!-- from SOURCE -->`` (quoted from the paper or another named source).
"""

import json
import pathlib
import re
import shutil
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
import report  # noqa: E402

PERTURBED = "comparison_vit_fashion-mnist.json"  # cmp_vit: README, results, ... quote it


def _perturb(payload: dict) -> dict:
    """Every run and summary moved, by method and seed (so every mean, difference and p-value
    that reads them moves): what regenerating the result could do."""
    methods = sorted({r["method"] for r in payload["runs"]})
    k = {m: i + 1 for i, m in enumerate(methods)}
    for r in payload["runs"]:
        if r.get("status") != "ok":
            continue
        i = k[r["method"]]
        r["accuracy"] -= 0.3 * i + 0.11 * i * (r["seed"] + 1)
        r["accuracy_compressed"] -= 0.2 * i
        r["params"] -= 100 * i
        r["reduction_achieved"] += 0.001 * i
    for r in payload["rows"]:
        if r["status"] == "ok":
            r["accuracy_mean"] -= 0.3 * k[r["method"]] + 0.22 * k[r["method"]]
            r["params_mean"] -= 100 * k[r["method"]]
    for verdicts in payload["verdicts"].values():
        for method, v in verdicts.items():
            if v.get("n"):
                v["mean_diff"] += 0.5 * (k[method] - k["bsd"])
                v["p_ttest"] = v["p_ttest"] / 3
    return payload


@pytest.fixture(scope="module")
def pages():
    return {p: p.read_text() for p in report.target_files()}


def test_every_page_of_the_site_and_the_readme_is_checked(pages):
    on_site = {ROOT / "README.md", *(ROOT / "docs").rglob("*.md")}
    assert set(pages) == on_site
    assert sum(len(report.figures(t)) for t in pages.values()) > 200


def test_the_committed_pages_pass_the_check(pages):
    ns = report.namespace()
    for path, text in pages.items():
        assert report.render(text, ns) == text, f"{path}: run python experiments/report.py"
        assert report.unmarked_figures(text) == [], path
        assert report.misplaced_markers(text) == [], path


def test_a_marker_that_starts_a_line_is_refused():
    # Markdown would read it as an HTML block and cut the list item or paragraph in two.
    text = "- a list item whose figure is\n  <!-- fig pct(1) -->1.00 %<!-- /fig --> on a line of its own\n"
    assert report.misplaced_markers(text) == [2]
    assert report.misplaced_markers(text.replace("is\n  <!--", "is <!--")) == []


def test_perturbing_one_result_moves_every_figure_and_table_that_reads_it(tmp_path, monkeypatch, pages):
    results = tmp_path / "results"
    results.mkdir()
    for src in (ROOT / "experiments" / "results").glob("*.json"):
        (results / src.name).symlink_to(src)
    (results / PERTURBED).unlink()
    payload = _perturb(json.loads((ROOT / "experiments" / "results" / PERTURBED).read_text()))
    (results / PERTURBED).write_text(json.dumps(payload))

    before = report.namespace()
    after = report.namespace(results=results)
    name = next(n for n, f in report.SOURCES.items() if f == PERTURBED)
    dependent = independent = 0
    for path, text in pages.items():
        for expr in report.figures(text):
            old, new = report.figure(expr, before), report.figure(expr, after)
            if not re.search(rf"\b{name}\b", expr):
                assert new == old, (path, expr)
                independent += 1
                continue
            dependent += 1
            if expr.endswith(".verdict") and new == old:
                # A verdict is a word a moved difference need not flip: its test must have moved.
                expr = expr[: -len(".verdict")] + ".p"
                old, new = report.figure(expr, before), report.figure(expr, after)
            assert new != old, f"{path.name}: `{expr}` did not move with {PERTURBED}"
    assert dependent >= 10 and independent > 100

    # Tables and prose alike, through the whole page, as report.py writes it.
    monkeypatch.setattr(report, "RESULTS", results)
    for page, blocks in ((ROOT / "README.md", ["headline-comparison"]), (ROOT / "docs" / "results.md", ["comparison"])):
        new = report.render(pages[page])
        assert new != pages[page]
        for block in blocks:
            body = lambda t: re.search(rf"<!-- report:{block} -->\n(.*?)<!-- /report:{block} -->", t, re.S).group(1)  # noqa: E731
            assert body(new) != body(pages[page]), (page.name, block)
        # The ViT's DRONE verdict at ρ = 0.35 moved with the data: the sentence is regenerated.
        assert report.render(new) == new


def _site_copy(tmp_path, monkeypatch) -> pathlib.Path:
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    shutil.copy(ROOT / "README.md", root / "README.md")
    shutil.copy(ROOT / "docs" / "compress.md", root / "docs" / "compress.md")
    monkeypatch.setattr(report, "ROOT", root)
    monkeypatch.setattr(report, "target_files", lambda: [root / "README.md", *sorted((root / "docs").glob("*.md"))])
    monkeypatch.setattr(report, "result_files", lambda: [])
    return root


def test_a_hand_typed_figure_fails_the_check_with_file_and_line(tmp_path, monkeypatch, capsys):
    root = _site_copy(tmp_path, monkeypatch)
    assert report.main(["--check"]) == 0
    page = root / "docs" / "compress.md"
    lines = page.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.strip() == "") + 1  # after the first paragraph
    lines.insert(at, "B-splines lead by +0.99 (p = 0.01) here.\n")
    page.write_text("".join(lines))
    capsys.readouterr()
    assert report.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert f"docs/compress.md:{at + 1}: result-like number '+0.99'" in err
    assert f"docs/compress.md:{at + 1}: result-like number 'p = 0.01'" in err
    assert "README.md" not in err
    # Marked as quoted from a named source, it passes; from an unnamed one, the marker is malformed.
    page.write_text(page.read_text().replace("+0.99 (p = 0.01)", "<!-- from the paper, Table 3 -->+0.99 (p = 0.01)<!-- /from -->"))
    assert report.main(["--check"]) == 0
    page.write_text(page.read_text().replace("<!-- from the paper, Table 3 -->", "<!-- from  -->"))
    with pytest.raises(ValueError, match="malformed"):
        report.main(["--check"])


def test_an_edited_figure_fails_the_check_and_report_rewrites_it(tmp_path, monkeypatch, capsys):
    root = _site_copy(tmp_path, monkeypatch)
    page = root / "docs" / "compress.md"
    text = page.read_text()
    m = next(report.FIG.finditer(text))
    line = text.count("\n", 0, m.start("text")) + 1
    page.write_text(text[: m.start("text")] + "+0.99" + text[m.end("text"):])
    capsys.readouterr()
    assert report.main(["--check"]) == 1
    assert f"docs/compress.md:{line}: generated tables or figures are out of date" in capsys.readouterr().err
    assert report.main([]) == 0
    assert page.read_text() == text and report.main(["--check"]) == 0


@pytest.mark.parametrize("number, flagged", [
    ("88.55 %", True), ("p = 0.022", True), ("5.8–6.5×", True), ("+0.99", True), ("−0.20", True),
    ("0.45 s", True), ("0.7 points", True), ("p < 0.05", False), ("8×8 images", False), ("ρ = 0.35", False),
    ("`reduction=0.3`", False), ("3 seeds", False), ("[link](results.md#x-5-6)", False),
])
def test_what_counts_as_a_result_like_number(number, flagged):
    assert bool(report.unmarked_figures(f"Text with {number} in it.\n")) == flagged


def test_formatters():
    assert report.sgn(-0.2) == "−0.20" and report.sgn(0.224) == "+0.22"
    assert report.pv(0.02218) == "p = 0.022" and report.pv(0.0002) == "p < 0.001" and report.pv(0.465) == "p = 0.47"
    assert report.rng([3.54, 0.72, 1.52], 1) == "0.7–3.5" and report.rng([1.0, 1.001]) == "1.00"
    assert report.count(9, 18) == "9 of 18" and report.ratio(5.835) == "5.8×"
    v = report.Paired([88.22, 88.19, 88.26], [88.04, 87.99, 87.97])
    assert v.verdict == "holds" and v.d == "+0.22" and v.pv == "p = 0.022"


def test_a_bad_expression_names_itself():
    with pytest.raises(ValueError, match="cmp_vit.nothing"):
        report.render("x <!-- fig cmp_vit.nothing -->1<!-- /fig --> y\n")
