"""File-format readers of the image data sets, each returning a :data:`Raw` split.

IDX gz (MNIST, Fashion-MNIST), HDF5 (USPS), CIFAR-10 python pickle batches or image folders
(``train|test/<class>/*`` in a directory or a zip), MATLAB v5 (SVHN). :data:`LOADERS` maps each
data set that is read from a ``root`` to its reader. A missing, truncated or malformed file raises
``FileNotFoundError`` or ``ValueError`` with the path and the format that was expected. The
decoded arrays of an image-folder zip are cached (``jaxbsd.data.cache``).
"""

from __future__ import annotations

import codecs
import gzip
import io
import pathlib
import pickle
import struct
import zipfile
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxbsd.data.cache import cache_path, read_cache, write_cache

__all__ = ["CIFAR10_CLASSES", "LOADERS", "NUM_CLASSES", "Raw"]

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

#: Every image data set here has the ten classes 0..9.
NUM_CLASSES = 10

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

# A raw split: (train_images, train_labels, test_images, test_labels). Images are NHWC uint8
# (0..255) or float32 already in [0, 1]. test_* is None when the source has no official split.
Raw = tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]


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
    if labels.size and labels.max() >= NUM_CLASSES:
        raise ValueError(
            f"{labels_path}: label {labels.max()}; expected labels 0..{NUM_CLASSES - 1}"
        )
    return images[..., None], labels.astype(np.int32)


def _load_idx_dir(root: pathlib.Path) -> Raw:
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


def _load_usps(root: pathlib.Path) -> Raw:
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
                    not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= NUM_CLASSES
                ):
                    raise ValueError(
                        f"{path}: '{split}/target' must hold integers 0..9; {expected}"
                    )
                out += [x.reshape(-1, 16, 16, 1), y.astype(np.int32)]
    except OSError as err:  # not HDF5, truncated, unreadable
        raise ValueError(f"{path}: cannot read as HDF5 ({err}); {expected}") from err
    return out[0], out[1], out[2], out[3]


# -------------------- CIFAR-10


def _load_cifar10(root: pathlib.Path) -> Raw:
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
    if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise ValueError(f"{path}: labels outside 0..9; {expected}")
    # Each row is three 32x32 planes (R, G, B), each row-major: (N, C, H, W) -> NHWC.
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels.astype(np.int32)


def _load_cifar_pickles(root: pathlib.Path) -> Raw:
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


def _load_image_folder_dir(root: pathlib.Path) -> Raw:
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


def _cached_image_zip(path: pathlib.Path) -> Raw:
    cache = cache_path(path)
    arrays = read_cache(cache)
    if arrays is None:
        arrays = _decode_image_zip(path)
        write_cache(cache, arrays)
    return arrays["train_x"], arrays["train_y"], arrays["test_x"], arrays["test_y"]


# -------------------- SVHN (MATLAB v5)


def _load_svhn(root: pathlib.Path) -> Raw:
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


#: The reader of each data set that is read from a root (file or directory).
LOADERS: dict[str, Callable[[pathlib.Path], Raw]] = {
    "fashion-mnist": _load_idx_dir,
    "mnist": _load_idx_dir,
    "usps": _load_usps,
    "cifar10": _load_cifar10,
    "svhn": _load_svhn,
}
