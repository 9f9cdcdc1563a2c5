"""The layouts real Hugging Face hub checkpoints have, read by ``jaxbsd.models.from_pretrained``.

Hub checkpoints differ from what a fresh ``save_pretrained`` writes: large decoders come sharded
(``model.safetensors.index.json`` + ``model-0000i-of-0000n.safetensors``) and in bfloat16 or float16;
``bert-base-uncased`` names its LayerNorms ``gamma``/``beta`` and carries the pre-training heads;
``gpt2`` has no ``transformer.`` prefix and stores the attention-mask buffers; configs were written
by older ``transformers`` (``rope_theta`` and ``rope_scaling: null`` instead of ``rope_parameters``,
``torch_dtype``, ``_name_or_path``, ``gradient_checkpointing``). Each case builds such a layout
locally from a tiny random-init ``transformers`` model; the oracle is ``transformers`` reading the
same directory in float32 (stored half-precision weights upcast, as ours are), or the in-memory
model whose tensors were renamed. fp32, ≤ 1e-5 relative, on padded batches.
"""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hf_oracle import assert_refused, assert_rel_close, tiny_model

from jaxbsd import models

torch = pytest.importorskip("torch")
T = pytest.importorskip("transformers")

VOCAB, SEQ = 64, 8
_DEC = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, vocab_size=VOCAB,
            max_position_embeddings=32)
_ENC = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, vocab_size=VOCAB,
            max_position_embeddings=40)
_VIT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, image_size=16,
            patch_size=8, num_labels=3)
#: Llama 3.1's RoPE scaling; with θ = 500000 and head_dim 8 the wavelengths 6, 167, 4437 and 118000
#: fall in the kept, kept, interpolated and scaled bands.
_LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "high_freq_factor": 4.0,
           "low_freq_factor": 1.0, "original_max_position_embeddings": 8192}
#: Keys every hub config carries that change nothing jaxbsd computes.
_HUB_KEYS = {"transformers_version": "4.40.0", "_name_or_path": "someone/some-model", "use_cache": True,
             "gradient_checkpointing": False}


# ----------------------------------------------------------------------------- building hub layouts


def _rewrite_tensors(path, change) -> None:
    """``change(tensors)`` -> the new ``{name: torch tensor}`` of ``path/model.safetensors`` (any dtype)."""
    from safetensors.torch import load_file, save_file

    tensors = change(load_file(str(path / "model.safetensors")))
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def _hub_config(path, drop=(), **fields) -> None:
    """``config.json`` with ``fields`` set (None written as null), the keys ``drop`` removed."""
    data = {k: v for k, v in json.loads((path / "config.json").read_text()).items() if k not in drop}
    (path / "config.json").write_text(json.dumps({**data, **fields}))


def _old_rope(path, theta=10000.0) -> None:
    """The RoPE fields as ``transformers`` 4 wrote them: ``rope_theta`` and ``rope_scaling`` (null
    unless scaled)."""
    data = json.loads((path / "config.json").read_text())
    rope = dict(data.pop("rope_parameters", None) or {})
    theta = rope.pop("rope_theta", theta)
    data.update(rope_theta=theta, rope_scaling=None if rope.get("rope_type", "default") == "default" else rope)
    (path / "config.json").write_text(json.dumps(data))


def _shards(path) -> list[str]:
    return sorted(p.name for p in path.glob("model-*-of-*.safetensors"))


