"""Tests of jaxbsd.data: every format on small files written here in that exact format, and
the real copies that exist on this machine (USPS, the MNIST test split, digits, Fashion-MNIST
when installed, and the CIFAR-10 JPEG zip as a slow test)."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pathlib
import pickle
import re
import struct
import time
import zipfile

import h5py
import numpy as np
import pytest
import scipy.io
from PIL import Image

from jaxbsd import data
from jaxbsd.data import Dataset, batches, default_root, formats, load_dataset, split_train_test

MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """No test reads or writes the user's cache; JAXBSD_DATA is as conftest.py set it."""
    monkeypatch.setenv("JAXBSD_CACHE", str(tmp_path / "cache"))


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


# -------------------- names and roots


def test_unknown_name_lists_datasets():
    with pytest.raises(ValueError, match="imagenet") as err:
        load_dataset("imagenet")
    for name in data.DATASETS:
        assert name in str(err.value)
    with pytest.raises(ValueError, match="cifar10"):
        default_root("imagenet")


def test_default_roots(monkeypatch, tmp_path):
    monkeypatch.setenv("JAXBSD_DATA", str(tmp_path))
    assert default_root("digits") is None
    assert default_root("usps") == tmp_path / "usps.h5"
    assert default_root("mnist") == tmp_path / "mnist-test"
    assert default_root("cifar10") == tmp_path / "cifar10-jpg.zip"
    assert default_root("svhn") == tmp_path / "svhn"
    assert default_root("fashion-mnist") == pathlib.Path("/usr/share/datasets/fashion-mnist")
    (tmp_path / "fashion-mnist").mkdir()
    assert default_root("fashion-mnist") == tmp_path / "fashion-mnist"
    # Unset: nothing is guessed from where the package is installed.
    monkeypatch.delenv("JAXBSD_DATA")
    for name in ("digits", "usps", "mnist", "cifar10", "svhn"):
        assert default_root(name) is None
    assert default_root("fashion-mnist") == pathlib.Path("/usr/share/datasets/fashion-mnist")


def test_no_path_guessed_from_the_package_location():
    sources = sorted(pathlib.Path(data.__file__).parent.glob("*.py"))
    assert len(sources) > 1  # the package's modules, not only its __init__
    for path in sources:
        source = path.read_text()
        assert "parents[" not in source and "__file__" not in source, path


@pytest.mark.parametrize("name, entry", [("usps", "usps.h5"), ("mnist", "mnist-test"),
                                         ("cifar10", "cifar10-jpg.zip"), ("svhn", "svhn")])
