"""Encoder families of Hugging Face directories (bert, roberta, xlm-roberta, distilbert, mpnet), both ways.

Oracle: ``transformers`` itself. Tiny random-init models (every parameter redrawn, so a swapped
bias or LayerNorm shows) are saved with ``save_pretrained`` and read by
``jaxbsd.models.from_pretrained``; the last hidden states agree on a padded batch at the real
tokens. The other way: every MLP pruned to one width by ``compress_model``, written by
``jaxbsd.models.save_pretrained`` and read back by ``transformers.AutoModel``.
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from hf_oracle import (assert_refused, assert_rel_close, edit_config, edit_tensors, only_pytorch_bin, prune_all, save,
                       tiny_model)

import jaxbsd
from jaxbsd import models as M

T = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

VOCAB, SEQ = 100, 8
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, vocab_size=VOCAB,
             max_position_embeddings=40)
DISTIL = dict(dim=32, n_layers=2, n_heads=4, hidden_dim=37, vocab_size=VOCAB, max_position_embeddings=40)

#: name -> transformers config (each covers an eps, an activation, a padding id or position variant).
CASES = {
    "bert-gelu_new-eps": lambda: T.BertConfig(**SIZES, hidden_act="gelu_new", layer_norm_eps=1e-6),
    "roberta-gelu": lambda: T.RobertaConfig(**SIZES, layer_norm_eps=1e-5, type_vocab_size=1, pad_token_id=1),
    "roberta-relu-pad0": lambda: T.RobertaConfig(**SIZES, hidden_act="relu", type_vocab_size=2, pad_token_id=0),
    "xlm-roberta-gelu_new": lambda: T.XLMRobertaConfig(**SIZES, hidden_act="gelu_new", type_vocab_size=1),
    "distilbert-gelu": lambda: T.DistilBertConfig(**DISTIL),
    "distilbert-relu-sinusoidal": lambda: T.DistilBertConfig(**DISTIL, activation="relu", sinusoidal_pos_embds=True),
    "mpnet-gelu": lambda: T.MPNetConfig(**SIZES),
    "mpnet-tanh-eps": lambda: T.MPNetConfig(**SIZES, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6),
}


def write_tokenizer(path) -> None:
    """A word-level tokenizer ``t0 … t99`` (the Encoder needs a tokenizer.json; the tests feed ids)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t3"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path / "tokenizer.json"))


def pad_id(config) -> int:
    return 1 if config.model_type == "mpnet" else config.pad_token_id


