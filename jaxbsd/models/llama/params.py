"""Hugging Face checkpoints of the Llama family: tensor names, loading and saving.

The modules are those of :mod:`jaxbsd.models.llama.modeling`.

**Hugging Face layout.** :func:`from_pretrained` reads ``config.json`` (``model_type`` one of
:data:`~jaxbsd.models.llama.modeling.MODEL_TYPES`) and the weights through
:func:`~jaxbsd.models.hub.load_weights` (``model.safetensors`` or its shards, stored in any float dtype; names under ``model.`` as ``…ForCausalLM`` checkpoints have them, or without the prefix;
``lm_head.weight`` where the embeddings are untied). :func:`save_pretrained` writes the same layout
back where every MLP is still a standard gated MLP of one width (untouched, or all pruned to one width:
``intermediate_size`` is then the pruned width), with the tokenizer and generation files of the
directory the model was read from.

:func:`hf_tensors` maps every parameter's NNX state path to its Hugging Face tensor name (and whether
the tensor is stored transposed: Flax kernels are ``(in, out)``, PyTorch weights ``(out, in)``).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib

import numpy as np

from jaxbsd.models.causal_lm import export_widths, load_decoder, standard_gated_mlp, write_decoder
from jaxbsd.models.layers import PARAM_DTYPE
from jaxbsd.models.hub import open_checkpoint
from jaxbsd.models.llama.modeling import Llama, LlamaConfig

__all__ = ["hf_tensors", "from_pretrained", "save_pretrained"]

_MLP = ("gate_proj", "up_proj", "down_proj")


def _linear(names: dict, path: tuple, hf: str, bias: bool) -> None:
    names[(*path, "kernel")] = (f"{hf}.weight", True)
    if bias:
        names[(*path, "bias")] = (f"{hf}.bias", False)


def hf_tensors(config: LlamaConfig) -> dict[tuple, tuple[str, bool]]:
    """``{our state path: (Hugging Face tensor name, transposed)}`` for every parameter of :class:`Llama`."""
    c = config
    names = {("embed", "embedding"): ("model.embed_tokens.weight", False),
             ("norm", "scale"): ("model.norm.weight", False)}
    if not c.tie_word_embeddings:
        names[("lm_head", "kernel")] = ("lm_head.weight", True)
    for i in range(c.num_hidden_layers):
        hf, ours = f"model.layers.{i}", ("blocks", i)
        names[(*ours, "attn_norm", "scale")] = (f"{hf}.input_layernorm.weight", False)
        names[(*ours, "mlp_norm", "scale")] = (f"{hf}.post_attention_layernorm.weight", False)
        for proj in ("q_proj", "k_proj", "v_proj"):
            _linear(names, (*ours, "attn", proj), f"{hf}.self_attn.{proj}", c.qkv_bias)
        _linear(names, (*ours, "attn", "o_proj"), f"{hf}.self_attn.o_proj", c.out_bias)
        if c.qk_norm:
            for norm in ("q_norm", "k_norm"):
                names[(*ours, "attn", norm, "scale")] = (f"{hf}.self_attn.{norm}.weight", False)
        for proj in _MLP:
            _linear(names, (*ours, "mlp", proj), f"{hf}.mlp.{proj}", c.mlp_bias)
    return names


def from_pretrained(path: str | os.PathLike, *, dtype=PARAM_DTYPE) -> Llama:
    """Load a Hugging Face Llama, Mistral, Qwen2 or Qwen3 directory as a :class:`Llama`.

    The parameters are of ``dtype`` (float32 by default) whatever the checkpoint stores (bfloat16,
    float16), and the model computes in it; the weights are ``model.safetensors`` or its shards.

    Raises:
        ValueError: naming the path and what is missing or wrong: not a directory, no ``config.json``,
            a ``model_type`` of another family, an unsupported option (by name), no ``model.safetensors``
            (also when only ``pytorch_model.bin`` is there), a tensor missing (by name) or of the wrong
            shape (both shapes). Nothing is returned half-loaded.
    """
    root, data = open_checkpoint(path)
    config = LlamaConfig.from_hf(data, str(root / "config.json"))
    # a base ``LlamaModel`` checkpoint has no prefix
    return load_decoder(root, config, Llama, hf_tensors(config), "model.",
                        f"config.json: hidden_size {config.hidden_size}, intermediate_size "
                        f"{config.intermediate_size}, {config.num_hidden_layers} layers, "
                        f"{config.num_attention_heads} heads / {config.num_key_value_heads} key-value "
                        f"heads of {config.head_dim}", dtype)


def _mlp_tensors(linears, hf: str) -> dict[str, np.ndarray]:
    out = {}
    for proj, layer in zip(_MLP, linears):
        out[f"{hf}.mlp.{proj}.weight"] = np.ascontiguousarray(np.asarray(layer.kernel[...], np.float32).T)
        if layer.bias is not None:
            out[f"{hf}.mlp.{proj}.bias"] = np.asarray(layer.bias[...], np.float32)
    return out


def save_pretrained(model: Llama, path: str | os.PathLike) -> pathlib.Path:
    """Write ``model`` as a Hugging Face directory of its model type (``config.json``, ``model.safetensors``
    in float32, and the tokenizer / generation files of ``model.source_dir`` where it has one).

    Possible where every ``model.blocks[i].mlp`` is still a standard gated MLP (jaxbsd's ``GatedMLP`` or a
    pruned one) with the config's activation and biases, all of one hidden width: untouched, or pruned
    uniformly (``intermediate_size`` is then the pruned width). Returns the directory. Raises
    ``ValueError`` saying why for any other MLP (a decoupling, a low-rank factorisation, uneven widths),
    pointing to :func:`jaxbsd.save_compressed`.
    """
    if not isinstance(model, Llama):
        raise ValueError(f"model must be a jaxbsd.models.llama.Llama, got {type(model).__name__}")
    config = model.config
    found, reasons = [], []
    for i, block in enumerate(model.blocks):
        linears, why = standard_gated_mlp(block.mlp, config.hidden_size, config.activation, config.mlp_bias)
        if linears is None:
            reasons.append(f"blocks.{i}.mlp: {why}")
        found.append(linears)
    width = export_widths([None if x is None else x[0].out_features for x in found], reasons,
                          f"{config.model_type} model")
    config = dataclasses.replace(config, intermediate_size=width)
    mlps = {}
    for i, linears in enumerate(found):
        mlps.update(_mlp_tensors(linears, f"model.layers.{i}"))
    return write_decoder(model, path, config, hf_tensors(config), mlps)
