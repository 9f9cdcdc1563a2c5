"""The character-level text data sets: ``pystdlib``, the CPython 3.11 standard library (numpy only).

``$JAXBSD_DATA/text/python-3.11-stdlib.txt.gz`` (:func:`load_text_dataset`): character ids of a
fixed vocabulary (:class:`CharVocab`: printable ASCII, newline, tab, one unknown id), split by
module by a hash of the module name (:func:`module_split`: 80 / 10 / 10 % of the modules), cut
into windows of the model's context (:func:`text_windows`, :func:`eval_windows`). Nothing is
downloaded; a missing or malformed file raises ``FileNotFoundError`` or ``ValueError`` naming the
path and the format that was expected.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import os
import pathlib
import re
import zlib

import numpy as np

from jaxbsd.data.paths import DATA_ENV, data_dir

__all__ = [
    "CharVocab",
    "TEXT_DATASETS",
    "TEXT_SPLITS",
    "TEXT_SPLIT_FRACTIONS",
    "TextDataset",
    "default_text_root",
    "eval_windows",
    "load_text_dataset",
    "module_split",
    "parse_modules",
    "text_windows",
]

#: Text data sets (:func:`load_text_dataset`); separate from the image ``DATASETS``.
TEXT_DATASETS = ("pystdlib",)

# Where each text data set lives under $JAXBSD_DATA.
_TEXT_NAMES = {"pystdlib": "text/python-3.11-stdlib.txt.gz"}
_PYSTDLIB_FORMAT = (
    "a gzip UTF-8 text of Python modules, each preceded by a line '# ==== <name>.py ===='"
)
_MODULE_HEADER = re.compile(r"^# ==== (?P<name>[^\n]+)\.py ====\n", re.MULTILINE)

#: Split of the modules, by the hash of their name: (train, validation, test) fractions.
TEXT_SPLIT_FRACTIONS = (0.8, 0.1, 0.1)
TEXT_SPLITS = ("train", "validation", "test")


class CharVocab:
    """A fixed character vocabulary: printable ASCII, newline and tab, and one unknown id.

    ids: 0 = unknown, 1 = ``"\\n"``, 2 = ``"\\t"``, 3..97 = ``" "`` .. ``"~"`` (code points 32..126),
    so ``size`` is 98. The table does not depend on any data, so no split leaks into it. Every
    other character (non-ASCII, other control characters: 90 of the 4.70 M characters of the
    ``pystdlib`` corpus, in 12 modules) is encoded as id 0, which decodes to ``unknown``
    (U+FFFD): it is a symbol the model must predict like any other, and bits per character count
    it as one character. ``decode(encode(s)) == s`` for every string of known characters.
    """

    UNKNOWN = 0
    #: the characters of ids 1..size-1, in order.
    CHARS = "\n\t" + "".join(chr(c) for c in range(32, 127))

    def __init__(self, unknown: str = "\ufffd"):
        if not isinstance(unknown, str) or len(unknown) != 1:
            raise ValueError(f"unknown: expected one character, got {unknown!r}")
        self.unknown = unknown
        self._ids = np.zeros(128, np.uint8)  # code point < 128 -> id; the rest is unknown
        for i, ch in enumerate(self.CHARS, start=1):
            self._ids[ord(ch)] = i
        self._chars = np.array([unknown, *self.CHARS])

    @property
    def size(self) -> int:
        """Number of ids (98)."""
        return len(self.CHARS) + 1

    def encode(self, text: str) -> np.ndarray:
        """``str`` of length N → ``(N,)`` uint8 ids (unknown characters → 0)."""
        if not isinstance(text, str):
            raise ValueError(f"text: expected a str, got {type(text).__name__}")
        points = np.frombuffer(text.encode("utf-32-le"), np.uint32)
        ids = self._ids[np.minimum(points, 127)]
        ids[points > 127] = self.UNKNOWN
        return ids

    def decode(self, ids) -> str:
        """``(N,)`` integer ids in ``[0, size)`` → ``str`` of length N."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"ids: expected a 1-D integer array, got {ids.shape} {ids.dtype}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.size):
            raise ValueError(f"ids: expected values in [0, {self.size}), got {ids.min()}..{ids.max()}")
        return "".join(self._chars[ids].tolist())