def test_missing_data_set_says_what_to_put_where(monkeypatch, tmp_path, name, entry):
    monkeypatch.setenv("JAXBSD_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError) as err:
        load_dataset(name)
    message = str(err.value)
    assert str(tmp_path / entry) in message and "JAXBSD_DATA" in message and "--data-root" in message
    monkeypatch.delenv("JAXBSD_DATA")
    with pytest.raises(FileNotFoundError, match="JAXBSD_DATA is not set") as err:
        load_dataset(name)
    assert entry in str(err.value)


def test_missing_mnist_names_its_files(monkeypatch, tmp_path):
    monkeypatch.setenv("JAXBSD_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="t10k-images-idx3-ubyte.gz"):
        load_dataset("mnist")


def test_jaxbsd_data_env_is_used_by_load_dataset(monkeypatch, tmp_path):
    written = write_usps(tmp_path / "usps.h5", np.random.default_rng(0))
    monkeypatch.setenv("JAXBSD_DATA", str(tmp_path))
    ds = load_dataset("usps", normalize=False)
    np.testing.assert_array_equal(ds.train_images.reshape(-1, 256), written["train"][0])


def test_svhn_needs_a_root_and_digits_takes_none(monkeypatch, tmp_path):
    monkeypatch.setenv("JAXBSD_DATA", str(tmp_path))  # no svhn/ there
    with pytest.raises(FileNotFoundError, match="root"):
        load_dataset("svhn")
    with pytest.raises(ValueError, match="root"):
        load_dataset("digits", "/somewhere")


# -------------------- IDX (MNIST, Fashion-MNIST)


def test_idx_full_layout(tmp_path):
    written = make_idx_dir(tmp_path / "mnist", np.random.default_rng(1))
    ds = load_dataset("mnist", tmp_path / "mnist", normalize=False)
    assert ds.train_images.shape == (30, 6, 6, 1) and ds.test_images.shape == (20, 6, 6, 1)
    assert ds.train_images.dtype == np.float32 and ds.train_labels.dtype == np.int32
    assert (ds.name, ds.image_size, ds.channels, ds.num_classes) == ("mnist", 6, 1, 10)
    # The official split keeps the file order and the pixel values (scaled to [0, 1]).
    np.testing.assert_allclose(ds.train_images[..., 0], written["train"][0] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(ds.train_labels, written["train"][1])
    np.testing.assert_allclose(ds.test_images[..., 0], written["t10k"][0] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(ds.test_labels, written["t10k"][1])


def test_idx_full_layout_rejects_test_fraction(tmp_path):
    make_idx_dir(tmp_path, np.random.default_rng(1))
    with pytest.raises(ValueError, match="official train/test split"):
        load_dataset("mnist", tmp_path, test_fraction=0.3)


def test_idx_test_only_layout_is_split_stratified(tmp_path):
    written = make_idx_dir(tmp_path, np.random.default_rng(2), n_test=200, train=False)
    ds = load_dataset("mnist", tmp_path, normalize=False, test_fraction=0.25, seed=3)
    assert len(ds.train_labels) == 150 and len(ds.test_labels) == 50
    np.testing.assert_array_equal(np.bincount(ds.test_labels, minlength=10), [5] * 10)
    # Together the two splits are exactly the 200 test images, each once.
    pooled = np.concatenate([ds.train_images, ds.test_images]).reshape(200, -1)
    original = (written["t10k"][0] / 255.0).astype(np.float32).reshape(200, -1)
    order = lambda a: a[np.lexsort(a.T[::-1])]  # noqa: E731 - sort rows to compare as multisets
    np.testing.assert_array_equal(order(pooled), order(original))


def test_idx_partial_train_files_are_an_error(tmp_path):
    make_idx_dir(tmp_path, np.random.default_rng(1))
    missing = tmp_path / "train-labels-idx1-ubyte.gz"
    missing.unlink()
    with pytest.raises(FileNotFoundError, match=path_pattern(missing)):
        load_dataset("mnist", tmp_path)


def test_idx_missing_directory_and_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=path_pattern(tmp_path / "nope")) as err:
        load_dataset("fashion-mnist", tmp_path / "nope")
    assert "t10k-images-idx3-ubyte.gz" in str(err.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        FileNotFoundError, match=path_pattern(tmp_path / "empty" / "t10k-images-idx3-ubyte.gz")
    ):
        load_dataset("mnist", tmp_path / "empty")


def test_idx_wrong_magic(tmp_path):
    make_idx_dir(tmp_path, np.random.default_rng(1))
    bad = write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", np.zeros((20, 6, 6)), magic=2049)
    with pytest.raises(ValueError, match=path_pattern(bad)) as err:
        load_dataset("mnist", tmp_path)
    assert "magic number 2049" in str(err.value) and "2051" in str(err.value)


def test_idx_truncated_gzip(tmp_path):
    make_idx_dir(tmp_path, np.random.default_rng(1))
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-30])
    with pytest.raises(ValueError, match=path_pattern(path)) as err:
        load_dataset("mnist", tmp_path)
    assert "gzip" in str(err.value)


def test_idx_not_gzip(tmp_path):
    make_idx_dir(tmp_path, np.random.default_rng(1))
    path = tmp_path / "t10k-labels-idx1-ubyte.gz"
    path.write_bytes(b"this is not gzip data")
    with pytest.raises(ValueError, match=path_pattern(path)):
        load_dataset("mnist", tmp_path)


def test_idx_byte_count_must_match_header(tmp_path):
    make_idx_dir(tmp_path, np.random.default_rng(1))
    path = tmp_path / "train-images-idx3-ubyte.gz"
    header = struct.pack(">iIII", 2051, 30, 6, 6)
    for n_bytes in (29 * 36, 30 * 36 + 1):  # one image short, one byte too many
        with gzip.open(path, "wb") as f:
            f.write(header + bytes(n_bytes))
        with pytest.raises(ValueError, match=path_pattern(path)) as err:
            load_dataset("mnist", tmp_path)
        assert "(30, 6, 6)" in str(err.value)


def test_idx_image_and_label_counts_must_agree(tmp_path):
    make_idx_dir(tmp_path, np.random.default_rng(1))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.arange(19) % 10)
    with pytest.raises(ValueError, match="19 labels"):
        load_dataset("mnist", tmp_path)


def test_idx_labels_out_of_range(tmp_path):
    make_idx_dir(tmp_path, np.random.default_rng(1))
    path = write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.full(20, 12))
    with pytest.raises(ValueError, match=path_pattern(path)):
        load_dataset("mnist", tmp_path)


# -------------------- USPS


def test_usps_file_or_directory(tmp_path):
    written = write_usps(tmp_path / "usps.h5", np.random.default_rng(4))
    for root in (tmp_path / "usps.h5", tmp_path):
        ds = load_dataset("usps", root, normalize=False)
        assert ds.train_images.shape == (25, 16, 16, 1) and ds.test_images.shape == (15, 16, 16, 1)
        # 256 values are a row-major 16x16 image.
        np.testing.assert_array_equal(ds.test_images[3, 2, 5, 0], written["test"][0][3, 2 * 16 + 5])
        np.testing.assert_array_equal(ds.train_labels, written["train"][1])


def test_usps_wrong_layout(tmp_path):
    path = tmp_path / "usps.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("training/data", data=np.zeros((3, 256), np.float32))
    with pytest.raises(ValueError, match=path_pattern(path)) as err:
        load_dataset("usps", path)
    assert "groups 'train' and 'test'" in str(err.value)


def test_usps_wrong_shape_and_range(tmp_path):
    path = tmp_path / "usps.h5"
    write_usps(path, np.random.default_rng(4))
    with h5py.File(path, "a") as f:
        del f["test/data"]
        f["test/data"] = np.zeros((15, 255), np.float32)
    with pytest.raises(ValueError, match=r"\(15, 255\)"):
        load_dataset("usps", path)
    with h5py.File(path, "a") as f:
        del f["test/data"]
        f["test/data"] = np.full((15, 256), 255.0, np.float32)  # 0..255, not [0, 1]
    with pytest.raises(ValueError, match=r"outside \[0, 1\]"):
        load_dataset("usps", path)


def test_usps_not_hdf5_and_missing(tmp_path):
    path = tmp_path / "usps.h5"
    path.write_text("not hdf5")
    with pytest.raises(ValueError, match=path_pattern(path)):
        load_dataset("usps", path)
    with pytest.raises(FileNotFoundError, match=path_pattern(tmp_path / "other" / "usps.h5")):
        load_dataset("usps", tmp_path / "other" / "usps.h5")