def _write_tokenizer(path) -> None:
    from tokenizers import Tokenizer, models as tok_models, pre_tokenizers

    tok = Tokenizer(tok_models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t3"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path / "tokenizer.json"))


def _batch(seed=0, pad=1):
    """``(ids, mask)`` ``(3, SEQ)``: rows 1 and 2 right-padded after 5 and 3 tokens (``pad`` ids there)."""
    ids = np.random.default_rng(seed).integers(3, VOCAB, (3, SEQ))
    mask = np.ones((3, SEQ), np.int64)
    for row, n in ((1, 5), (2, 3)):
        ids[row, n:], mask[row, n:] = pad, 0
    return ids, mask


@nnx.jit
def _forward(model, *inputs):
    # one compiled program per model: quicker than the eager call's op-by-op compiles
    return model(*inputs)


def _logits(model, ids, mask) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.float().numpy()


def _hidden(model, ids, mask) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state.numpy()


# ----------------------------------------------------------------------------- decoders

#: name -> (transformers config class, arguments, stored torch dtype, shard size or None).
DECODERS = {
    # Qwen2.5-0.5B-like: q/k/v biases, explicit head_dim, tied, sliding_window null, bf16, one file
    "qwen2-bf16-tied": ("Qwen2Config", {**_DEC, "num_key_value_heads": 2, "tie_word_embeddings": True,
                                        "head_dim": 8}, "bfloat16", None),
    # TinyLlama / Llama-2-like: GQA, untied, bf16 in shards
    "llama-bf16-sharded": ("LlamaConfig", {**_DEC, "num_key_value_heads": 2}, "bfloat16", "20KB"),
    # Llama-3.2-1B-like: tied, llama3 RoPE scaling (all three frequency bands at head_dim 8), bf16
    "llama3-bf16-tied": ("LlamaConfig", {**_DEC, "num_key_value_heads": 2, "tie_word_embeddings": True,
                                         "rope_parameters": _LLAMA3}, "bfloat16", None),
    # Mistral-7B-v0.3-like: sliding_window null, fp16 in shards
    "mistral-fp16-sharded": ("MistralConfig", {**_DEC, "num_key_value_heads": 1, "sliding_window": None},
                             "float16", "20KB"),
}


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    built = {}

    def get(name):
        if name not in built:
            cls, kwargs, dtype, shard = DECODERS[name]
            model = tiny_model(lambda: T.AutoModelForCausalLM.from_config(getattr(T, cls)(**kwargs)), seed=3,
                               scale=0.15, bias=0.2, norms=True)
            path = tmp_path_factory.mktemp(name)
            model.to(getattr(torch, dtype)).save_pretrained(path, **({"max_shard_size": shard} if shard else {}))
            _old_rope(path)
            _hub_config(path, drop=("dtype",), torch_dtype=dtype, **_HUB_KEYS)
            built[name] = path
        return built[name]

    return get


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_half_precision_and_sharded_decoders_agree_with_transformers(decoder, name):
    path = decoder(name)
    assert bool(_shards(path)) == (DECODERS[name][3] is not None)
    model = models.from_pretrained(path)
    assert all(leaf.dtype == jnp.float32 for leaf in _param_leaves(model))
    ref = T.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()  # the same upcast weights
    ids, mask = _batch()
    ours = _forward(model, jnp.asarray(ids), jnp.asarray(mask))
    assert ours.dtype == jnp.float32
    assert_rel_close(ours, _logits(ref, ids, mask), mask)


def _param_leaves(model):
    return [v[...] for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param))]


def test_a_decoder_loads_in_the_dtype_asked(decoder):
    path = decoder("llama-bf16-sharded")
    model = models.from_pretrained(path, dtype=jnp.bfloat16)
    assert {leaf.dtype for leaf in _param_leaves(model)} == {jnp.dtype(jnp.bfloat16)}
    ids, mask = _batch()
    ours = np.asarray(_forward(model, jnp.asarray(ids), jnp.asarray(mask)), np.float32)
    ref = _logits(T.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), ids, mask)
    assert_rel_close(ours, ref, mask, rel=0.05)  # bfloat16 arithmetic: a few ulps of 2^-8 through two layers


def test_the_shard_index_is_checked(decoder, tmp_path):
    import shutil

    path = shutil.copytree(decoder("llama-bf16-sharded"), tmp_path / "m")
    (path / _shards(path)[-1]).unlink()
    assert_refused(path, r"model.safetensors.index.json: shard 'model-0000\d-of-0000\d.safetensors' is missing")
    for shard in _shards(path):
        (path / shard).unlink()
    (path / "model.safetensors.index.json").rename(path / "pytorch_model.bin.index.json")
    assert_refused(path, r"no model.safetensors \(only pytorch_model.bin.index.json is there")


def test_other_rope_scaling_is_refused_by_name(decoder, tmp_path):
    import shutil

    path = shutil.copytree(decoder("llama-bf16-sharded"), tmp_path / "m")
    _hub_config(path, rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32})
    assert_refused(path, r"rope_scaling type 'yarn' is not supported")
    _hub_config(path, rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0})
    assert_refused(path, r"rope_scaling type 'llama3' needs \['high_freq_factor', 'original_max_position_embeddings'\]")


