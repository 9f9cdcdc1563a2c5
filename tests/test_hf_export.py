"""A model written back is a clean copy of the directory it was read from.

Oracles: the input tree itself (file list, bytes of the files the export does not change, the
tokenizer's truncation and padding as the ``tokenizers`` library reads them back) and the umask
(every file's mode is ``0666`` less it, as for any file the user's tools write).
"""

from __future__ import annotations

import json
import os
import stat

import pytest
from bert_reference import write_tiny_bert
from flax import nnx

from jaxbsd.models import bert as B
from jaxbsd.models.layers import MLP

EXTRA = {"tokenizer_config.json": '{"do_lower_case": true, "model_max_length": 512}',
         "special_tokens_map.json": '{"cls_token": "[CLS]", "sep_token": "[SEP]"}',
         "config_sentence_transformers.json": '{"__version__": {"sentence_transformers": "2.0.0"}}',
         "sentence_bert_config.json": '{"max_seq_length": 24, "do_lower_case": false}',
         "README.md": "# a model card\n"}
STALE = {"pytorch_model.bin": b"old weights", "onnx/model.onnx": b"old graph"}


def _tree(root):
    return {p.relative_to(root).as_posix(): p for p in root.rglob("*") if p.is_file()}


def _umask_mode():
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@pytest.fixture
def source(tmp_path):
    from tokenizers import Tokenizer

    root = write_tiny_bert(tmp_path / "in")
    tok = Tokenizer.from_file(str(root / "tokenizer.json"))
    tok.enable_truncation(20)
    tok.enable_padding(length=20, pad_id=0, pad_token="[PAD]")
    tok.save(str(root / "tokenizer.json"))
    for name, text in EXTRA.items():
        (root / name).write_text(text)
    for name, data in STALE.items():
        (root / name).parent.mkdir(exist_ok=True)
        (root / name).write_bytes(data)
    return root


def test_a_pruned_bert_is_written_as_a_copy_of_its_source(source, tmp_path):
    from tokenizers import Tokenizer

    encoder = B.from_pretrained(source)
    assert encoder.source == str(source.resolve())
    encoder.encode(["the weather is lovely today."])  # encoding sets its own padding and truncation
    for layer in encoder.bert.layers:  # what a uniform pruning leaves: standard MLPs of a smaller width
        layer.mlp = MLP(16, 20, activation=encoder.bert.config.activation, rngs=nnx.Rngs(0))
    out = B.save_pretrained(encoder, tmp_path / "out")
    given, written = _tree(source), _tree(out)
    assert set(written) == set(given) - set(STALE)
    for name in set(written) - {"model.safetensors", "config.json"}:  # unchanged: copied byte for byte
        assert written[name].read_bytes() == given[name].read_bytes(), name
    for name, path in written.items():
        assert stat.S_IMODE(path.stat().st_mode) == _umask_mode(), name
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.truncation["max_length"] == 20 and tok.padding["length"] == 20
    config, original = json.loads((out / "config.json").read_text()), json.loads((source / "config.json").read_text())
    assert config["intermediate_size"] == 20
    assert {k: v for k, v in config.items() if k != "intermediate_size"}.items() >= {
        k: v for k, v in original.items() if k != "intermediate_size"}.items()
    assert B.from_pretrained(out).max_seq_length == 24


def test_without_its_source_the_files_are_written_from_the_encoder(source, tmp_path):
    import shutil

    encoder = B.from_pretrained(source)
    shutil.rmtree(source)
    out = B.save_pretrained(encoder, tmp_path / "out")
    assert {"config.json", "model.safetensors", "tokenizer.json", "modules.json", "1_Pooling/config.json",
            "sentence_bert_config.json"} == set(_tree(out))
    assert B.from_pretrained(out).max_seq_length == 24
