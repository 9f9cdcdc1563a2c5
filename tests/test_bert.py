"""BERT-family encoders from Hugging Face directories (jaxbsd.models.bert).

Oracles: the similarity matrix sentence-transformers' documentation prints for all-MiniLM-L6-v2,
and an independent numpy BERT (tests/bert_reference.py) reading the same files by their Hugging
Face tensor names, on a tiny random BERT the tests write and on MiniLM itself.
"""

from __future__ import annotations

import json
import os
import shutil

import jax
import numpy as np
import pytest
from bert_reference import NumpyBert, write_tiny_bert
from flax import nnx

from jaxbsd.models import bert as B
from jaxbsd.models import count_params

SENTENCES = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
OTHER = ["he is so lovely", "the stadium is outside today!", "s", "it drove. the weather drove to the stadium is "
         "sunny so he is outside today and it is lovely", "zebra quixotic"]


def minilm_or_skip():
    from jaxbsd.data import minilm_dir

    try:
        return minilm_dir()
    except FileNotFoundError as err:
        pytest.skip(f"all-minilm-l6-v2 not installed: {err}")


@pytest.fixture(scope="module")
def minilm():
    return B.from_pretrained(minilm_or_skip())


# ----------------------------------------------------------------------------- published outputs


def test_minilm_reproduces_the_published_quickstart_similarities(minilm):
    # sentence-transformers' documentation, "Usage" quick start (https://sbert.net/docs/sentence_transformer/
    # usage/usage.html): SentenceTransformer("all-MiniLM-L6-v2"), model.encode(sentences),
    # model.similarity(embeddings, embeddings) prints
    #   tensor([[1.0000, 0.6660, 0.1046],
    #           [0.6660, 1.0000, 0.1411],
    #           [0.1046, 0.1411, 1.0000]])
    published = np.array([[1.0000, 0.6660, 0.1046], [0.6660, 1.0000, 0.1411], [0.1046, 0.1411, 1.0000]])
    emb = minilm.encode(SENTENCES)
    assert emb.shape == (3, 384) and emb.dtype == np.float32
    unit = emb.astype(np.float64) / np.linalg.norm(emb.astype(np.float64), axis=1, keepdims=True)  # cosine
    np.testing.assert_array_equal(np.round(unit @ unit.T, 4), published)
    assert minilm.pooling == "mean" and minilm.normalize and minilm.max_seq_length == 256
    assert count_params(minilm) == 22_565_376  # the pooler (unused by the embedding) is not counted


@pytest.mark.slow
def test_minilm_agrees_with_an_independent_numpy_bert(minilm):
    ref = NumpyBert(minilm_or_skip())
    texts = SENTENCES + OTHER + ["Title → section retrieval over the Python docs: " + "word " * 300]
    got = minilm.encode(texts, batch_size=4)
    want = ref.encode(texts, max_len=256)
    np.testing.assert_allclose(got, want, atol=2e-5)


# ----------------------------------------------------------------------------- a tiny BERT


@pytest.mark.parametrize("act,pooling,normalize", [("gelu", "mean", True), ("gelu_new", "cls", False),
                                                   ("gelu_pytorch_tanh", "max", True), ("relu", "mean", False)])
def test_tiny_encoder_agrees_with_the_numpy_bert(tmp_path, act, pooling, normalize):
    path = write_tiny_bert(tmp_path / "m", hidden_act=act, pooling=pooling, normalize=normalize)
    enc = B.from_pretrained(path)
    assert (enc.pooling, enc.normalize) == (pooling, normalize)
    # batch_size 3 pads sentences of different lengths together: the mask must hide the padding
    got = enc.encode(SENTENCES + OTHER, batch_size=3)
    want = NumpyBert(path).encode(SENTENCES + OTHER)
    np.testing.assert_allclose(got, want, atol=3e-5, rtol=1e-4)


def test_call_is_jittable_and_matches_encode(tmp_path):
    enc = B.from_pretrained(write_tiny_bert(tmp_path / "m"))
    ids, mask, types = enc.tokenize(SENTENCES)
    out = nnx.jit(lambda m, i, k: m(i, k))(enc, ids, mask)
    np.testing.assert_allclose(np.asarray(out), enc.encode(SENTENCES), atol=1e-6)
    assert out.shape == (3, 16)


def test_without_sentence_transformers_files_mean_pooling_unnormalised(tmp_path):
    path = write_tiny_bert(tmp_path / "m", sentence_transformers=False, pooler=False)
    enc = B.from_pretrained(path)
    assert (enc.pooling, enc.normalize) == ("mean", False)
    ref = NumpyBert(path)
    np.testing.assert_allclose(enc.encode(OTHER), ref.encode(OTHER), atol=3e-5, rtol=1e-4)


def test_calibration_windows_are_unpadded_framed_token_windows(tmp_path):
    enc = B.from_pretrained(write_tiny_bert(tmp_path / "m"))
    texts = OTHER * 4
    w = B.calibration_windows(enc, texts, seq_len=6, count=5, seed=1)
    assert w.shape == (5, 6) and w.dtype == np.int32
    vocab = json.loads((tmp_path / "m" / "tokenizer.json").read_text())["model"]["vocab"]
    assert (w[:, 0] == vocab["[CLS]"]).all() and (w[:, -1] == vocab["[SEP]"]).all()
    stream = [i for t in texts for i in enc.tokenizer.encode(t, add_special_tokens=False).ids]
    bodies = {tuple(stream[j:j + 4]) for j in range(0, len(stream) - 3, 4)}
    assert all(tuple(row[1:-1]) in bodies for row in w)
    with pytest.raises(ValueError, match="windows"):
        B.calibration_windows(enc, ["he"], seq_len=6, count=2)


