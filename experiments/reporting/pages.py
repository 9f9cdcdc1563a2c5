"""The result tables of the README and the documentation site, generated from the committed
result JSON, and the staleness guard: the pages rendered and checked, and the command line of
``python experiments/report.py [--check] [--results DIR]``."""

from __future__ import annotations

import argparse
import pathlib
import re
import sys

from . import committed
from .figures import (BLOCK, FIG, FIG_OPEN, FROM, FROM_OPEN, MARKER, figure, figures, misplaced_markers, namespace,
                      unmarked_figures)
from .registry import TABLES, load_tables
from .stale import stale_results

load_tables()  # every table module registers its tables as it is imported


def render(text: str, ns: dict | None = None) -> str:
    """``text`` with every generated block replaced by its current table and every figure in
    prose by its current value."""
    def fill(m: re.Match) -> str:
        name = m.group("name")
        if name not in TABLES:
            raise ValueError(f"report block report:{name} has no generator; known: {sorted(TABLES)}")
        return m.group(1) + TABLES[name]().rstrip("\n") + "\n" + m.group(4)

    opened = MARKER.findall(text)
    matched = [m.group("name") for m in BLOCK.finditer(text)]
    if opened != matched:
        # A block the pattern does not see would be left as it is, silently: refuse instead.
        raise ValueError(f"report blocks {sorted(set(opened) - set(matched))} are malformed (a name "
                         "of a-z, 0-9, _ and -, a newline after the opening marker, a matching closing marker)")
    for pattern, opening, what in ((FIG, FIG_OPEN, "fig EXPR"), (FROM, FROM_OPEN, "from SOURCE")):
        starts = {m.start() for m in pattern.finditer(text)}
        bad = [text.count("\n", 0, m.start()) + 1 for m in opening.finditer(text) if m.start() not in starts]
        if bad:
            raise ValueError(f"malformed <!-- {what} -->...<!-- /{what.split()[0]} --> on line(s) {bad} "
                             "(an expression or source on the opening marker's line, then a closing marker)")
    text = BLOCK.sub(fill, text)
    if FIG.search(text):
        ns = namespace() if ns is None else ns
        text = FIG.sub(lambda m: m.group(0)[:m.start("text") - m.start()] + figure(m.group("expr"), ns)
                       + "<!-- /fig -->", text)
    return text


def target_files(root: pathlib.Path | None = None) -> list[pathlib.Path]:
    """The pages this script renders and checks: ``README.md`` and every page of the
    documentation site (``docs/**/*.md``)."""
    root = committed.ROOT if root is None else root
    return [p for p in [root / "README.md", *sorted((root / "docs").rglob("*.md"))] if p.exists()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="fail on stale results, a generated block or figure that is out of date, or a "
                             "result-like number typed by hand")
    parser.add_argument("--results", type=pathlib.Path, default=None,
                        help="read the results from this directory instead of experiments/results")
    args = parser.parse_args(argv)
    if args.results is not None:
        committed.RESULTS = args.results
    targets = target_files()
    ns = namespace()
    rendered = {path: (path.read_text(), render(path.read_text(), ns)) for path in targets}
    if args.check:
        problems = stale_results(committed.result_files())
        count_figs = 0
        for path, (text, new) in rendered.items():
            rel = path.relative_to(committed.ROOT)
            count_figs += len(figures(text))
            if new != text:
                old_lines, new_lines = text.splitlines(), new.splitlines()
                where = next((i for i, (a, b) in enumerate(zip(old_lines, new_lines), 1) if a != b),
                             min(len(old_lines), len(new_lines)) + 1)
                problems.append(f"{rel}:{where}: generated tables or figures are out of date; "
                                "run python experiments/report.py")
            problems += [f"{rel}:{line}: a line starts with a figure marker, which ends the paragraph on the site: "
                         "join it to the line before" for line in misplaced_markers(text)]
            for line, found in unmarked_figures(text):
                problems.append(f"{rel}:{line}: result-like number {found!r} typed by hand: make it a "
                                "<!-- fig EXPR --> of a committed result, or mark where it is quoted from "
                                "with <!-- from SOURCE -->")
        for p in problems:
            print(p, file=sys.stderr)
        listed = ", ".join(str(p.relative_to(committed.ROOT)) for p in targets)
        print(f"report check: {len(problems)} problem(s) in {len(committed.result_files())} results and "
              f"{len(targets)} pages ({count_figs} generated figures in prose): {listed}")
        return 1 if problems else 0
    for path, (text, new) in rendered.items():
        if new != text:
            path.write_text(new)
        print(f"{path.relative_to(committed.ROOT)}: {len(BLOCK.findall(text))} generated blocks, "
              f"{len(figures(text))} figures")
    return 0
