"""Tests of jaxbsd.data's file-format readers (jaxbsd.data.formats, jaxbsd.data.cache): every format
on small files written here in that exact format (tests/data_writers.py)."""

from __future__ import annotations

import gzip
import os
import pickle
import struct
import zipfile

import h5py
import numpy as np
import pytest
from data_writers import (
    encode_image,
    image_folder_files,
    make_idx_dir,
    path_pattern,
    write_cifar_pickles,
    write_idx,
    write_image_zip,
    write_svhn,
    write_usps,
)

from jaxbsd.data import formats, load_dataset


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """No test reads or writes the user's cache; JAXBSD_DATA is as conftest.py set it."""
    monkeypatch.setenv("JAXBSD_CACHE", str(tmp_path / "cache"))



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
