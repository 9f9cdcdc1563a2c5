"""Writers of every image data set's file format, for the tests of jaxbsd.data: small files written
in that exact format (IDX gz, HDF5, CIFAR-10 pickle batches, image folders and zips, MATLAB v5)."""

from __future__ import annotations

import gzip
import io
import pathlib
import pickle
import re
import struct
import zipfile

import h5py
import numpy as np
import scipy.io
from PIL import Image


def path_pattern(path: pathlib.Path) -> str:
    return re.escape(str(path))


def float64_channel_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # numpy's float32 std over several axes is inaccurate for big arrays: compute in float64.
    x = x.astype(np.float64)
    return x.mean(axis=(0, 1, 2)), x.std(axis=(0, 1, 2))


def random_images(rng, n, h, w, c=None) -> np.ndarray:
    shape = (n, h, w) if c is None else (n, h, w, c)
    return rng.integers(0, 256, shape, dtype=np.uint8)



# -------------------- writers of each format


def write_idx(path: pathlib.Path, array: np.ndarray, magic: int | None = None) -> pathlib.Path:
    """An IDX gz file of unsigned bytes; magic defaults to 0x0800 + ndim (2051 or 2049)."""
    array = np.asarray(array, np.uint8)
    magic = 0x0800 + array.ndim if magic is None else magic
    header = struct.pack(">i", magic) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.tobytes())
    return path


def make_idx_dir(root: pathlib.Path, rng, n_train=30, n_test=20, train=True, size=6):
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    splits = ("train", "t10k") if train else ("t10k",)
    for prefix, n in zip(splits, (n_train, n_test) if train else (n_test,), strict=True):
        x = random_images(rng, n, size, size)
        y = np.arange(n) % 10
        write_idx(root / f"{prefix}-images-idx3-ubyte.gz", x)
        write_idx(root / f"{prefix}-labels-idx1-ubyte.gz", y)
        out[prefix] = (x, y)
    return out


def write_usps(path: pathlib.Path, rng, n_train=25, n_test=15) -> dict:
    out = {}
    with h5py.File(path, "w") as f:
        for split, n in (("train", n_train), ("test", n_test)):
            x = rng.random((n, 256), dtype=np.float32)
            y = (np.arange(n) % 10).astype(np.int32)
            f.create_dataset(f"{split}/data", data=x)
            f.create_dataset(f"{split}/target", data=y)
            out[split] = (x, y)
    return out


def write_cifar_pickles(root: pathlib.Path, rng, per_batch=4, n_test=6, protocol=None) -> dict:
    """A cifar-10-batches-py directory; images (N, 32, 32, 3) are stored as R, G, B planes."""
    root.mkdir(parents=True)
    out = {}
    for name, n in [(f"data_batch_{i}", per_batch) for i in range(1, 6)] + [("test_batch", n_test)]:
        x = random_images(rng, n, 32, 32, 3)
        y = list(rng.integers(0, 10, n))
        batch = {
            b"data": x.transpose(0, 3, 1, 2).reshape(n, 3072),
            b"labels": [int(v) for v in y],
            b"batch_label": name.encode(),
        }
        (root / name).write_bytes(pickle.dumps(batch, protocol=protocol))
        out[name] = (x, np.asarray(y))
    return out


def encode_image(pixels: np.ndarray, fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt)
    return buf.getvalue()


def image_folder_files(rng, layout: dict, fmt="PNG", size=32) -> dict[str, np.ndarray]:
    """{member path: pixels} for layout {split: {class: count}}."""
    ext = {"PNG": "png", "JPEG": "jpg"}[fmt]
    return {
        f"{split}/{cls}/{i:04d}.{ext}": random_images(rng, 1, size, size, 3)[0]
        for split, classes in layout.items()
        for cls, count in classes.items()
        for i in range(count)
    }


def write_image_zip(path: pathlib.Path, files: dict[str, np.ndarray], fmt="PNG") -> pathlib.Path:
    with zipfile.ZipFile(path, "w") as z:
        for member, pixels in files.items():
            z.writestr(member, encode_image(pixels, fmt))
    return path


def write_svhn(root: pathlib.Path, rng, n_train=12, n_test=8, **overrides) -> dict:
    """train_32x32.mat / test_32x32.mat as SVHN ships them: X (32, 32, 3, N), y (N, 1) in 1..10."""
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    for split, n in (("train", n_train), ("test", n_test)):
        x = random_images(rng, n, 32, 32, 3)  # NHWC
        y = (np.arange(n) % 10 + 1).astype(np.uint8)  # 1..10; 10 is digit 0
        mat = {"X": x.transpose(1, 2, 3, 0), "y": y[:, None]} | overrides
        scipy.io.savemat(root / f"{split}_32x32.mat", mat, format="5")
        out[split] = (x, y)
    return out