# -------------------- CIFAR-10 pickle batches


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_cifar_pickle_batches(tmp_path, protocol):
    root = tmp_path / "cifar-10-batches-py"
    written = write_cifar_pickles(root, np.random.default_rng(5), protocol=protocol)
    for where in (root, tmp_path):  # the batches directory or its parent
        ds = load_dataset("cifar10", where, normalize=False)
        assert ds.train_images.shape == (20, 32, 32, 3) and ds.test_images.shape == (6, 32, 32, 3)
        train_x = np.concatenate([written[f"data_batch_{i}"][0] for i in range(1, 6)])
        np.testing.assert_array_equal(np.rint(ds.train_images * 255).astype(np.uint8), train_x)
        np.testing.assert_array_equal(
            np.rint(ds.test_images * 255).astype(np.uint8), written["test_batch"][0]
        )
        np.testing.assert_array_equal(ds.test_labels, written["test_batch"][1])


def test_cifar_pickle_from_numpy1(tmp_path):
    """Batches written with numpy 1.x (the official files) name numpy.core.multiarray."""
    root = tmp_path / "cifar-10-batches-py"
    written = write_cifar_pickles(root, np.random.default_rng(5), protocol=2)
    path = root / "test_batch"
    blob = path.read_bytes()
    assert b"numpy._core.multiarray" in blob
    path.write_bytes(blob.replace(b"numpy._core.multiarray", b"numpy.core.multiarray"))
    ds = load_dataset("cifar10", root, normalize=False)
    np.testing.assert_array_equal(
        np.rint(ds.test_images * 255).astype(np.uint8), written["test_batch"][0]
    )


class _RunsCode:
    def __reduce__(self):
        return (os.getcwd, ())


def test_cifar_pickle_refuses_code(tmp_path):
    root = tmp_path / "cifar-10-batches-py"
    write_cifar_pickles(root, np.random.default_rng(5))
    path = root / "data_batch_3"
    path.write_bytes(pickle.dumps({b"data": _RunsCode(), b"labels": []}))
    with pytest.raises(ValueError, match=path_pattern(path)) as err:
        load_dataset("cifar10", root)
    assert "posix.getcwd" in str(err.value) or "nt.getcwd" in str(err.value)


def test_cifar_pickle_missing_and_corrupt(tmp_path):
    root = tmp_path / "cifar-10-batches-py"
    write_cifar_pickles(root, np.random.default_rng(5))
    (root / "data_batch_4").write_bytes((root / "data_batch_4").read_bytes()[:100])
    with pytest.raises(ValueError, match=path_pattern(root / "data_batch_4")):
        load_dataset("cifar10", root)
    (root / "data_batch_4").unlink()
    with pytest.raises(FileNotFoundError, match=path_pattern(root / "data_batch_4")):
        load_dataset("cifar10", root)
    with pytest.raises(FileNotFoundError, match=path_pattern(tmp_path / "missing")):
        load_dataset("cifar10", tmp_path / "missing")


def test_cifar_pickle_wrong_shape(tmp_path):
    root = tmp_path / "cifar-10-batches-py"
    write_cifar_pickles(root, np.random.default_rng(5))
    path = root / "test_batch"
    path.write_bytes(pickle.dumps({b"data": np.zeros((2, 3000), np.uint8), b"labels": [0, 1]}))
    with pytest.raises(ValueError, match=path_pattern(path)) as err:
        load_dataset("cifar10", root)
    assert "(N, 3072)" in str(err.value)


# -------------------- CIFAR-10 image folders


LAYOUT = {"train": {"truck": 2, "airplane": 3, "cat": 1}, "test": {"ship": 2, "dog": 1}}


def test_image_folder_zip_pixels_and_labels(tmp_path):
    files = image_folder_files(np.random.default_rng(6), LAYOUT)
    path = write_image_zip(tmp_path / "c.zip", files)
    ds = load_dataset("cifar10", path, normalize=False)
    assert ds.train_images.shape == (6, 32, 32, 3) and ds.test_images.shape == (3, 32, 32, 3)
    # Standard CIFAR-10 labels, classes interleaved round-robin, files in name order.
    np.testing.assert_array_equal(ds.train_labels, [0, 3, 9, 0, 9, 0])
    np.testing.assert_array_equal(ds.test_labels, [5, 8, 8])
    expected = [
        files[m]
        for m in (
            "train/airplane/0000.png",
            "train/cat/0000.png",
            "train/truck/0000.png",
            "train/airplane/0001.png",
            "train/truck/0001.png",
            "train/airplane/0002.png",
        )
    ]
    np.testing.assert_array_equal(
        np.rint(ds.train_images * 255).astype(np.uint8), np.stack(expected)
    )


def test_image_folder_directory_matches_zip(tmp_path):
    files = image_folder_files(np.random.default_rng(6), LAYOUT)
    for member, pixels in files.items():
        (tmp_path / "dir" / member).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "dir" / member).write_bytes(encode_image(pixels, "PNG"))
    from_dir = load_dataset("cifar10", tmp_path / "dir", normalize=False)
    from_zip = load_dataset("cifar10", write_image_zip(tmp_path / "c.zip", files), normalize=False)
    for field in ("train_images", "train_labels", "test_images", "test_labels"):
        np.testing.assert_array_equal(getattr(from_dir, field), getattr(from_zip, field))


