"""Base-size Hugging Face checkpoints, one per family group, in the layouts the hub has them (slow step).

Random-init ``transformers`` models of the real checkpoints' sizes (layers cut where noted), saved as
the hub stores them: BERT-base (12 heads, 768 wide, 3072 MLP, vocabulary 30522, 2 layers) as a
``BertForPreTraining`` with ``gamma``/``beta`` LayerNorms; GPT-2 124M (all 12 layers) without the
``transformer.`` prefix and with the mask buffers; Qwen2-0.5B (896 wide, 14 heads / 2 key-value heads,
4864 MLP, vocabulary 151936, tied, 2 layers) in bfloat16 shards; ViT-base/16 at 224 pixels with 1000
classes (2 layers). Oracle: ``transformers`` reading the same directory in float32; fp32, ≤ 1e-5
relative on padded batches.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hf_oracle import assert_rel_close, tiny_model
from test_hf_layouts import _batch, _forward, _gamma_beta, _gpt2_hub, _hidden, _hub_config, _logits, _old_rope, \
    _rewrite_tensors, _shards, _vit_logits, _write_tokenizer

from jaxbsd import models

torch = pytest.importorskip("torch")
T = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

# weights N(0, 0.05²), biases N(0, 0.02²), norm weights U(0.5, 1.5): every tensor differs from its default
_REDRAW = dict(scale=0.05, bias=0.02, norms=True)


def test_bert_base_pretraining_checkpoint(tmp_path):
    config = T.BertConfig(num_hidden_layers=2, pad_token_id=0)  # bert-base-uncased's sizes otherwise
    assert (config.hidden_size, config.intermediate_size, config.vocab_size) == (768, 3072, 30522)
    model = tiny_model(lambda: T.BertForPreTraining(config), **_REDRAW)
    model.save_pretrained(tmp_path)
    _rewrite_tensors(tmp_path, _gamma_beta)
    _hub_config(tmp_path, architectures=["BertForMaskedLM"], gradient_checkpointing=False)
    _write_tokenizer(tmp_path)
    enc = models.from_pretrained(tmp_path)
    ids, mask = _batch(pad=0)
    ids = ids * 400  # ids across the vocabulary
    assert_rel_close(_forward(enc.bert, jnp.asarray(ids), jnp.asarray(mask)), _hidden(model.bert, ids, mask), mask)


def test_gpt2_124m_hub_checkpoint(tmp_path):
    config = T.GPT2Config()
    assert (config.n_embd, config.n_layer, config.vocab_size, config.n_positions) == (768, 12, 50257, 1024)
    model = tiny_model(lambda: T.GPT2LMHeadModel(config), **_REDRAW)
    model.save_pretrained(tmp_path)
    _gpt2_hub(tmp_path, model)
    ours = models.from_pretrained(tmp_path)
    assert models.count_params(ours) == sum(p.numel() for p in model.parameters()) == 124_439_808
    ids, mask = _batch()
    ids = ids * 700
    assert_rel_close(_forward(ours, jnp.asarray(ids), jnp.asarray(mask)), _logits(model, ids, mask), mask)


def test_qwen2_05b_bf16_sharded_checkpoint(tmp_path):
    config = T.Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=2,
                           num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True,
                           max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6)
    model = tiny_model(lambda: T.Qwen2ForCausalLM(config), **_REDRAW)
    model.to(torch.bfloat16).save_pretrained(tmp_path, max_shard_size="200MB")
    assert len(_shards(tmp_path)) >= 2
    _old_rope(tmp_path, theta=1000000.0)
    _hub_config(tmp_path, drop=("dtype",), torch_dtype="bfloat16", sliding_window=32768, max_window_layers=21)
    ours = models.from_pretrained(tmp_path)
    assert ours.config.rope_theta == 1e6 and ours.config.qkv_bias and ours.config.head_dim == 64
    ref = T.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids, mask = _batch()
    ids = ids * 2300
    assert_rel_close(_forward(ours, jnp.asarray(ids), jnp.asarray(mask)), _logits(ref, ids, mask), mask)


def test_vit_base_patch16_224_classifier(tmp_path):
    config = T.ViTConfig(num_hidden_layers=2, num_labels=1000)
    assert (config.hidden_size, config.image_size, config.patch_size) == (768, 224, 16)
    model = tiny_model(lambda: T.ViTForImageClassification(config), **_REDRAW)
    model.save_pretrained(tmp_path)
    ours = models.from_pretrained(tmp_path)
    x = np.random.default_rng(0).standard_normal((2, 224, 224, 3)).astype(np.float32)
    assert_rel_close(_forward(ours, jnp.asarray(x)), _vit_logits(model, x))
