"""The README is the short front door: at most 200 lines, the two set-up commands, and links
into the documentation site that lead somewhere."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _slug(heading: str) -> str:
    """The anchor GitHub and MkDocs give a heading: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", heading.strip().lower()))


def test_readme_is_short_and_keeps_the_setup_commands():
    assert len(README.splitlines()) <= 200
    # a terminal or editor shows a source line raw: none over 200 characters (generated tables included)
    assert [i for i, line in enumerate(README.splitlines(), 1) if len(line) > 200] == []
    # .ci/run and the release hook look for these exact commands.
    assert "pip install -e . && jaxbsd compress" in README
    assert 'pip install -e ".[test]" && python -m pytest -q -n 2' in README
    assert 'pip install -e ".[test]" && python -m pytest -q -n 2' in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("target", sorted(set(re.findall(r"\]\(((?!https?:)[^)]+)\)", README))))
def test_readme_links_lead_somewhere(target):
    path, _, anchor = target.partition("#")
    assert (ROOT / path).exists(), f"README links to missing {path}"
    if anchor:
        headings = re.findall(r"^#+ (.+)$", (ROOT / path).read_text(), flags=re.M)
        assert anchor in {_slug(h.replace("`", "")) for h in headings}, f"no heading #{anchor} in {path}"