def test_image_folder_jpeg(tmp_path):
    # Smooth images, so that JPEG's loss is small and a wrong channel order would show.
    ramp = np.linspace(0, 255, 32).astype(np.uint8)
    pixels = np.stack(np.broadcast_arrays(ramp[:, None], ramp[None, :], np.uint8(200)), axis=-1)
    files = {"train/bird/a.jpg": pixels, "test/frog/b.jpg": pixels[::-1]}
    ds = load_dataset(
        "cifar10", write_image_zip(tmp_path / "j.zip", files, "JPEG"), normalize=False
    )
    assert np.abs(ds.train_images[0] * 255 - pixels).max() < 12
    assert np.abs(ds.test_images[0] * 255 - pixels[::-1]).max() < 12
    np.testing.assert_array_equal(ds.train_labels, [2])
    np.testing.assert_array_equal(ds.test_labels, [6])


def test_image_folder_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    files = image_folder_files(np.random.default_rng(7), LAYOUT)
    path = write_image_zip(tmp_path / "c.zip", files)
    first = load_dataset("cifar10", path, normalize=False)
    written = list(cache.iterdir())
    assert len(written) == 1 and written[0].suffix == ".npz"  # no temporary file left behind

    def no_decoding(_):
        raise AssertionError("decoded although cached")

    with monkeypatch.context() as patched:
        patched.setattr(formats, "_decode_image_zip", no_decoding)
        second = load_dataset("cifar10", path, normalize=False)
    np.testing.assert_array_equal(first.train_images, second.train_images)
    np.testing.assert_array_equal(first.test_labels, second.test_labels)

    # A changed zip gets a new key, whether only its mtime or only its size changed.
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    load_dataset("cifar10", path, normalize=False)
    assert len(list(cache.iterdir())) == 2
    files = image_folder_files(
        np.random.default_rng(8), {"train": {"deer": 2}, "test": {"horse": 1}}
    )
    write_image_zip(path, files)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert path.stat().st_size != stat.st_size
    third = load_dataset("cifar10", path, normalize=False)
    np.testing.assert_array_equal(third.train_labels, [4, 4])
    assert len(list(cache.iterdir())) == 3


def test_image_folder_corrupt_cache_is_rebuilt(tmp_path):
    files = image_folder_files(np.random.default_rng(7), LAYOUT)
    path = write_image_zip(tmp_path / "c.zip", files)
    first = load_dataset("cifar10", path, normalize=False)
    (cached,) = (tmp_path / "cache").iterdir()
    cached.write_bytes(cached.read_bytes()[:500])
    with pytest.warns(UserWarning, match="ignoring unreadable cache"):
        second = load_dataset("cifar10", path, normalize=False)
    np.testing.assert_array_equal(first.train_images, second.train_images)
    with np.load(cached) as rebuilt:  # rewritten whole
        assert rebuilt["train_x"].shape == (6, 32, 32, 3)


def test_image_folder_unwritable_cache_still_loads(tmp_path, monkeypatch):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the cache directory should be")
    monkeypatch.setenv("JAXBSD_CACHE", str(blocker / "cache"))
    path = write_image_zip(tmp_path / "c.zip", image_folder_files(np.random.default_rng(7), LAYOUT))
    with pytest.warns(UserWarning, match="cannot write cache"):
        ds = load_dataset("cifar10", path)
    assert ds.train_images.shape == (6, 32, 32, 3)


def test_image_folder_corrupt_zip(tmp_path):
    path = write_image_zip(tmp_path / "c.zip", image_folder_files(np.random.default_rng(7), LAYOUT))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match=path_pattern(path)) as err:
        load_dataset("cifar10", path)
    assert "zip" in str(err.value)


def test_image_folder_corrupt_member(tmp_path):
    path = tmp_path / "c.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("train/cat/0.png", encode_image(np.zeros((32, 32, 3), np.uint8), "PNG"))
        z.writestr("test/cat/0.png", b"\x89PNG\r\n\x1a\n garbage")
    with pytest.raises(ValueError, match=path_pattern(path) + ".*test/cat/0.png"):
        load_dataset("cifar10", path)


def test_image_folder_wrong_size_and_unknown_class(tmp_path):
    files = image_folder_files(np.random.default_rng(7), LAYOUT, size=28)
    path = write_image_zip(tmp_path / "small.zip", files)
    with pytest.raises(ValueError, match="28x28, not 32x32"):
        load_dataset("cifar10", path)
    files = image_folder_files(np.random.default_rng(7), {"train": {"cow": 1}, "test": {"cat": 1}})
    path = write_image_zip(tmp_path / "cow.zip", files)
    with pytest.raises(ValueError, match=path_pattern(path) + ".*'cow'.*airplane"):
        load_dataset("cifar10", path)


def test_image_folder_needs_both_splits(tmp_path):
    path = write_image_zip(
        tmp_path / "c.zip", image_folder_files(np.random.default_rng(7), {"train": {"cat": 2}})
    )
    with pytest.raises(ValueError, match=path_pattern(path) + ".*no test/"):
        load_dataset("cifar10", path)


# -------------------- SVHN


def test_svhn_layout_and_label_10_is_0(tmp_path):
    written = write_svhn(tmp_path, np.random.default_rng(9))
    ds = load_dataset("svhn", tmp_path, normalize=False)
    assert ds.train_images.shape == (12, 32, 32, 3) and ds.test_images.shape == (8, 32, 32, 3)
    np.testing.assert_array_equal(ds.train_labels, [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2])
    np.testing.assert_array_equal(
        np.rint(ds.train_images * 255).astype(np.uint8), written["train"][0]
    )
    np.testing.assert_array_equal(
        np.rint(ds.test_images * 255).astype(np.uint8), written["test"][0]
    )


