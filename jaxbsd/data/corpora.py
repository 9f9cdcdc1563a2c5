"""The sentence-encoder corpus: the Python 3.11 documentation's reST sources (English text).

``$JAXBSD_DATA/text/python-3.11-docs-rst.tar.gz`` (:func:`load_docs_corpus`), split by file into
calibration and evaluation (:func:`docs_file_split`); :func:`rst_passages` cuts a file into prose
paragraphs and :func:`rst_heading_pairs` into ``(heading, first paragraph)`` pairs.

The package ships those passages and pairs (not the archive) as ``docs-passages.json.xz`` (about
0.7 MB): :func:`docs_texts` reads the archive where ``$JAXBSD_DATA`` is set and the shipped copy
otherwise, the same texts either way (a test compares them), so ``jaxbsd compress-hf`` runs
wherever jaxbsd is installed. :func:`load_docs_corpus` (the experiments' reader) still needs the archive.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.resources
import os
import pathlib
import re
import zlib

from jaxbsd.data.paths import DATA_ENV, data_dir

__all__ = [
    "DOCS_CALIBRATION_FRACTION",
    "DOCS_SPLITS",
    "DocsCorpus",
    "PackagedDocs",
    "DOCS_SOURCE",
    "docs_texts",
    "docs_passages_payload",
    "docs_file_split",
    "load_docs_corpus",
    "rst_heading_pairs",
    "rst_passages",
]

_DOCS_NAME = "text/python-3.11-docs-rst.tar.gz"
_PACKAGED = importlib.resources.files("jaxbsd.data") / "docs-passages.json.xz"
#: Where the docs texts come from, in words (reports name it).
DOCS_SOURCE = "the Python 3.11 documentation (reST sources of Debian's python3.11-doc 3.11.2)"
_DOCS_FORMAT = "a tar.gz of the Python 3.11 documentation's reST sources (_sources/**/*.rst.txt, UTF-8)"
#: The two splits of the docs corpus: calibration (compression) and evaluation (fidelity).
DOCS_SPLITS = ("calibration", "evaluation")
#: Share of the files in the calibration split.
DOCS_CALIBRATION_FRACTION = 0.4
_ADORNMENT = re.compile(r"^([=\-~^\"'*+#`:._])\1{2,}\s*$")
_ROLE = re.compile(r":[\w:.+-]+:`(?:[^`<]*<)?~?!?([^`>]*)>?`")


def docs_file_split(name: str) -> str:
    """The split of a docs file (its path in the archive): ``"calibration"`` or ``"evaluation"``.

    ``u`` = the first 8 bytes of SHA-256(name) over 2^64; calibration if ``u <``
    :data:`DOCS_CALIBRATION_FRACTION`. By file, never by paragraph: no text of an evaluation file is
    ever seen in calibration, and a file keeps its split whatever else the archive holds.
    """
    u = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") / 2.0**64
    return "calibration" if u < DOCS_CALIBRATION_FRACTION else "evaluation"


@dataclasses.dataclass(frozen=True)
class DocsCorpus:
    """The docs corpus split by file.

    Attributes:
        files: split name → tuple of ``(path in the archive, text)``, in archive order.
    """

    files: dict

    def passages(self, split: str, *, min_chars: int = 80) -> list[str]:
        """The prose paragraphs of every file of ``split`` (:func:`rst_passages`), in order."""
        return [p for _, text in self._split(split) for p in rst_passages(text, min_chars=min_chars)]

    def pairs(self, split: str) -> list[tuple[str, str]]:
        """``(heading, first paragraph)`` of every section of ``split`` (:func:`rst_heading_pairs`),
        keeping only headings that occur once in the split (case-insensitive), so a title names one
        section."""
        pairs = [p for _, text in self._split(split) for p in rst_heading_pairs(text)]
        counts: dict[str, int] = {}
        for title, _ in pairs:
            counts[title.lower()] = counts.get(title.lower(), 0) + 1
        return [(t, d) for t, d in pairs if counts[t.lower()] == 1]

    def _split(self, split: str):
        if split not in DOCS_SPLITS:
            raise ValueError(f"split: expected one of {DOCS_SPLITS}, got {split!r}")
        return self.files[split]


def _clean_rst(text: str) -> str:
    """Inline markup to plain words: roles to their text, literals and emphasis unmarked."""
    text = _ROLE.sub(lambda m: m.group(1), text)
    text = re.sub(r"`([^`]*?)(?:\s*<[^>]*>)?`_{0,2}", r"\1", text)
    text = text.replace("``", "").replace("**", "").replace("\\", "")
    return " ".join(text.split())


def _blocks(text: str) -> list[list[str]]:
    out, block = [], []
    for line in text.splitlines():
        if line.strip():
            block.append(line.rstrip())
        elif block:
            out.append(block)
            block = []
    if block:
        out.append(block)
    return out


def _is_prose(block: list[str], min_chars: int) -> bool:
    first = block[0]
    if first[:1].isspace() or first.startswith((".. ", "..", "::", "+-", "|", ">>>", "* ", "- ", "#.")):
        return False
    if any(_ADORNMENT.match(line) for line in block):  # a heading or a table
        return False
    return len(" ".join(block)) >= min_chars


def rst_passages(text: str, *, min_chars: int = 80) -> list[str]:
    """The prose paragraphs of a reST file: blank-line separated blocks that start unindented, are
    no directive, comment, literal block, table, list or heading, and hold at least ``min_chars``
    characters; inline markup is reduced to its words and lines are joined."""
    return [_clean_rst(" ".join(b)) for b in _blocks(text) if _is_prose(b, min_chars)]


def rst_heading_pairs(text: str, *, min_chars: int = 40) -> list[tuple[str, str]]:
    """``(heading, first paragraph)`` for every section of a reST file whose first block after the
    heading (directives such as ``.. index::`` skipped) is a prose paragraph (:func:`rst_passages`'
    rule, ``min_chars``). A heading is a line underlined (and optionally overlined) by a repeated
    punctuation character at least as long as its text."""
    lines = text.splitlines()
    pairs = []
    i = 0
    while i + 1 < len(lines):
        title, under = lines[i].strip(), lines[i + 1]
        if (title and not _ADORNMENT.match(lines[i]) and _ADORNMENT.match(under)
                and len(under.strip()) >= len(title) and not lines[i][:1].isspace()):
            j = i + 2
            rest = "\n".join(lines[j:])
            for block in _blocks(rest):
                if block[0].startswith("..") or block[0][:1].isspace():  # a directive, or its indented body
                    continue
                if _ADORNMENT.match(block[0]) and len(block) == 1:  # an overline
                    break
                if len(block) >= 2 and _ADORNMENT.match(block[1]):  # the next heading: no paragraph
                    break
                if _clean_rst(" ".join(block)).startswith("Source code:"):  # the library pages' source link
                    continue
                if _is_prose(block, min_chars):
                    pairs.append((_clean_rst(title), _clean_rst(" ".join(block))))
                break
            i += 2
            continue
        i += 1
    return pairs


def load_docs_corpus(root: str | os.PathLike[str] | None = None) -> DocsCorpus:
    """Read the docs corpus (``$JAXBSD_DATA/text/python-3.11-docs-rst.tar.gz`` by default), split by
    file (:func:`docs_file_split`).

    Raises:
        FileNotFoundError: the archive is missing (the message names the path).
        ValueError: it is not a readable tar.gz of UTF-8 ``.rst.txt`` files.
    """
    import tarfile

    if root is None:
        base = data_dir()
        if base is None:
            raise FileNotFoundError(f"docs corpus: {DATA_ENV} is not set; set it to a directory holding "
                                    f"{_DOCS_NAME}, or pass root=")
        path = base / _DOCS_NAME
    else:
        path = pathlib.Path(root)
    if not path.is_file():
        raise FileNotFoundError(f"docs corpus: {path} does not exist; expected {_DOCS_FORMAT}")
    files: dict[str, list] = {split: [] for split in DOCS_SPLITS}
    try:
        with tarfile.open(path, "r:gz") as archive:
            for member in archive:
                if not (member.isfile() and member.name.endswith(".rst.txt")):
                    continue
                text = archive.extractfile(member).read().decode("utf-8")
                files[docs_file_split(member.name)].append((member.name, text))
    except (OSError, EOFError, tarfile.TarError, UnicodeDecodeError, zlib.error) as err:
        raise ValueError(f"{path}: cannot read ({err}); expected {_DOCS_FORMAT}") from err
    if not any(files.values()):
        raise ValueError(f"{path}: no .rst.txt files; expected {_DOCS_FORMAT}")
    return DocsCorpus({split: tuple(v) for split, v in files.items()})


@dataclasses.dataclass(frozen=True)
class PackagedDocs:
    """The docs corpus's passages and pairs as the package ships them (``docs-passages.json.xz``):
    what :meth:`DocsCorpus.passages` (default ``min_chars``) and :meth:`DocsCorpus.pairs` give.

    Attributes:
        splits: split name → ``{"passages": [...], "pairs": [[title, text], ...]}``.
        archive_sha256: SHA-256 of the archive they were cut from.
    """

    splits: dict
    archive_sha256: str

    def passages(self, split: str) -> list[str]:
        """The prose paragraphs of ``split``, as :meth:`DocsCorpus.passages` gives them."""
        return list(self._split(split)["passages"])

    def pairs(self, split: str) -> list[tuple[str, str]]:
        """The ``(heading, first paragraph)`` pairs of ``split``, as :meth:`DocsCorpus.pairs` gives them."""
        return [(t, d) for t, d in self._split(split)["pairs"]]

    def _split(self, split: str) -> dict:
        if split not in DOCS_SPLITS:
            raise ValueError(f"split: expected one of {DOCS_SPLITS}, got {split!r}")
        return self.splits[split]


def docs_passages_payload(corpus: DocsCorpus, archive_sha256: str) -> dict:
    """What ``docs-passages.json.xz`` holds for ``corpus`` (JSON data). To write it again:
    ``lzma.compress(json.dumps(payload, ensure_ascii=False).encode(), preset=9)``."""
    return {"source": DOCS_SOURCE, "archive": _DOCS_NAME, "archive_sha256": archive_sha256,
            "splits": {s: {"passages": corpus.passages(s), "pairs": [list(p) for p in corpus.pairs(s)]}
                       for s in DOCS_SPLITS}}


def docs_texts() -> DocsCorpus | PackagedDocs:
    """The docs corpus's passages and pairs (``.passages(split)``, ``.pairs(split)``): read from the
    archive (:func:`load_docs_corpus`) where ``$JAXBSD_DATA`` is set, else the copy the package ships.

    Raises:
        FileNotFoundError: ``$JAXBSD_DATA`` is set and lacks the archive, or (unset) the package
            was installed without its ``docs-passages.json.xz``.
    """
    import json
    import lzma

    if data_dir() is not None:
        return load_docs_corpus()
    if not _PACKAGED.is_file():
        raise FileNotFoundError(f"docs corpus: {DATA_ENV} is not set and {_PACKAGED} is missing (reinstall "
                                f"jaxbsd, or set {DATA_ENV} to a directory holding {_DOCS_NAME})")
    payload = json.loads(lzma.decompress(_PACKAGED.read_bytes()).decode("utf-8"))
    return PackagedDocs(payload["splits"], payload["archive_sha256"])