def batch(config, seed=0):
    """``(ids, mask)`` (3, SEQ): rows with 0, 3 and 5 padding tokens at the end."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, VOCAB, (3, SEQ)).astype(np.int32)
    mask = np.ones((3, SEQ), np.int32)
    for row, n in ((1, 3), (2, 5)):
        ids[row, SEQ - n:], mask[row, SEQ - n:] = pad_id(config), 0
    return ids, mask


def hf_hidden(model, ids, mask) -> np.ndarray:
    with torch.no_grad():
        out = model(input_ids=torch.as_tensor(ids, dtype=torch.long), attention_mask=torch.as_tensor(mask))
    return out.last_hidden_state.numpy()


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    """``(name, transformers model, its directory)``, built once per module."""
    config = CASES[request.param]()
    model = tiny_model(lambda: T.AutoModel.from_config(config))
    return request.param, model, save(model, tmp_path_factory.mktemp(request.param), write_tokenizer)


def test_hidden_states_agree_with_transformers_on_a_padded_batch(case):
    name, model, path = case
    enc = M.from_pretrained(path)
    assert isinstance(enc, M.Encoder) and enc.bert.config.model_type == model.config.model_type
    ids, mask = batch(model.config)
    assert_rel_close(enc.bert(ids, mask), hf_hidden(model, ids, mask), mask)


def test_uniformly_pruned_export_is_read_back_by_transformers(case, tmp_path):
    name, model, path = case
    enc = M.from_pretrained(path)
    prune_all(enc.bert.layers, 20)
    out = M.save_pretrained(enc, tmp_path / "out")
    written = json.loads((out / "config.json").read_text())
    assert written["hidden_dim" if model.config.model_type == "distilbert" else "intermediate_size"] == 20
    back = T.AutoModel.from_pretrained(out).eval()
    assert type(back) is type(model)
    ids, mask = batch(model.config, seed=2)
    assert_rel_close(enc.bert(ids, mask), hf_hidden(back, ids, mask), mask)
    if model.config.model_type != "distilbert":  # the pooler is carried over
        np.testing.assert_array_equal(back.pooler.dense.weight.detach().numpy(),
                                      model.pooler.dense.weight.detach().numpy())


@pytest.mark.slow  # the default run has one such case, for a DeiT (tests/test_hf_vision.py)
def test_compress_model_finds_every_mlp_without_a_spec(tmp_path):
    enc = M.from_pretrained(_write(tmp_path, CASES["mpnet-gelu"]()))  # the MLPs are one class in every family
    calibration = np.random.default_rng(1).integers(3, VOCAB, (4, SEQ)).astype(np.int32)
    _, report = jaxbsd.compress_model(enc, lambda m: m(calibration), key=jax.random.key(0), mlps=None,
                                      method="prune", ranks={"bert.layers.0.mlp": 20, "bert.layers.1.mlp": 20},
                                      refine=None)
    assert [r.path for r in report.mlps] == ["bert.layers.1.mlp", "bert.layers.0.mlp"]


def test_mpnet_buckets_match_transformers_far_past_the_test_length():
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    rel = np.arange(-300, 301)[None, :] - np.arange(0, 5)[:, None]
    expected = MPNetEncoder.relative_position_bucket(torch.as_tensor(rel)).numpy()
    np.testing.assert_array_equal(M.bert.modeling.relative_position_bucket(rel), expected)


# ----------------------------------------------------------------------------- bad input


def _write(tmp_path, config, *edits):
    """The checkpoint of ``config`` as ``transformers`` initialises it, with a tokenizer, then ``edits``."""
    return save(tiny_model(lambda: T.AutoModel.from_config(config), seed=None), tmp_path, write_tokenizer, *edits)


BAD = [
    ("distilbert", edit_tensors(lambda t: t.pop("transformer.layer.1.ffn.lin2.bias")),
     r"model.safetensors: missing tensor\(s\) \['transformer.layer.1.ffn.lin2.bias'\]"),
    ("mpnet", edit_tensors(lambda t: t.update({"encoder.relative_attention_bias.weight": np.zeros((32, 3), "f4")})),
     r"encoder.relative_attention_bias.weight has shape \(32, 3\), expected \(32, 4\)"),
    ("roberta", edit_config(position_embedding_type="relative_key"),
     r"config.json: position_embedding_type 'relative_key' is not supported"),
    ("mpnet", edit_config(relative_attention_num_buckets=16), r"config.json: relative_attention_num_buckets 16"),
    ("distilbert", edit_config(activation="swish"), r"config.json: hidden_act must be one of"),
    ("xlm-roberta", only_pytorch_bin, r"no model.safetensors \(only pytorch_model.bin"),
]


@pytest.mark.parametrize("model_type, edit, match", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_checkpoints_get_one_line_value_errors_naming_the_path(tmp_path, model_type, edit, match):
    config = CASES[next(n for n in sorted(CASES) if n.startswith(model_type + "-"))]()
    assert_refused(_write(tmp_path, config, edit), match)


def test_export_refuses_uneven_widths_pointing_to_save_compressed(tmp_path):
    enc = M.from_pretrained(_write(tmp_path / "src", CASES["distilbert-gelu"]()))
    prune_all(enc.bert.layers, (20, 10))
    with pytest.raises(ValueError, match=r"different hidden widths \[10, 20\].*save_compressed"):
        M.save_pretrained(enc, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_encoder_names_refuses_a_layer_description_of_the_wrong_length():
    from jaxbsd.models.bert.params import encoder_names

    with pytest.raises(ValueError, match=r"linears and norms must name 6 linears and 2 LayerNorms, got 5 and 2"):
        encoder_names(M.bert.BertConfig(), "encoder.layer.{i}", ("q", "k", "v", "o", "fc1"), ("n1", "n2"))