def test_svhn_missing_truncated_garbage(tmp_path):
    with pytest.raises(FileNotFoundError, match=path_pattern(tmp_path / "none")):
        load_dataset("svhn", tmp_path / "none")
    write_svhn(tmp_path, np.random.default_rng(9))
    test_mat = tmp_path / "test_32x32.mat"
    test_mat.unlink()
    with pytest.raises(FileNotFoundError, match=path_pattern(test_mat)):
        load_dataset("svhn", tmp_path)
    train_mat = tmp_path / "train_32x32.mat"
    train_mat.write_bytes(train_mat.read_bytes()[:5000])
    with pytest.raises(ValueError, match=path_pattern(train_mat) + ".*MATLAB v5"):
        load_dataset("svhn", tmp_path)
    train_mat.write_bytes(b"garbage" * 40)
    with pytest.raises(ValueError, match=path_pattern(train_mat)):
        load_dataset("svhn", tmp_path)


def test_svhn_wrong_variables_and_labels(tmp_path):
    write_svhn(tmp_path, np.random.default_rng(9), y=np.zeros((12, 1), np.uint8))
    with pytest.raises(ValueError, match=r"labels in 0\.\.0"):
        load_dataset("svhn", tmp_path)
    write_svhn(tmp_path, np.random.default_rng(9), X=np.zeros((28, 28, 1, 12), np.uint8))
    with pytest.raises(ValueError, match=r"X \(28, 28, 1, 12\)"):
        load_dataset("svhn", tmp_path)


# -------------------- normalization and limit


def test_normalization_uses_train_statistics(tmp_path):
    root = tmp_path / "cifar-10-batches-py"
    write_cifar_pickles(root, np.random.default_rng(10), per_batch=20, n_test=30)
    raw = load_dataset("cifar10", root, normalize=False)
    ds = load_dataset("cifar10", root)
    assert raw.train_images.min() >= 0.0 and raw.train_images.max() <= 1.0
    mean, std = float64_channel_stats(ds.train_images)
    np.testing.assert_allclose(mean, 0.0, atol=1e-5)
    np.testing.assert_allclose(std, 1.0, atol=1e-5)
    raw_mean, raw_std = float64_channel_stats(raw.train_images)
    np.testing.assert_allclose(ds.test_images, (raw.test_images - raw_mean) / raw_std, atol=1e-5)
    # The test split, normalized with the train statistics, is not itself exactly standardized.
    assert np.abs(float64_channel_stats(ds.test_images)[0]).max() > 1e-4


def test_constant_channel_stays_finite(tmp_path):
    path = tmp_path / "usps.h5"
    with h5py.File(path, "w") as f:
        for split in ("train", "test"):
            f[f"{split}/data"] = np.full((4, 256), 0.5, np.float32)
            f[f"{split}/target"] = np.arange(4, dtype=np.int32)
    ds = load_dataset("usps", path)
    assert np.all(ds.train_images == 0.0) and np.all(ds.test_images == 0.0)


def test_limit(tmp_path):
    make_idx_dir(tmp_path, np.random.default_rng(1))
    ds = load_dataset("mnist", tmp_path, limit=7)
    assert len(ds.train_images) == len(ds.train_labels) == 7
    assert len(ds.test_images) == len(ds.test_labels) == 7
    np.testing.assert_allclose(float64_channel_stats(ds.train_images)[1], 1.0, atol=1e-5)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="limit"):
            load_dataset("mnist", tmp_path, limit=bad)


def test_dataset_validates_its_arrays():
    x = np.zeros((4, 8, 8, 1), np.float32)
    y = np.zeros(4, np.int32)
    ds = Dataset("digits", x, y, x, y, 10)
    assert (ds.image_size, ds.channels) == (8, 1)
    with pytest.raises(ValueError, match="train_images"):
        Dataset("digits", x.astype(np.float64), y, x, y, 10)
    with pytest.raises(ValueError, match="test_labels"):
        Dataset("digits", x, y, x, y[:3], 10)
    with pytest.raises(ValueError, match="train_labels"):
        Dataset("digits", x, y + 10, x, y, 10)


# -------------------- split_train_test


def test_split_is_stratified_disjoint_and_complete():
    counts = [50, 30, 20, 7, 3]
    labels = np.repeat(np.arange(5), counts)
    ids = np.arange(len(labels))
    train_x, train_y, test_x, test_y = split_train_test(ids, labels, 0.2, seed=0)
    assert len(test_x) == round(0.2 * len(labels)) == 22
    per_class = np.bincount(test_y, minlength=5)
    np.testing.assert_array_less(np.abs(per_class - 0.2 * np.asarray(counts)), 1.0)
    np.testing.assert_array_equal(np.sort(np.concatenate([train_x, test_x])), ids)
    np.testing.assert_array_equal(labels[train_x], train_y)
    np.testing.assert_array_equal(labels[test_x], test_y)


def test_split_is_seeded():
    labels = np.arange(100) % 4
    ids = np.arange(100)
    a = split_train_test(ids, labels, 0.3, seed=1)
    b = split_train_test(ids, labels, 0.3, seed=1)
    c = split_train_test(ids, labels, 0.3, seed=2)
    for u, v in zip(a, b, strict=True):
        np.testing.assert_array_equal(u, v)
    assert not np.array_equal(np.sort(a[2]), np.sort(c[2]))


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5, 0.001])
def test_split_rejects_bad_fractions(fraction):
    with pytest.raises(ValueError, match="test_fraction"):
        split_train_test(np.arange(20), np.arange(20) % 2, fraction, seed=0)


