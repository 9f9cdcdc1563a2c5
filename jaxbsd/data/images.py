"""Image data sets: loading, stratified splits and batching (numpy only).

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

Decoding the CIFAR-10 image-folder zip takes seconds, so its decoded ``uint8`` arrays are cached
as an ``.npz`` in ``$JAXBSD_CACHE`` (default ``~/.cache/jaxbsd``), keyed by the zip's path, size
and mtime (``jaxbsd.data.cache``). A missing, truncated or malformed file raises
``FileNotFoundError`` or ``ValueError`` with the path and the format that was expected
(the readers are in ``jaxbsd.data.formats``).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Iterator

import numpy as np

from jaxbsd.data.formats import LOADERS, NUM_CLASSES, Raw
from jaxbsd.data.paths import DATA_ENV, data_dir

__all__ = ["DATASETS", "Dataset", "batches", "default_root", "load_dataset", "split_train_test"]

DATASETS = ("digits", "fashion-mnist", "mnist", "usps", "cifar10", "svhn")

_DEFAULT_TEST_FRACTION = 0.2

# Where each data set lives under the data directory $JAXBSD_DATA, and what it must hold.
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
        raw = LOADERS[name](path)

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
        num_classes=NUM_CLASSES,
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


def _load_digits() -> Raw:
    # Imported here: only this loader needs scikit-learn, and importing it takes about a second.
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]  # values 0..16 -> [0, 1]
    return images, digits.target.astype(np.int32), None, None
