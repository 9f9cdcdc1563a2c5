"""Hugging Face decoders (jaxbsd.models.gpt2, jaxbsd.models.llama) against `transformers`, both ways.

Oracle: `transformers` itself (a test-only dependency). Each case builds a tiny random-init model
from a `transformers` config (weights redrawn large enough that attention is far from uniform and
every norm weight and bias differs from its default), saves it as safetensors, and the logits of
`jaxbsd.models.from_pretrained` must agree with the model's own on a right-padded batch (real
positions only, fp32, ≤ 1e-5 relative). The other way: the model pruned uniformly by
`compress_model`, written by `jaxbsd.models.save_pretrained`, read back by
`AutoModelForCausalLM.from_pretrained`, must give the compressed jaxbsd model's logits.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hf_oracle import assert_rel_close, edit_config, edit_tensors, only_pytorch_bin, save, tiny_model

import jaxbsd
from jaxbsd import models

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB, SEQ = 64, 8
_LLAMA = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, vocab_size=VOCAB,
              max_position_embeddings=32)
_GPT2 = dict(n_embd=32, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=16, bos_token_id=0, eos_token_id=1)

#: name -> (transformers config class, its arguments): GQA vs MHA, tied vs untied, biases, eps,
#: activations, RoPE theta and linear scaling, Qwen3's q/k norms and a head width ≠ hidden/heads.
CASES = {
    "gpt2-tied-gelu_new": ("GPT2Config", _GPT2),
    "gpt2-untied-relu-inner40": ("GPT2Config", {**_GPT2, "tie_word_embeddings": False, "activation_function": "relu",
                                                "n_inner": 40, "layer_norm_epsilon": 1e-3}),
    "gpt2-gelu": ("GPT2Config", {**_GPT2, "activation_function": "gelu"}),
    "llama-gqa-untied": ("LlamaConfig", {**_LLAMA, "num_key_value_heads": 2}),
    "llama-mha-tied-biases": ("LlamaConfig", {**_LLAMA, "num_key_value_heads": 4, "tie_word_embeddings": True,
                                              "attention_bias": True, "mlp_bias": True, "rms_norm_eps": 1e-4,
                                              "rope_theta": 500.0}),
    "llama-linear-rope-gelu_tanh": ("LlamaConfig", {**_LLAMA, "num_key_value_heads": 1,
                                                    "hidden_act": "gelu_pytorch_tanh",
                                                    "rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    "mistral-gqa-window": ("MistralConfig", {**_LLAMA, "num_key_value_heads": 2, "sliding_window": SEQ}),
    "qwen2-gqa-tied": ("Qwen2Config", {**_LLAMA, "num_key_value_heads": 2, "tie_word_embeddings": True}),
    "qwen3-gqa-head16-bias": ("Qwen3Config", {**_LLAMA, "num_key_value_heads": 2, "head_dim": 16,
                                              "attention_bias": True}),
    "qwen3-mha-untied": ("Qwen3Config", {**_LLAMA, "num_key_value_heads": 4, "head_dim": 8, "rms_norm_eps": 1e-5}),
}
#: One uniformly pruned export per model type, all in the default run (their checkpoints are built for the
#: load cases anyway).
ROUND_TRIP = ["gpt2-untied-relu-inner40", "llama-mha-tied-biases", "mistral-gqa-window", "qwen2-gqa-tied",
              "qwen3-gqa-head16-bias"]


@nnx.jit
def _forward(model, ids, mask):
    # One compiled program per config: far quicker than the first eager call's op-by-op compiles.
    return model(ids, mask)


@nnx.jit
def _lm_forward(lm, ids):
    return lm(ids)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """``checkpoint(name) -> (directory, transformers model)``, each case built and saved once."""
    built = {}

    def get(name):
        if name not in built:
            cls, kwargs = CASES[name]
            # weights N(0, 0.15²), biases N(0, 0.2²), norm weights U(0.5, 1.5)
            model = tiny_model(lambda: transformers.AutoModelForCausalLM.from_config(getattr(transformers, cls)(**kwargs)),
                               seed=len(built), scale=0.15, bias=0.2, norms=True)
            built[name] = (save(model, tmp_path_factory.mktemp(name)), model)
        return built[name]

    return get


def _batch(seed=0):
    """``(ids, mask)`` ``(4, SEQ)``: rows 1 and 2 right-padded after 5 and 3 tokens; row 3 left-padded by 2
    (positions still count from column 0, as in `transformers` without ``position_ids``), so that
    attending a padded key would show."""
    ids = np.random.default_rng(seed).integers(0, VOCAB, (4, SEQ))
    mask = np.ones((4, SEQ), np.int64)
    mask[1, 5:] = 0
    mask[2, 3:] = 0
    mask[3, :2] = 0
    return ids, mask


def _hf_logits(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()


def _assert_close(ours, ref, mask, tol=1e-5):
    assert np.asarray(ours).dtype == np.float32
    assert_rel_close(ours, ref, mask, tol)


#: The load cases of the slow step (the default run keeps every model type and variant once).
SLOW_LOADS = ("gpt2-gelu", "llama-gqa-untied", "qwen3-mha-untied")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_LOADS else n for n in CASES])
def test_logits_agree_with_transformers(checkpoint, name):
    path, ref = checkpoint(name)
    model = models.from_pretrained(path)
    ids, mask = _batch()
    logits = _forward(model, jnp.asarray(ids), jnp.asarray(mask))
    assert logits.shape == (4, SEQ, VOCAB)
    _assert_close(logits, _hf_logits(ref, ids, mask), mask)


def test_family_classes_and_blocks_are_jaxbsd_mlps(checkpoint):
    gpt2 = models.from_pretrained(checkpoint("gpt2-tied-gelu_new")[0])
    qwen = models.from_pretrained(checkpoint("qwen3-mha-untied")[0])
    assert isinstance(gpt2, models.gpt2.GPT2) and isinstance(qwen, models.llama.Llama)
    assert all(isinstance(b.mlp, models.MLP) and b.mlp.activation == "gelu_tanh" for b in gpt2.blocks)
    assert all(isinstance(b.mlp, models.GatedMLP) and b.mlp.activation == "silu" for b in qwen.blocks)
    assert gpt2.config.n_inner == 4 * 32 and qwen.config.head_dim == 8 and qwen.config.qk_norm


@pytest.mark.parametrize("name", ROUND_TRIP)
def test_uniformly_pruned_export_reads_back_in_transformers(checkpoint, name, tmp_path):
    path, _ = checkpoint(name)
    model = models.from_pretrained(path)
    calibration = jnp.asarray(np.random.default_rng(1).integers(0, VOCAB, (16, SEQ)))
    model, report = jaxbsd.compress_model(model, calibration, key=jax.random.key(0), method="prune",
                                          reduction=0.1, refine=None)
    assert sorted(r.path for r in report.mlps) == ["blocks.0.mlp", "blocks.1.mlp"]  # found without a spec
    widths = {b.mlp.hidden for b in model.blocks}
    full = 40 if name.startswith("gpt2") else 48
    assert len(widths) == 1 and widths.pop() < full
    out = models.save_pretrained(model, tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert config["n_inner" if name.startswith("gpt2") else "intermediate_size"] == model.blocks[0].mlp.hidden
    ref = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert sum(p.numel() for p in ref.parameters()) == models.count_params(model)
    ids, mask = _batch(seed=2)
    _assert_close(_forward(model, jnp.asarray(ids), jnp.asarray(mask)), _hf_logits(ref, ids, mask), mask)


def test_untouched_export_copies_the_source_files(checkpoint, tmp_path):
    path, ref = checkpoint("llama-gqa-untied")
    (path / "tokenizer.json").write_text("{}")
    model = models.from_pretrained(path)
    out = models.save_pretrained(model, tmp_path / "out")
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= set(os.listdir(out))
    again = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    for (n, a), (_, b) in zip(ref.state_dict().items(), again.state_dict().items()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=n)


# ----------------------------------------------------------------------------- refused exports


def test_low_rank_decoupled_and_uneven_exports_are_refused(checkpoint, tmp_path):
    from jaxbsd.models.compressed import LowRankGatedMLP, LowRankLinear, PrunedGatedMLP

    model = models.from_pretrained(checkpoint("qwen2-gqa-tied")[0])
    mlp = model.blocks[0].mlp
    Kg, Ku, Kd = (layer.kernel[...] for layer in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
    low = [LowRankLinear(K[:, :4], jnp.eye(4, K.shape[1], dtype=K.dtype), None) for K in (Kg, Ku, Kd)]
    model.blocks[0].mlp = LowRankGatedMLP(*low, "silu")
    with pytest.raises(ValueError, match=r"no longer a standard qwen2 model \(blocks\.0\.mlp: LowRankGatedMLP "
                                         r"is not a gated MLP.*save_compressed"):
        models.save_pretrained(model, tmp_path / "lowrank")
    model.blocks[0].mlp = models.MLP(32, 8, activation="silu", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"blocks\.0\.mlp: MLP is not a gated MLP"):
        models.save_pretrained(model, tmp_path / "plain")
    model.blocks[0].mlp = PrunedGatedMLP(Kg[:, :20], None, Ku[:, :20], None, Kd[:20], None, "silu")
    with pytest.raises(ValueError, match=r"different hidden widths \[20, 48\].*save_compressed"):
        models.save_pretrained(model, tmp_path / "uneven")
    gpt2 = models.from_pretrained(checkpoint("gpt2-tied-gelu_new")[0])
    gpt2.blocks[1].mlp = models.MLP(32, 128, activation="gelu", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"standard GPT-2 \(blocks\.1\.mlp: MLP has activation 'gelu', the "
                                         r"config 'gelu_tanh'"):
        models.save_pretrained(gpt2, tmp_path / "gelu")
    assert not any((tmp_path / n).exists() for n in ("lowrank", "plain", "uneven", "gelu"))


def test_an_mlp_whose_linears_carry_more_parameters_is_refused(checkpoint, tmp_path):
    # a LoRA layer is an nnx.Linear with two more parameters, which the checkpoint has no place for
    gpt2 = models.from_pretrained(checkpoint("gpt2-tied-gelu_new")[0])
    gpt2.blocks[0].mlp.fc1 = nnx.LoRALinear(32, 128, lora_rank=2, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"blocks\.0\.mlp: MLP holds parameters besides fc1 and fc2"):
        models.save_pretrained(gpt2, tmp_path / "gpt2")
    qwen = models.from_pretrained(checkpoint("qwen2-gqa-tied")[0])
    qwen.blocks[1].mlp.up_proj = nnx.LoRALinear(32, 48, lora_rank=2, use_bias=False, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"blocks\.1\.mlp: GatedMLP holds parameters besides its three projections"):
        models.save_pretrained(qwen, tmp_path / "qwen")
    assert not any((tmp_path / n).exists() for n in ("gpt2", "qwen"))


# ----------------------------------------------------------------------------- bad input


def _copy(checkpoint, name, tmp_path, **config_changes):
    src, _ = checkpoint(name)
    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    if config_changes:
        edit_config(**config_changes)(dst)
    return dst


def test_unsupported_model_type_lists_the_supported_ones(checkpoint, tmp_path):
    path = _copy(checkpoint, "llama-gqa-untied", tmp_path, model_type="falcon")
    with pytest.raises(ValueError, match=r"config\.json: model_type is 'falcon'; jaxbsd reads .*'gpt2'.*'qwen3'"):
        models.from_pretrained(path)


def test_missing_tensor_is_named(checkpoint, tmp_path):
    def drop(tensors):
        del tensors["model.layers.1.self_attn.k_norm.weight"], tensors["lm_head.weight"]

    path = _copy(checkpoint, "qwen3-mha-untied", tmp_path)
    edit_tensors(drop)(path)
    with pytest.raises(ValueError, match=r"model\.safetensors: missing tensor\(s\) \['model\.layers\.1\.self_attn"
                                         r"\.k_norm\.weight', 'lm_head\.weight'\]"):
        models.from_pretrained(path)


def test_shape_mismatch_gives_both_shapes(checkpoint, tmp_path):
    path = _copy(checkpoint, "gpt2-tied-gelu_new", tmp_path, n_inner=64)
    with pytest.raises(ValueError, match=r"model\.safetensors: .*transformer\.h\.0\.mlp\.c_fc\.weight has shape "
                                         r"\(32, 128\), expected \(32, 64\)"):
        models.from_pretrained(path)


@pytest.mark.parametrize("name, change, message", [
    ("llama-gqa-untied", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}},
     "rope_parameters type 'yarn' is not supported"),
    ("llama-gqa-untied", {"rope_parameters": None, "rope_scaling": {"type": "dynamic", "factor": 2.0}},
     "rope_scaling type 'dynamic' is not supported"),
    ("llama-gqa-untied", {"hidden_act": "quick_gelu"}, "hidden_act 'quick_gelu' is not supported"),
    ("qwen2-gqa-tied", {"use_sliding_window": True}, "use_sliding_window is true"),
    ("gpt2-tied-gelu_new", {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx=True"),
    ("gpt2-tied-gelu_new", {"activation_function": "gelu_10"}, "activation_function 'gelu_10' is not supported"),
])
def test_unsupported_config_option_is_named(checkpoint, tmp_path, name, change, message):
    path = _copy(checkpoint, name, tmp_path, **change)
    with pytest.raises(ValueError, match=re.escape(f"{path / 'config.json'}: ") + ".*" + re.escape(message)):
        models.from_pretrained(path)


def test_only_pytorch_model_bin_is_refused(checkpoint, tmp_path):
    path = _copy(checkpoint, "mistral-gqa-window", tmp_path)
    only_pytorch_bin(path)
    with pytest.raises(ValueError, match=r"no model\.safetensors \(only pytorch_model\.bin"):
        models.from_pretrained(path)


def test_input_longer_than_the_sliding_window_is_refused(checkpoint):
    model = models.from_pretrained(checkpoint("mistral-gqa-window")[0])
    with pytest.raises(ValueError, match=r"9 positions, more than sliding_window \(8\)"):
        model(jnp.zeros((1, SEQ + 1), jnp.int32))


# ----------------------------------------------------------------------------- the character LM as a Llama


@pytest.fixture(scope="module")
def char_lm():
    from jaxbsd.data import CharVocab

    vocab = CharVocab()
    lm = models.LM(models.LMConfig.tiny(vocab_size=vocab.size, mlp_bias=True, rope_base=100.0),
                   rngs=nnx.Rngs(3))
    for _, p in nnx.iter_graph(lm):  # sharper than the init, and norm weights other than 1
        if isinstance(p, nnx.Param):
            p.set_value(p[...] * 4 if p.ndim == 2 else p[...] + jnp.linspace(0.5, 1.5, p.shape[0]))
    return lm, vocab


def test_character_lm_exports_as_llama_with_its_tokenizer(char_lm, tmp_path):
    lm, vocab = char_lm
    text = "def f(x):\n\treturn x  # é"
    out = models.llama.save_lm_pretrained(lm, tmp_path / "lm", chars=vocab.CHARS)
    ref = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(ref).__name__ == "LlamaForCausalLM" and ref.config.tie_word_embeddings
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"))
    ids = np.asarray(tokenizer(text)["input_ids"])
    np.testing.assert_array_equal(ids, vocab.encode(text))
    assert tokenizer.decode(ids) == vocab.decode(ids)
    ids = ids[None, :lm.config.context]
    mask = np.ones_like(ids)
    _assert_close(_lm_forward(lm, jnp.asarray(ids)), _hf_logits(ref, ids, mask), mask)


@pytest.mark.slow
def test_pruned_character_lm_exports_as_llama(char_lm, tmp_path):
    lm, vocab = char_lm
    lm = nnx.clone(lm)
    calibration = jnp.asarray(np.random.default_rng(4).integers(0, vocab.size, (4, 16)))
    jaxbsd.compress_model(lm, calibration, key=jax.random.key(0), method="prune", reduction=0.1, refine=None)
    widths = {b.mlp.hidden for b in lm.blocks}
    assert len(widths) == 1 and widths.pop() < lm.config.mlp_dim
    ref = transformers.AutoModelForCausalLM.from_pretrained(models.llama.save_lm_pretrained(lm, tmp_path / "lm"))
    ids = np.random.default_rng(5).integers(0, vocab.size, (2, 16))
    mask = np.ones_like(ids)
    _assert_close(_lm_forward(lm, jnp.asarray(ids)), _hf_logits(ref.eval(), ids, mask), mask)