def test_llama3_rope_tables_match_transformers_over_every_band():
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from jaxbsd.models.llama import rope_tables

    scaling = {**_LLAMA3, "rope_theta": 10000.0, "original_max_position_embeddings": 64}  # bands within 512
    config = T.LlamaConfig(**{**_DEC, "hidden_size": 128, "max_position_embeddings": 512}, rope_parameters=scaling)
    ours = models.llama.LlamaConfig.from_hf(config.to_dict())
    assert ours.rope_llama3 == (1.0, 4.0, 64) and ours.rope_factor == 32.0
    positions = torch.arange(512)[None]
    with torch.no_grad():
        cos, sin = LlamaRotaryEmbedding(config)(torch.zeros(1, 512, 32), positions)
    our_cos, our_sin = rope_tables(512, 32, ours.rope_theta, ours.rope_factor, jnp.float32, ours.rope_llama3)
    np.testing.assert_allclose(np.asarray(our_cos)[0, :, 0], cos[0].numpy(), atol=2e-5)
    np.testing.assert_allclose(np.asarray(our_sin)[0, :, 0], sin[0].numpy(), atol=2e-5)
    plain, _ = rope_tables(512, 32, ours.rope_theta, None, jnp.float32)
    assert np.abs(np.asarray(plain) - np.asarray(our_cos)).max() > 0.5  # the scaling shows
    assert models.llama.LlamaConfig.from_hf(ours.to_hf()) == ours  # written back as read


def _gpt2_hub(path, model) -> None:
    """The hub ``gpt2`` layout: ``GPT2Model`` names (no ``transformer.``), the ``attn.bias`` causal-mask
    and ``attn.masked_bias`` buffers stored, no ``lm_head`` (tied)."""
    n = model.config.n_positions

    def change(tensors):
        out = {k.removeprefix("transformer."): v for k, v in tensors.items() if k != "lm_head.weight"}
        for i in range(model.config.n_layer):
            out[f"h.{i}.attn.bias"] = torch.tril(torch.ones(n, n)).view(1, 1, n, n)
            out[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
        return out

    _rewrite_tensors(path, change)
    _hub_config(path, drop=("dtype",), torch_dtype="float32", n_ctx=n, **_HUB_KEYS)


def test_gpt2_in_the_hub_layout_agrees_with_transformers(tmp_path):
    config = T.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=16, bos_token_id=0,
                          eos_token_id=1)
    model = tiny_model(lambda: T.GPT2LMHeadModel(config), scale=0.15, bias=0.2, norms=True)
    model.save_pretrained(tmp_path)
    _gpt2_hub(tmp_path, model)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert "h.0.attn.c_attn.weight" in f.keys() and "wte.weight" in f.keys() and "h.1.attn.bias" in f.keys()
    ours = models.from_pretrained(tmp_path)
    ids, mask = _batch()
    ref = T.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    logits = _forward(ours, jnp.asarray(ids), jnp.asarray(mask))
    assert_rel_close(logits, _logits(ref, ids, mask), mask)
    assert_rel_close(logits, _logits(model, ids, mask), mask)


# ----------------------------------------------------------------------------- encoders


def _gamma_beta(tensors):
    """LayerNorm ``weight``/``bias`` renamed ``gamma``/``beta``, as bert-base-uncased's checkpoint has them."""
    def rename(k):
        if "LayerNorm." in k:
            return k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        return k

    return {rename(k): v for k, v in tensors.items()}


@pytest.mark.parametrize("head", ["BertForPreTraining", "BertModel"])
def test_bert_with_gamma_beta_norms_heads_and_pooler_agrees_with_transformers(tmp_path, head):
    config = T.BertConfig(**_ENC, pad_token_id=1)
    model = tiny_model(lambda: getattr(T, head)(config))
    model.save_pretrained(tmp_path)
    prefix = "bert." if head == "BertForPreTraining" else ""
    # older checkpoints also store the int64 position_ids buffer
    _rewrite_tensors(tmp_path, lambda t: {**_gamma_beta(t), f"{prefix}embeddings.position_ids": torch.arange(40)[None]})
    _hub_config(tmp_path, drop=("dtype",), architectures=["BertForMaskedLM"], torch_dtype="float32",
                position_embedding_type="absolute", **_HUB_KEYS)
    _write_tokenizer(tmp_path)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert f"{prefix}embeddings.LayerNorm.gamma" in names and f"{prefix}pooler.dense.weight" in names
    assert (head == "BertForPreTraining") == ("cls.seq_relationship.weight" in names)
    enc = models.from_pretrained(tmp_path)
    bert = model.bert if head == "BertForPreTraining" else model
    ids, mask = _batch()
    hidden = _forward(enc.bert, jnp.asarray(ids), jnp.asarray(mask))
    assert_rel_close(hidden, _hidden(bert, ids, mask), mask)
    np.testing.assert_array_equal(np.asarray(enc.bert.pooler_kernel[...]).T, bert.pooler.dense.weight.detach().numpy())
    ref = T.AutoModel.from_pretrained(tmp_path).eval()  # transformers reads gamma/beta too
    assert_rel_close(hidden, _hidden(ref, ids, mask), mask)


