"""Data sets for experiments, read from local copies (numpy only; nothing is downloaded).

- ``jaxbsd.data.images``: the image data sets: :func:`load_dataset`, :class:`Dataset`,
  :func:`split_train_test`, :func:`batches`, :func:`default_root`;
- ``jaxbsd.data.formats``: their file-format readers (IDX gz, HDF5, CIFAR-10 pickles and image
  folders, MATLAB v5), and ``jaxbsd.data.cache``, the on-disk ``.npz`` cache of decoded images;
- ``jaxbsd.data.text``: the character-level text data set ``pystdlib``: :func:`load_text_dataset`,
  :class:`CharVocab`, :func:`module_split`, :func:`text_windows`, :func:`eval_windows`;
- ``jaxbsd.data.corpora``: the sentence-encoder corpus, the Python documentation's reST sources:
  :func:`load_docs_corpus`, :func:`rst_passages`, :func:`rst_heading_pairs`, and its passages as
  the package ships them (:func:`docs_texts`, :class:`PackagedDocs`);
- ``jaxbsd.data.bundled``: pretrained models installed as packages: :func:`minilm_dir`;
- ``jaxbsd.data.paths``: the data directory ``$JAXBSD_DATA`` (:func:`data_dir`) and the cache
  directory ``$JAXBSD_CACHE``.

Without ``root``, every data set is read from the data directory named by ``$JAXBSD_DATA``
(:func:`data_dir`); nothing is guessed from where the package is installed (the one file the
package ships, the docs corpus's passages, is read from the package itself). A missing data set
raises ``FileNotFoundError`` saying which file to put where; a truncated or malformed one raises
``FileNotFoundError`` or ``ValueError`` with the path and the format that was expected.
Every public name of the submodules above is importable from ``jaxbsd.data``.
"""

from __future__ import annotations

# In the order of the old single module, which the API page follows (members_order: source).
from jaxbsd.data.paths import DATA_ENV, data_dir
from jaxbsd.data.formats import CIFAR10_CLASSES
from jaxbsd.data.images import (
    DATASETS,
    Dataset,
    default_root,
    load_dataset,
    split_train_test,
    batches,
)
from jaxbsd.data.text import (
    TEXT_DATASETS,
    TEXT_SPLIT_FRACTIONS,
    TEXT_SPLITS,
    CharVocab,
    TextDataset,
    module_split,
    parse_modules,
    default_text_root,
    load_text_dataset,
    text_windows,
    eval_windows,
)
from jaxbsd.data.bundled import MINILM_PACKAGE, MINILM_SHA256, minilm_dir
from jaxbsd.data.corpora import (
    DOCS_SPLITS,
    DOCS_CALIBRATION_FRACTION,
    docs_file_split,
    DocsCorpus,
    rst_passages,
    rst_heading_pairs,
    load_docs_corpus,
    DOCS_SOURCE,
    PackagedDocs,
    docs_texts,
    docs_passages_payload,
)

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
    "MINILM_SHA256",
    "minilm_dir",
    "DocsCorpus",
    "DOCS_SPLITS",
    "DOCS_CALIBRATION_FRACTION",
    "docs_file_split",
    "load_docs_corpus",
    "DOCS_SOURCE",
    "PackagedDocs",
    "docs_texts",
    "docs_passages_payload",
    "rst_passages",
    "rst_heading_pairs",
]
