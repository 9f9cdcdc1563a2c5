"""Tests of jaxbsd.data's image data sets (jaxbsd.data.images): names and roots, normalization, splits,
batches, and the real copies that exist on this machine (USPS, the MNIST test split, digits,
Fashion-MNIST when installed, and the CIFAR-10 JPEG zip as a slow test)."""

from __future__ import annotations

import os
import pathlib
import time

import h5py
import numpy as np
import pytest
from data_writers import float64_channel_stats, make_idx_dir, write_cifar_pickles, write_usps

from jaxbsd import data
from jaxbsd.data import Dataset, batches, default_root, load_dataset, split_train_test

MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """No test reads or writes the user's cache; JAXBSD_DATA is as conftest.py set it."""
    monkeypatch.setenv("JAXBSD_CACHE", str(tmp_path / "cache"))



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
