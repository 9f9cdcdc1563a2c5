"""Tests of jaxbsd.data's character-level text data set (jaxbsd.data.text): pystdlib, split by
module, on small corpora written here in its format and on the real copy."""

from __future__ import annotations

import gzip
import hashlib
import pathlib
import re

import numpy as np
import pytest
from data_writers import path_pattern

from jaxbsd import data


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
