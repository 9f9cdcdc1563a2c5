"""Text-embedding fidelity metrics (jaxbsd.solver.metrics) against brute-force numpy loops, and the docs
corpus reader (jaxbsd.data) on a small archive written here in the real one's layout."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest

from jaxbsd.solver import metrics
from jaxbsd.data import DOCS_SPLITS, docs_file_split, load_docs_corpus, rst_heading_pairs, rst_passages


def _cos(a, b):
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("seed", [0, 1])
def test_mean_cosine_is_the_loop_over_rows(seed):
    rng = np.random.default_rng(seed)
    A, B = rng.standard_normal((20, 7)), rng.standard_normal((20, 7))
    B[::3] = 2.5 * A[::3]  # some rows agree exactly (cosine 1)
    want = np.mean([_cos(a, b) for a, b in zip(A, B)])
    assert float(metrics.mean_cosine(A, B)) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("k,noise", [(1, 0.0), (3, 0.3), (10, 1.0)])
def test_neighbour_overlap_is_the_loop_over_neighbour_sets(k, noise):
    rng = np.random.default_rng(k)
    A = rng.standard_normal((30, 5))
    B = A + noise * rng.standard_normal(A.shape)

    def top(E, i):
        sims = [(-_cos(E[i], E[j]), j) for j in range(len(E)) if j != i]
        return {j for _, j in sorted(sims)[:k]}

    want = np.mean([len(top(A, i) & top(B, i)) / k for i in range(len(A))])
    got = float(metrics.neighbour_overlap(A, B, k=k))
    assert got == pytest.approx(want, abs=1e-12)
    if noise == 0.0:
        assert got == 1.0


@pytest.mark.parametrize("noise", [0.2, 1.5])
def test_retrieval_recall_is_the_loop_over_ranks(noise):
    rng = np.random.default_rng(4)
    D = rng.standard_normal((40, 6))
    Q = D + noise * rng.standard_normal(D.shape)
    ranks = [sum(_cos(Q[i], D[j]) > _cos(Q[i], D[i]) for j in range(40)) for i in range(40)]
    got = metrics.retrieval_recall(Q, D, ks=(1, 5, 10))
    assert got == {k: pytest.approx(np.mean([r < k for r in ranks]), abs=1e-12) for k in (1, 5, 10)}
    assert 0 < got[1] <= got[5] <= got[10]


def test_metrics_refuse_bad_shapes():
    with pytest.raises(ValueError, match="B must have the shape"):
        metrics.mean_cosine(np.ones((3, 2)), np.ones((4, 2)))
    with pytest.raises(ValueError, match="k must be"):
        metrics.neighbour_overlap(np.ones((3, 2)), np.ones((3, 2)), k=3)
    with pytest.raises(ValueError, match="documents"):
        metrics.retrieval_recall(np.ones((3, 2)), np.ones((2, 2)))


# ----------------------------------------------------------------------------- docs corpus

RST = """.. _tut-if:

**************************************************
More Control Flow
**************************************************

Besides the :keyword:`while` statement just introduced, Python uses the usual
flow control statements known from other languages, with some twists.

:keyword:`!if` Statements
=========================

.. index::
   statement: if

Perhaps the most well-known statement type is the :keyword:`if` statement.  For
example::

   >>> x = 1

Empty Section
-------------

Next
----

.. note::
   A note, not prose.

   Indented text.

The ``for`` statement iterates over the items of any sequence, see :func:`~itertools.chain`.

* a list item that is long enough to pass the length rule if it were prose at all, which it is not
"""


def test_heading_pairs_and_passages_of_a_planted_file():
    pairs = rst_heading_pairs(RST)
    assert pairs == [
        ("More Control Flow", "Besides the while statement just introduced, Python uses the usual flow control "
                              "statements known from other languages, with some twists."),
        ("if Statements", "Perhaps the most well-known statement type is the if statement. For example::"),
        ("Next", "The for statement iterates over the items of any sequence, see itertools.chain."),
    ]
    passages = rst_passages(RST, min_chars=60)
    assert passages == [pairs[0][1], pairs[1][1], pairs[2][1]]


def _write_archive(path, names):
    with tarfile.open(path, "w:gz") as tar:
        for name in names:
            data = RST.replace("More Control Flow", f"Title of {name}").encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("_sources/")
        info.type = tarfile.DIRTYPE
        tar.addfile(info)


def test_docs_corpus_is_split_by_file(tmp_path):
    names = [f"_sources/library/m{i}.rst.txt" for i in range(20)]
    _write_archive(tmp_path / "docs.tar.gz", names)
    corpus = load_docs_corpus(tmp_path / "docs.tar.gz")
    for split in DOCS_SPLITS:
        assert [n for n, _ in corpus.files[split]] == [n for n in names if docs_file_split(n) == split]
    assert all(corpus.files[s] for s in DOCS_SPLITS)  # 20 files land on both sides
    # a heading repeated across files ("if Statements", "Next") names no single section: dropped
    cal = corpus.pairs("calibration")
    assert {t for t, _ in cal} == {f"Title of {n}" for n, _ in corpus.files["calibration"]}
    assert len(corpus.passages("evaluation")) == 3 * len(corpus.files["evaluation"])


def test_docs_corpus_errors_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.tar.gz"):
        load_docs_corpus(tmp_path / "nothing.tar.gz")
    (tmp_path / "bad.tar.gz").write_bytes(b"not a tar")
    with pytest.raises(ValueError, match="bad.tar.gz: cannot read"):
        load_docs_corpus(tmp_path / "bad.tar.gz")


def test_the_real_docs_corpus_gives_enough_pairs_on_both_sides():
    try:
        corpus = load_docs_corpus()
    except FileNotFoundError as err:
        pytest.skip(f"no docs corpus: {err}")
    files = {n for s in DOCS_SPLITS for n, _ in corpus.files[s]}
    assert len(files) == 497 and not ({n for n, _ in corpus.files["calibration"]}
                                      & {n for n, _ in corpus.files["evaluation"]})
    assert len(corpus.pairs("evaluation")) > 1000 and len(corpus.passages("calibration")) > 3000


def test_the_shipped_docs_texts_are_the_archives_and_need_no_data_dir(monkeypatch):
    try:
        corpus = load_docs_corpus()
    except FileNotFoundError as err:
        pytest.skip(f"no docs corpus: {err}")
    import hashlib

    from jaxbsd.data import DATA_ENV, data_dir, docs_texts

    archive = data_dir() / "text/python-3.11-docs-rst.tar.gz"
    monkeypatch.delenv(DATA_ENV)
    shipped = docs_texts()
    assert shipped.archive_sha256 == hashlib.sha256(archive.read_bytes()).hexdigest()
    for split in DOCS_SPLITS:  # the texts the experiments cut from the archive, exactly
        assert shipped.passages(split) == corpus.passages(split)
        assert shipped.pairs(split) == corpus.pairs(split)