# -------------------- batches


def test_batches_cover_each_example_once():
    x = np.arange(23)[:, None] * np.ones((1, 3))
    y = np.arange(23)
    got = list(batches(x, y, 5, seed=0))
    assert [len(b) for b, _ in got] == [5, 5, 5, 5, 3]
    seen = np.concatenate([by for _, by in got])
    np.testing.assert_array_equal(np.sort(seen), y)
    assert not np.array_equal(seen, y)  # shuffled
    for bx, by in got:
        np.testing.assert_array_equal(bx[:, 0], by)  # images and labels stay paired
    dropped = list(batches(x, y, 5, seed=0, drop_last=True))
    assert [len(b) for b, _ in dropped] == [5, 5, 5, 5]


def test_batches_reproducible():
    x, y = np.arange(40).reshape(20, 2), np.arange(20)
    first = [by for _, by in batches(x, y, 6, seed=3)]
    again = [by for _, by in batches(x, y, 6, seed=3)]
    other = [by for _, by in batches(x, y, 6, seed=4)]
    for u, v in zip(first, again, strict=True):
        np.testing.assert_array_equal(u, v)
    assert not all(np.array_equal(u, v) for u, v in zip(first, other, strict=True))
    ordered = np.concatenate([by for _, by in batches(x, y, 6, seed=3, shuffle=False)])
    np.testing.assert_array_equal(ordered, y)


def test_batches_check_arguments_on_call():
    x, y = np.zeros((4, 2)), np.zeros(4)
    with pytest.raises(ValueError, match="batch_size"):
        batches(x, y, 0, seed=0)
    with pytest.raises(ValueError, match="labels"):
        batches(x, y[:3], 2, seed=0)


# -------------------- real data


def test_real_usps():
    ds = load_dataset("usps")
    assert ds.train_images.shape == (7291, 16, 16, 1) and ds.test_images.shape == (2007, 16, 16, 1)
    assert ds.train_images.dtype == np.float32 and ds.train_labels.dtype == np.int32
    assert set(np.unique(ds.train_labels)) == set(range(10))
    mean, std = float64_channel_stats(ds.train_images)
    np.testing.assert_allclose(mean, 0.0, atol=1e-5)
    np.testing.assert_allclose(std, 1.0, atol=1e-5)


def test_real_mnist_test_split():
    ds = load_dataset("mnist")
    assert ds.train_images.shape == (8000, 28, 28, 1) and ds.test_images.shape == (2000, 28, 28, 1)
    both = np.concatenate([ds.train_labels, ds.test_labels])
    np.testing.assert_array_equal(np.bincount(both, minlength=10), MNIST_TEST_COUNTS)
    np.testing.assert_array_less(
        np.abs(np.bincount(ds.test_labels) - 0.2 * np.asarray(MNIST_TEST_COUNTS)), 1.0
    )
    raw = load_dataset("mnist", normalize=False, seed=0)
    assert raw.train_images.min() == 0.0 and raw.train_images.max() == 1.0
    np.testing.assert_array_equal(raw.test_labels, ds.test_labels)  # same seed, same split


def test_real_digits():
    ds = load_dataset("digits")
    assert ds.train_images.shape == (1438, 8, 8, 1) and ds.test_images.shape == (359, 8, 8, 1)
    counts = np.bincount(np.concatenate([ds.train_labels, ds.test_labels]))
    assert counts.sum() == 1797 and counts.min() >= 170
    raw = load_dataset("digits", normalize=False, test_fraction=0.5, seed=1)
    assert len(raw.test_labels) == 898 or len(raw.test_labels) == 899
    assert raw.train_images.max() == 1.0 and raw.train_images.min() == 0.0


def test_real_fashion_mnist():
    if not default_root("fashion-mnist").is_dir():
        pytest.skip(
            "dataset-fashion-mnist is not installed (apt-get install -y dataset-fashion-mnist)"
        )
    ds = load_dataset("fashion-mnist")
    assert ds.train_images.shape == (60000, 28, 28, 1) and ds.test_images.shape == (
        10000,
        28,
        28,
        1,
    )
    np.testing.assert_array_equal(np.bincount(ds.train_labels), [6000] * 10)
    np.testing.assert_array_equal(np.bincount(ds.test_labels), [1000] * 10)
    np.testing.assert_allclose(float64_channel_stats(ds.train_images)[1], 1.0, atol=1e-5)


def test_which_skips_fail_in_ci(monkeypatch):
    """tests/conftest.py's rule: with CI set, a skip naming Fashion-MNIST is a data set CI must have;
    other skips, and any skip outside CI, are not (the hook itself: the next test, slow step)."""
    import conftest

    for value, required in [("true", "fashion-mnist"), ("1", "fashion-mnist"), ("false", None), ("", None)]:
        monkeypatch.setenv("CI", value)
        assert conftest.ci_required_data("dataset-fashion-mnist is not installed") == required
        assert conftest.ci_required_data("no CIFAR-10 copy") is None
    monkeypatch.delenv("CI")
    assert conftest.ci_required_data("dataset-fashion-mnist is not installed") is None