# eq=False: numpy arrays have no boolean ==, so data sets compare by identity.
@dataclasses.dataclass(frozen=True, eq=False)
class TextDataset:
    """A character-level text data set split by module.

    Attributes:
        name: one of ``TEXT_DATASETS``.
        vocab: the :class:`CharVocab` the ids come from.
        train, validation, test: ``(N,)`` uint8 id streams, the split's modules concatenated in
            corpus order, each with its ``# ==== name.py ====`` header line.
        modules: split name → the tuple of its module names, in corpus order.
    """

    name: str
    vocab: CharVocab
    train: np.ndarray
    validation: np.ndarray
    test: np.ndarray
    modules: dict

    def __post_init__(self) -> None:
        for split in TEXT_SPLITS:
            ids = getattr(self, split)
            if ids.ndim != 1 or ids.dtype != np.uint8:
                raise ValueError(f"{split}: expected an (N,) uint8 id stream, got {ids.shape} {ids.dtype}")
            if ids.size and ids.max() >= self.vocab.size:
                raise ValueError(f"{split}: ids must lie in [0, {self.vocab.size})")

    def split(self, name: str) -> np.ndarray:
        """The id stream of split ``name`` (``"train"``, ``"validation"`` or ``"test"``)."""
        if name not in TEXT_SPLITS:
            raise ValueError(f"split: expected one of {TEXT_SPLITS}, got {name!r}")
        return getattr(self, name)


def module_split(name: str) -> str:
    """The split of module ``name`` (``"abc"`` for ``abc.py``): ``"train"``, ``"validation"`` or ``"test"``.

    ``u`` = the first 8 bytes of SHA-256(name, UTF-8) as a big-endian integer over 2^64, uniform in
    [0, 1): train if ``u < 0.8``, validation if ``u < 0.9``, test otherwise. It depends on the name
    alone, so it is deterministic, needs no seed, and a module keeps its split when others are
    added or removed. On the 168 modules of the ``pystdlib`` corpus: 133 / 15 / 20 modules,
    78.7 % / 8.1 % / 13.2 % of the characters.
    """
    u = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") / 2.0**64
    train, validation, _ = TEXT_SPLIT_FRACTIONS
    return "train" if u < train else "validation" if u < train + validation else "test"


def parse_modules(text: str, where: str = "text") -> list[tuple[str, str]]:
    """``(name, text)`` per module of a corpus of ``# ==== <name>.py ====`` sections, in order.

    Each module's text starts with its header line. ``ValueError`` (naming ``where``) when the
    text does not start with a header or a module name repeats.
    """
    starts = list(_MODULE_HEADER.finditer(text))
    if not starts or starts[0].start() != 0:
        raise ValueError(f"{where}: expected {_PYSTDLIB_FORMAT}; the text does not start with one")
    out = []
    for match, after in zip(starts, starts[1:] + [None], strict=True):
        out.append((match["name"], text[match.start() : len(text) if after is None else after.start()]))
    names = [name for name, _ in out]
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: module names repeat; expected {_PYSTDLIB_FORMAT}")
    return out


def default_text_root(name: str) -> pathlib.Path | None:
    """``$JAXBSD_DATA/text/python-3.11-stdlib.txt.gz`` for ``pystdlib`` (None when unset)."""
    if name not in TEXT_DATASETS:
        raise ValueError(f"unknown text dataset {name!r}; expected one of {TEXT_DATASETS}")
    base = data_dir()
    return None if base is None else base / _TEXT_NAMES[name]