@pytest.mark.parametrize("family", ["bert", pytest.param("mpnet", marks=pytest.mark.slow)])
def test_sharded_bf16_encoders_agree_and_export_one_file(tmp_path, family):
    config = T.BertConfig(**_ENC, pad_token_id=1) if family == "bert" else T.MPNetConfig(**_ENC)
    model = tiny_model(lambda: T.AutoModel.from_config(config))
    model.to(torch.bfloat16).save_pretrained(tmp_path / "in", max_shard_size="20KB")
    _write_tokenizer(tmp_path / "in")
    assert _shards(tmp_path / "in")
    enc = models.from_pretrained(tmp_path / "in")
    ref = T.AutoModel.from_pretrained(tmp_path / "in", dtype=torch.float32).eval()
    ids, mask = _batch()
    assert_rel_close(_forward(enc.bert, jnp.asarray(ids), jnp.asarray(mask)), _hidden(ref, ids, mask), mask)
    out = models.save_pretrained(enc, tmp_path / "out")  # one float32 file, no stale shards or index
    assert not _shards(out) and not (out / "model.safetensors.index.json").exists()
    back = T.AutoModel.from_pretrained(out).eval()
    assert_rel_close(_hidden(back, ids, mask), _hidden(ref, ids, mask), mask)


# ----------------------------------------------------------------------------- vision


def _vit_logits(model, x) -> np.ndarray:
    with torch.no_grad():
        return model(pixel_values=torch.as_tensor(x.transpose(0, 3, 1, 2))).logits.float().numpy()


@pytest.mark.parametrize("variant", ["pooler", "no-prefix", "bf16-sharded"])
def test_vit_layouts_agree_with_transformers(tmp_path, variant):
    model = tiny_model(lambda: T.ViTForImageClassification(T.ViTConfig(**_VIT)))
    if variant == "bf16-sharded":
        model.to(torch.bfloat16).save_pretrained(tmp_path, max_shard_size="10KB")
        assert _shards(tmp_path)
        model = T.ViTForImageClassification.from_pretrained(tmp_path, dtype=torch.float32).eval()
    else:
        model.save_pretrained(tmp_path)
        d = model.config.hidden_size
        gen = torch.Generator().manual_seed(5)
        pooler = {"pooler.dense.weight": torch.randn(d, d, generator=gen), "pooler.dense.bias": torch.randn(d, generator=gen)}
        if variant == "pooler":  # a ViTModel's pooler kept beside the head: not on the classifier's path
            _rewrite_tensors(tmp_path, lambda t: {**t, **{f"vit.{k}": v for k, v in pooler.items()}})
        else:  # backbone names without ``vit.``, as a ViTModel has them, the head beside them
            _rewrite_tensors(tmp_path, lambda t: {**{k.removeprefix("vit."): v for k, v in t.items()}, **pooler})
    _hub_config(tmp_path, drop=("dtype",), torch_dtype="float32", **_HUB_KEYS)
    x = np.random.default_rng(0).standard_normal((3, 16, 16, 3)).astype(np.float32)
    ours = models.from_pretrained(tmp_path)
    assert_rel_close(_forward(ours, jnp.asarray(x)), _vit_logits(model, x))


def test_a_vit_backbone_without_a_head_is_refused_by_name(tmp_path):
    model = tiny_model(lambda: T.ViTModel(T.ViTConfig(**_VIT)))
    model.save_pretrained(tmp_path)
    assert_refused(tmp_path, r"missing tensor\(s\) \['classifier.weight'\]: a ViTModel backbone without a "
                             "classification head")


# ----------------------------------------------------------------------------- hub configs