@pytest.mark.slow  # a pytest subprocess; the rule it applies is test_which_skips_fail_in_ci (default run)
def test_a_missing_fashion_mnist_fails_in_ci(tmp_path):
    """tests/conftest.py turns a skip for want of Fashion-MNIST into a failure when CI is set
    (a ``skipif`` mark fails in setup, a ``pytest.skip`` call in the test), and only that skip:
    run on tests that skip as ours do where the package is not installed."""
    import shutil
    import subprocess
    import sys

    import conftest

    shutil.copy(pathlib.Path(conftest.__file__), tmp_path / "conftest.py")
    (tmp_path / "test_needs_it.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.skipif(True, reason='dataset-fashion-mnist is not installed')\n"
        "def test_marked():\n    pass\n\n"
        "def test_called():\n    pytest.skip('no Fashion-MNIST here')\n\n"
        "def test_other_data():\n    pytest.skip('no CIFAR-10 copy')\n"
    )
    env = dict(os.environ, CI="true", JAXBSD_TEST_COMPILATION_CACHE="0")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-o", "addopts=", str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "1 failed, 1 skipped, 1 error" in proc.stdout, proc.stdout[-3000:]
    assert "ERROR test_needs_it.py::test_marked" in proc.stdout and "FAILED test_needs_it.py::test_called" in proc.stdout
    assert "CI must have fashion-mnist" in proc.stdout


@pytest.mark.slow
def test_real_cifar10_zip():
    root = default_root("cifar10")
    if not root.is_file():
        pytest.skip(f"{root} is not here")
    start = time.perf_counter()
    ds = load_dataset("cifar10")
    first = time.perf_counter() - start
    assert ds.train_images.shape == (50000, 32, 32, 3) and ds.test_images.shape == (
        10000,
        32,
        32,
        3,
    )
    np.testing.assert_array_equal(np.bincount(ds.train_labels), [5000] * 10)
    np.testing.assert_array_equal(np.bincount(ds.test_labels), [1000] * 10)
    mean, std = float64_channel_stats(ds.train_images)
    np.testing.assert_allclose(mean, 0.0, atol=1e-4)
    np.testing.assert_allclose(std, 1.0, atol=1e-4)
    start = time.perf_counter()
    cached = load_dataset("cifar10", limit=1000)
    assert time.perf_counter() - start < first / 2
    np.testing.assert_array_equal(cached.train_labels, ds.train_labels[:1000])
    np.testing.assert_array_equal(np.bincount(cached.train_labels), [100] * 10)


# -------------------- text: pystdlib, character level, split by module

PYSTDLIB = "text/python-3.11-stdlib.txt.gz"


def write_corpus(path: pathlib.Path, modules: list[tuple[str, str]]) -> pathlib.Path:
    """A gzip corpus in the pystdlib format: '# ==== name.py ====' then the module's text."""
    with gzip.open(path, "wt", encoding="utf-8", newline="") as f:
        for name, body in modules:
            f.write(f"# ==== {name}.py ====\n{body}")
    return path


def _oracle_split(name: str) -> str:
    u = int(hashlib.sha256(name.encode("utf-8")).hexdigest()[:16], 16) / 2**64
    return "train" if u < 0.8 else ("validation" if u < 0.9 else "test")


def test_char_vocab_round_trips_and_maps_unknowns_to_zero():
    vocab = data.CharVocab()
    known = "\n\t" + "".join(map(chr, range(32, 127)))
    assert vocab.size == 98 == len(set(known)) + 1
    # the table, written out: 0 unknown, 1 newline, 2 tab, 3.. printable ASCII in code-point order
    expected = {"\n": 1, "\t": 2, **{chr(c): c - 29 for c in range(32, 127)}}
    np.testing.assert_array_equal(vocab.encode(known), [expected[ch] for ch in known])
    rng = np.random.default_rng(0)
    text = "".join(rng.choice(list(known), 500))
    ids = vocab.encode(text)
    assert ids.dtype == np.uint8 and ids.shape == (500,) and vocab.decode(ids) == text
    mixed = "é\r\x0cx€\U0001f600y"
    np.testing.assert_array_equal(vocab.encode(mixed), [0, 0, 0, expected["x"], 0, 0, expected["y"]])
    assert vocab.decode(vocab.encode(mixed)) == "\ufffd\ufffd\ufffdx\ufffd\ufffdy"
    assert vocab.decode(vocab.encode("")) == ""
    with pytest.raises(ValueError, match="ids"):
        vocab.decode(np.array([98]))
    with pytest.raises(ValueError, match="text"):
        vocab.encode(b"abc")


def test_module_split_is_a_hash_of_the_name():
    names = [f"module_{i}" for i in range(4000)] + ["abc", "typing", "os"]
    splits = [data.module_split(n) for n in names]
    assert splits == [_oracle_split(n) for n in names]
    assert splits == [data.module_split(n) for n in names]  # deterministic
    fractions = [splits.count(s) / len(splits) for s in data.TEXT_SPLITS]
    np.testing.assert_allclose(fractions, data.TEXT_SPLIT_FRACTIONS, atol=0.02)


def _synthetic_modules(n=30):
    rng = np.random.default_rng(1)
    alphabet = list("abcdefghij (){}:=+\n    ")
    return [(f"m{i:02d}", "".join(rng.choice(alphabet, 50 + 10 * i)) + "\n") for i in range(n)]