# ----------------------------------------------------------------------------- bad directories


def _break(path, how):
    if how == "no dir":
        shutil.rmtree(path)
    elif how == "no config":
        (path / "config.json").unlink()
    elif how == "mpnet":  # a family of its own (jaxbsd.models.mpnet), not read by bert.from_pretrained
        c = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**c, "model_type": "mpnet"}))
    elif how == "no weights":
        (path / "model.safetensors").unlink()
    elif how == "only bin":
        (path / "model.safetensors").rename(path / "pytorch_model.bin")
    elif how == "no tokenizer":
        (path / "tokenizer.json").unlink()
    elif how in ("wrong shape", "missing tensor"):
        from safetensors.numpy import load_file, save_file

        t = load_file(str(path / "model.safetensors"))
        if how == "wrong shape":
            t["encoder.layer.1.intermediate.dense.weight"] = np.zeros((31, 16), np.float32)
        else:
            del t["encoder.layer.0.attention.self.key.bias"]
        save_file(t, str(path / "model.safetensors"))


@pytest.mark.parametrize("how,match", [
    ("no dir", "not a directory"),
    ("no config", "no config.json"),
    ("mpnet", "model_type is 'mpnet'"),
    ("no weights", "no model.safetensors$"),
    ("only bin", "only pytorch_model.bin"),
    ("no tokenizer", "no tokenizer.json"),
    ("wrong shape", r"encoder.layer.1.intermediate.dense.weight has shape \(31, 16\), expected \(32, 16\)"),
    ("missing tensor", r"missing tensor\(s\) \['encoder.layer.0.attention.self.key.bias'\]"),
])
def test_bad_directories_get_one_line_value_errors_naming_the_path(tmp_path, how, match):
    path = write_tiny_bert(tmp_path / "m")
    _break(path, how)
    with pytest.raises(ValueError, match=match) as err:
        B.from_pretrained(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


# ----------------------------------------------------------------------------- saving


def test_save_pretrained_round_trip_is_exact(tmp_path):
    enc = B.from_pretrained(write_tiny_bert(tmp_path / "m", pooling="max"))
    out = B.save_pretrained(enc, tmp_path / "saved")
    again = B.from_pretrained(out)
    np.testing.assert_array_equal(again.encode(OTHER), enc.encode(OTHER))
    same = jax.tree.map(lambda a, b: bool((np.asarray(a) == np.asarray(b)).all()), nnx.state(enc), nnx.state(again))
    assert all(jax.tree.leaves(same))
    from safetensors.numpy import load_file

    src, dst = load_file(str(tmp_path / "m" / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert set(src) == set(dst) and all((src[k] == dst[k]).all() for k in src)


def _prune_all(enc, widths):
    from jaxbsd.compression.baselines import prune_mlp

    rng = np.random.default_rng(0)
    for layer, k in zip(enc.bert.layers, widths):
        X = rng.standard_normal((200, enc.bert.config.hidden_size)).astype(np.float32)
        m = layer.mlp
        layer.mlp, _ = prune_mlp(m.fc1.kernel[...], m.fc1.bias[...], m.fc2.kernel[...], m.fc2.bias[...],
                                 m.activation, k, X)


def test_pruned_export_loads_into_a_plain_bert_of_the_smaller_width(tmp_path):
    enc = B.from_pretrained(write_tiny_bert(tmp_path / "m"))
    _prune_all(enc, [12, 12])
    out = B.save_pretrained(enc, tmp_path / "pruned")
    assert json.loads((out / "config.json").read_text())["intermediate_size"] == 12
    np.testing.assert_allclose(NumpyBert(out).encode(OTHER), enc.encode(OTHER), atol=3e-5, rtol=1e-4)
    np.testing.assert_array_equal(B.from_pretrained(out).encode(OTHER), enc.encode(OTHER))


def test_save_refuses_what_a_bert_checkpoint_cannot_hold(tmp_path):
    enc = B.from_pretrained(write_tiny_bert(tmp_path / "m"))
    _prune_all(enc, [12, 10])
    with pytest.raises(ValueError, match=r"different hidden widths \[10, 12\].*save_compressed"):
        B.save_pretrained(enc, tmp_path / "x")
    from jaxbsd.compression.baselines import svd_mlp

    enc = B.from_pretrained(write_tiny_bert(tmp_path / "m2"))
    enc.bert.layers[1].mlp = svd_mlp(enc.bert.layers[1].mlp, 4)
    with pytest.raises(ValueError, match=r"bert.layers.1.mlp: LowRankMLP .*save_compressed"):
        B.save_pretrained(enc, tmp_path / "y")
    assert not (tmp_path / "y").exists()


def test_config_rejects_what_the_model_cannot_run():
    with pytest.raises(ValueError, match="hidden_act"):
        B.BertConfig.tiny(hidden_act="swish")
    with pytest.raises(ValueError, match="position_embedding_type 'relative_key'"):
        B.BertConfig.from_hf({"model_type": "bert", "position_embedding_type": "relative_key"})
    assert os.environ.get("JAXBSD_DATA")  # conftest sets it (the docs corpus tests rely on it)