#: ``config.json`` of real hub checkpoints, field for field as published (label maps left out).
HUB_CONFIGS = {
    "bert-base-uncased": {
        "architectures": ["BertForMaskedLM"], "attention_probs_dropout_prob": 0.1, "gradient_checkpointing": False,
        "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 768, "initializer_range": 0.02,
        "intermediate_size": 3072, "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "bert",
        "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 0, "position_embedding_type": "absolute",
        "transformers_version": "4.6.0.dev0", "type_vocab_size": 2, "use_cache": True, "vocab_size": 30522},
    "gpt2": {
        "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
        "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12,
        "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": None, "summary_first_dropout": 0.1,
        "summary_proj_to_labels": True, "summary_type": "cls_index", "summary_use_proj": True,
        "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}}, "vocab_size": 50257},
    "Qwen2.5-0.5B": {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
        "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2",
        "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.40.1", "use_cache": True, "use_mrope": False, "use_sliding_window": False,
        "vocab_size": 151936},
    "TinyLlama-1.1B": {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 5632,
        "max_position_embeddings": 2048, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 22,
        "num_key_value_heads": 4, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
        "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.35.0", "use_cache": True, "vocab_size": 32000},
    "Llama-3.2-1B": {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
        "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": False,
        "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256},
    "Mistral-7B-v0.1": {
        "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
        "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
        "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.34.0.dev0", "use_cache": True, "vocab_size": 32000},
    "vit-base-patch16-224": {
        "_name_or_path": "google/vit-base-patch16-224", "architectures": ["ViTForImageClassification"],
        "attention_probs_dropout_prob": 0.0, "encoder_stride": 16, "hidden_act": "gelu", "hidden_dropout_prob": 0.0,
        "hidden_size": 768, "image_size": 224, "initializer_range": 0.02, "intermediate_size": 3072,
        "layer_norm_eps": 1e-12, "model_type": "vit", "num_attention_heads": 12, "num_channels": 3,
        "num_hidden_layers": 12, "num_labels": 1000, "patch_size": 16, "qkv_bias": True,
        "transformers_version": "4.13.0.dev0"},
}


def _our_config(data):
    kind = data["model_type"]
    if kind == "bert":
        return models.bert.BertConfig.from_hf(data, "config.json")
    if kind == "gpt2":
        return models.gpt2.GPT2Config.from_hf(data)
    if kind == "vit":
        from jaxbsd.models.vit.params import config_from_hf

        return config_from_hf(data, "config.json")
    return models.llama.LlamaConfig.from_hf(data)


@pytest.mark.parametrize("name", sorted(HUB_CONFIGS))
def test_hub_configs_read_as_transformers_reads_them(name):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    data = HUB_CONFIGS[name]
    ours, theirs = _our_config(data), T.CONFIG_MAPPING[data["model_type"]](**data)
    if data["model_type"] in models.llama.MODEL_TYPES:
        for field in ("hidden_size", "intermediate_size", "num_key_value_heads", "rms_norm_eps", "tie_word_embeddings",
                      "vocab_size"):
            assert getattr(ours, field) == getattr(theirs, field), field
        heads = theirs.num_attention_heads
        assert ours.head_dim == (getattr(theirs, "head_dim", None) or theirs.hidden_size // heads)
        assert ours.sliding_window == (theirs.sliding_window if data["model_type"] == "mistral" else None)
        assert ours.qkv_bias == (data["model_type"] == "qwen2")
        rope = theirs.rope_parameters
        assert ours.rope_theta == rope["rope_theta"]
        if rope["rope_type"] == "default":
            expected = 1.0 / (rope["rope_theta"] ** (torch.arange(0, ours.head_dim, 2).float() / ours.head_dim))
        else:
            expected, _ = ROPE_INIT_FUNCTIONS[rope["rope_type"]](theirs, "cpu")
        from jaxbsd.models.llama import rope_frequencies

        got = rope_frequencies(ours.head_dim, ours.rope_theta, ours.rope_factor, jnp.float32, ours.rope_llama3)
        np.testing.assert_allclose(np.asarray(got), expected.numpy(), rtol=1e-6)
    elif data["model_type"] == "gpt2":
        assert (ours.n_inner, ours.activation, ours.tie_word_embeddings) == (3072, "gelu_tanh", True)
    elif data["model_type"] == "bert":
        assert (ours.hidden_size, ours.intermediate_size, ours.type_vocab_size) == (768, 3072, 2)
        assert ours.layer_norm_eps == theirs.layer_norm_eps
    else:
        assert (ours.dim, ours.mlp_dim, ours.num_classes, ours.num_patches) == (768, 3072, 1000, 196)


def test_a_sharded_deit_with_teacher_agrees_with_transformers(tmp_path):
    # the heads follow the tensor names, here read from the shard index
    model = tiny_model(lambda: T.DeiTForImageClassificationWithTeacher(T.DeiTConfig(**_VIT)))
    model.save_pretrained(tmp_path, max_shard_size="10KB")
    assert _shards(tmp_path)
    ours = models.from_pretrained(tmp_path)
    assert ours.distilled
    x = np.random.default_rng(1).standard_normal((3, 16, 16, 3)).astype(np.float32)
    assert_rel_close(_forward(ours, jnp.asarray(x)), _vit_logits(model, x))