def test_text_split_is_by_module_disjoint_and_complete(tmp_path):
    modules = _synthetic_modules()
    path = write_corpus(tmp_path / "corpus.txt.gz", modules)
    ds = data.load_text_dataset("pystdlib", path)
    vocab = ds.vocab
    for split in data.TEXT_SPLITS:
        mine = [(n, b) for n, b in modules if _oracle_split(n) == split]
        assert ds.modules[split] == tuple(n for n, _ in mine)
        text = "".join(f"# ==== {n}.py ====\n{b}" for n, b in mine)
        assert vocab.decode(ds.split(split)) == text
    names = [set(ds.modules[s]) for s in data.TEXT_SPLITS]
    assert not (names[0] & names[1] or names[0] & names[2] or names[1] & names[2])
    assert set.union(*names) == {n for n, _ in modules}
    # a module keeps its split when others are removed
    fewer = data.load_text_dataset("pystdlib", write_corpus(tmp_path / "fewer.txt.gz", modules[::3]))
    for split in data.TEXT_SPLITS:
        assert set(fewer.modules[split]) == set(ds.modules[split]) & {n for n, _ in modules[::3]}
    limited = data.load_text_dataset("pystdlib", path, limit=40)
    for split in data.TEXT_SPLITS:
        np.testing.assert_array_equal(limited.split(split), ds.split(split)[:40])


def test_text_missing_and_malformed_files(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXBSD_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=path_pattern(tmp_path / PYSTDLIB)):
        data.load_text_dataset("pystdlib")
    monkeypatch.delenv("JAXBSD_DATA")
    with pytest.raises(FileNotFoundError, match="JAXBSD_DATA is not set"):
        data.load_text_dataset("pystdlib")
    with pytest.raises(FileNotFoundError, match=path_pattern(tmp_path / "nope.gz")):
        data.load_text_dataset("pystdlib", tmp_path / "nope.gz")
    (tmp_path / "plain.gz").write_bytes(b"# ==== a.py ====\nx = 1\n")
    with pytest.raises(ValueError, match="plain.gz.*cannot read"):
        data.load_text_dataset("pystdlib", tmp_path / "plain.gz")
    headless = write_corpus(tmp_path / "headless.gz", [])
    with gzip.open(headless, "wt") as f:
        f.write("x = 1\n# ==== a.py ====\n")
    with pytest.raises(ValueError, match="does not start"):
        data.load_text_dataset("pystdlib", headless)
    twice = write_corpus(tmp_path / "twice.gz", [("a", "x\n"), ("a", "y\n")])
    with pytest.raises(ValueError, match="repeat"):
        data.load_text_dataset("pystdlib", twice)
    with pytest.raises(ValueError, match="wikitext"):
        data.load_text_dataset("wikitext")
    with pytest.raises(ValueError, match="limit"):
        data.load_text_dataset("pystdlib", twice, limit=0)


@pytest.mark.parametrize("n, context, offset", [(50, 8, 0), (50, 8, 3), (9, 8, 0), (8, 8, 0)])
def test_text_windows(n, context, offset):
    ids = np.arange(n)
    windows = data.text_windows(ids, context, offset=offset)
    expected = [ids[s : s + context + 1] for s in range(offset, n - context, context)]
    np.testing.assert_array_equal(windows.reshape(-1, context + 1), np.array(expected).reshape(-1, context + 1))
    # consecutive windows share one id: every id after the offset is a target once
    targets = windows[:, 1:].ravel()
    assert len(set(targets.tolist())) == len(targets)


@pytest.mark.parametrize("n, context, stride", [(100, 8, None), (100, 8, 3), (100, 8, 8), (9, 8, None),
                                                (5, 8, None), (2, 8, 1), (57, 7, 2)])
def test_eval_windows_score_every_target_once(n, context, stride):
    ids = np.arange(1, n + 1)  # id == position + 1, so a target's position is readable
    windows, mask = data.eval_windows(ids, context, stride)
    assert windows.shape[1] == context + 1 and mask.shape == (len(windows), context)
    scored = windows[:, 1:][mask] - 1  # positions of the scored targets
    assert sorted(scored.tolist()) == list(range(1, n))
    # each scored target's inputs are the ids just before it in the stream
    rows, cols = np.nonzero(mask)
    np.testing.assert_array_equal(windows[rows, cols], windows[rows, cols + 1] - 1)
    if stride is not None and n > context + 1:  # after the first window, at least context − stride of context
        assert cols[rows > 0].min() >= context - stride


def test_eval_windows_rejects_bad_arguments():
    with pytest.raises(ValueError, match="stride"):
        data.eval_windows(np.arange(20), 8, 9)
    with pytest.raises(ValueError, match="ids"):
        data.eval_windows(np.arange(1), 8)
    with pytest.raises(ValueError, match="context"):
        data.text_windows(np.arange(20), 0)


def test_real_pystdlib_corpus():
    root = data.default_text_root("pystdlib")
    if root is None or not root.exists():
        pytest.skip(f"no {PYSTDLIB} under $JAXBSD_DATA")
    ds = data.load_text_dataset("pystdlib")
    with gzip.open(root, "rt", encoding="utf-8") as f:
        text = f.read()
    assert hashlib.sha256(text.encode()).hexdigest().startswith("32ce3407aecef086")  # the README's
    names = re.findall(r"^# ==== (.+)\.py ====$", text, flags=re.M)
    assert len(names) == 168 and sum(len(ds.modules[s]) for s in data.TEXT_SPLITS) == 168
    assert {s: len(ds.modules[s]) for s in data.TEXT_SPLITS} == {"train": 133, "validation": 15, "test": 20}
    for split in data.TEXT_SPLITS:
        assert ds.modules[split] == tuple(n for n in names if _oracle_split(n) == split)
        assert ds.vocab.decode(ds.split(split)[:7]) == "# ==== "
    assert sum(len(ds.split(s)) for s in data.TEXT_SPLITS) == len(text) == 4_702_368
    assert sum(int((ds.split(s) == 0).sum()) for s in data.TEXT_SPLITS) == 90  # the non-ASCII characters