def load_text_dataset(
    name: str = "pystdlib",
    root: str | os.PathLike[str] | None = None,
    *,
    limit: int | None = None,
) -> TextDataset:
    """Load a character-level text data set, split by module (see :func:`module_split`).

    Args:
        name: one of ``TEXT_DATASETS``.
        root: the corpus file (default :func:`default_text_root`, under ``$JAXBSD_DATA``).
        limit: keep only the first ``limit`` characters of each split (for quick runs).

    Raises:
        FileNotFoundError: the file is missing (the message names the path).
        ValueError: unknown name, bad ``limit``, or a file that is not gzip UTF-8 text of modules.
    """
    if name not in TEXT_DATASETS:
        raise ValueError(f"unknown text dataset {name!r}; expected one of {TEXT_DATASETS}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit: expected None or a positive int, got {limit!r}")
    path = pathlib.Path(root) if root is not None else default_text_root(name)
    if path is None:
        raise FileNotFoundError(
            f"{name}: no data location: {DATA_ENV} is not set; set it to a directory holding "
            f"{_TEXT_NAMES[name]} ({_PYSTDLIB_FORMAT}), or pass root= (jaxbsd train --data-root PATH)"
        )
    if not path.is_file():
        raise FileNotFoundError(f"{name}: {path} does not exist; expected {_PYSTDLIB_FORMAT}")
    try:
        with gzip.open(path, "rt", encoding="utf-8", newline="") as f:
            text = f.read()
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as err:
        raise ValueError(f"{path}: cannot read ({err}); expected {_PYSTDLIB_FORMAT}") from err
    vocab = CharVocab()
    pieces: dict[str, list[str]] = {split: [] for split in TEXT_SPLITS}
    modules: dict[str, list[str]] = {split: [] for split in TEXT_SPLITS}
    for module, body in parse_modules(text, str(path)):
        split = module_split(module)
        pieces[split].append(body)
        modules[split].append(module)
    streams = {}
    for split in TEXT_SPLITS:
        ids = vocab.encode("".join(pieces[split]))
        streams[split] = ids[:limit] if limit is not None else ids
    return TextDataset(name=name, vocab=vocab, **streams,
                       modules={split: tuple(names) for split, names in modules.items()})


def text_windows(ids: np.ndarray, context: int, *, offset: int = 0) -> np.ndarray:
    """Non-overlapping training windows of ``context + 1`` ids: ``(N,) -> (W, context + 1)``.

    Window ``w`` is ``ids[offset + w·context : offset + (w+1)·context + 1]`` (inputs are its first
    ``context`` ids, targets its last ``context``; consecutive windows share one id, so every id
    after ``offset`` is a target exactly once). A tail too short for a window is dropped. Training
    draws a fresh ``offset`` in ``[0, context)`` every epoch, so window boundaries move.
    """
    ids = np.asarray(ids)
    if ids.ndim != 1:
        raise ValueError(f"ids: expected a 1-D array, got shape {ids.shape}")
    if isinstance(context, bool) or not isinstance(context, int | np.integer) or context < 1:
        raise ValueError(f"context: expected a positive int, got {context!r}")
    if isinstance(offset, bool) or not isinstance(offset, int | np.integer) or offset < 0:
        raise ValueError(f"offset: expected a non-negative int, got {offset!r}")
    count = max((len(ids) - offset - 1) // context, 0)
    starts = offset + context * np.arange(count)
    return ids[starts[:, None] + np.arange(context + 1)[None, :]]


def eval_windows(ids: np.ndarray, context: int, stride: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Windows that score every id of ``ids`` after the first exactly once.

    Windows of ``context + 1`` ids start every ``stride`` ids (default ``context``: no overlap);
    in each, only targets not scored by an earlier window count, so with ``stride < context``
    every target but those of the first window sees at least ``context − stride`` ids of context.
    The last window is aligned to the end; a stream shorter than a window is padded with id 0,
    masked out.

    Returns:
        ``(windows, mask)``: ``(W, context + 1)`` ids and ``(W, context)`` bool, the targets
        (``windows[:, 1:]``) that count. ``mask.sum() == len(ids) - 1``.
    """
    ids = np.asarray(ids)
    if ids.ndim != 1 or len(ids) < 2:
        raise ValueError(f"ids: expected a 1-D array of at least 2 ids, got shape {ids.shape}")
    if isinstance(context, bool) or not isinstance(context, int | np.integer) or context < 1:
        raise ValueError(f"context: expected a positive int, got {context!r}")
    stride = context if stride is None else stride
    if isinstance(stride, bool) or not isinstance(stride, int | np.integer) or not 1 <= stride <= context:
        raise ValueError(f"stride: expected an int in [1, context={context}], got {stride!r}")
    n = len(ids)
    if n < context + 1:
        window = np.zeros(context + 1, ids.dtype)
        window[:n] = ids
        return window[None, :], (np.arange(context) < n - 1)[None, :]
    last = n - context - 1
    starts = np.arange(0, last + 1, stride)
    if starts[-1] != last:
        starts = np.append(starts, last)
    windows = ids[starts[:, None] + np.arange(context + 1)[None, :]]
    # Window at s predicts targets s+1..s+context; count those beyond the previous window's end.
    prev_end = np.concatenate([[0], starts[:-1] + context])  # last target index already scored
    target_index = starts[:, None] + 1 + np.arange(context)[None, :]
    return windows, target_index > prev_end[:, None]
