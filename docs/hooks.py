"""MkDocs hook: the result plots in ``experiments/results/*.png`` become ``plots/<name>.png`` of the
site, so the results page can show them without copies of the binary files under ``docs/``."""

from __future__ import annotations

import pathlib

from mkdocs.structure.files import File

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "results"


def on_files(files, config):
    for png in sorted(RESULTS.glob("*.png")):
        files.append(File.generated(config, f"plots/{png.name}", abs_src_path=str(png)))
    return files
