"""Hugging Face checkpoints of GPT-2: tensor names, loading and saving.

The modules are those of :mod:`jaxbsd.models.gpt2.modeling`.

**Hugging Face layout.** :func:`from_pretrained` reads ``config.json`` (``model_type`` ``"gpt2"``) and
the weights through :func:`~jaxbsd.models.hub.load_weights` (``model.safetensors`` or its shards, any stored float dtype; names under ``transformer.`` as
``GPT2LMHeadModel`` checkpoints have them, or without the prefix as the original ``gpt2`` one has;
``lm_head.weight`` where the embeddings are untied). GPT-2's ``Conv1D`` weights are ``(in, out)``, as
Flax kernels: they are not transposed. :func:`save_pretrained` writes the same layout back where every
MLP is still a standard two-layer MLP of one width (untouched, or all pruned to one width: ``n_inner``
is then the pruned width), with the tokenizer and generation files of the directory the model was read
from.

:func:`hf_tensors` maps every parameter's NNX state path to its Hugging Face tensor name (and whether
the tensor is stored transposed).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib

import numpy as np

from jaxbsd.models.causal_lm import export_widths, load_decoder, standard_mlp, write_decoder
from jaxbsd.models.gpt2.modeling import GPT2, GPT2Config
from jaxbsd.models.layers import PARAM_DTYPE
from jaxbsd.models.hub import block_widths, open_checkpoint

__all__ = ["hf_tensors", "from_pretrained", "save_pretrained"]

_PREFIX = "transformer."


def hf_tensors(config: GPT2Config) -> dict[tuple, tuple[str, bool]]:
    """``{our state path: (Hugging Face tensor name, transposed)}`` for every parameter of :class:`GPT2`
    (only the untied ``lm_head`` is a PyTorch ``nn.Linear``, stored ``(out, in)``)."""
    p = _PREFIX
    names = {("wte", "embedding"): (f"{p}wte.weight", False), ("wpe", "embedding"): (f"{p}wpe.weight", False),
             ("ln_f", "scale"): (f"{p}ln_f.weight", False), ("ln_f", "bias"): (f"{p}ln_f.bias", False)}
    if not config.tie_word_embeddings:
        names[("lm_head", "kernel")] = ("lm_head.weight", True)
    for i in range(config.n_layer):
        hf, ours = f"{p}h.{i}", ("blocks", i)
        for path, name in {("ln_1",): "ln_1", ("ln_2",): "ln_2"}.items():
            names[(*ours, *path, "scale")] = (f"{hf}.{name}.weight", False)
            names[(*ours, *path, "bias")] = (f"{hf}.{name}.bias", False)
        for path, name in {("attn", "c_attn"): "attn.c_attn", ("attn", "c_proj"): "attn.c_proj",
                           ("mlp", "fc1"): "mlp.c_fc", ("mlp", "fc2"): "mlp.c_proj"}.items():
            names[(*ours, *path, "kernel")] = (f"{hf}.{name}.weight", False)
            names[(*ours, *path, "bias")] = (f"{hf}.{name}.bias", False)
    return names


def from_pretrained(path: str | os.PathLike, *, dtype=PARAM_DTYPE) -> GPT2:
    """Load a Hugging Face GPT-2 directory as a :class:`GPT2`.

    The parameters are of ``dtype`` (float32 by default) whatever the checkpoint stores (bfloat16,
    float16), and the model computes in it; the weights are ``model.safetensors`` or its shards.

    Raises:
        ValueError: naming the path and what is missing or wrong: not a directory, no ``config.json``,
            another ``model_type``, an unsupported option (by name), no ``model.safetensors`` (also when
            only ``pytorch_model.bin`` is there), a tensor missing (by name) or of the wrong shape (both
            shapes). Nothing is returned half-loaded.
    """
    root, data = open_checkpoint(path)
    config = GPT2Config.from_hf(data, str(root / "config.json"))
    # a GPT2Model checkpoint (the original ``gpt2``) has no prefix
    return load_decoder(root, config, GPT2, hf_tensors(config), _PREFIX,
                        f"config.json: n_embd {config.n_embd}, n_inner {config.n_inner}, {config.n_layer} layers, "
                        f"n_positions {config.n_positions}", dtype)


def save_pretrained(model: GPT2, path: str | os.PathLike) -> pathlib.Path:
    """Write ``model`` as a Hugging Face GPT-2 directory (``config.json``, ``model.safetensors`` in float32,
    and the tokenizer / generation files of ``model.source_dir`` where it has one).

    Possible where every ``model.blocks[i].mlp`` is still an ordinary two-layer MLP (jaxbsd's ``MLP`` or a
    pruned one) with both biases and the config's activation, all of one hidden width: untouched, or pruned
    uniformly (``n_inner`` is then the pruned width). Returns the directory. Raises ``ValueError`` saying
    why for any other MLP (a decoupling, a low-rank factorisation, uneven widths), pointing to
    :func:`jaxbsd.save_compressed`.
    """
    if not isinstance(model, GPT2):
        raise ValueError(f"model must be a jaxbsd.models.gpt2.GPT2, got {type(model).__name__}")
    config = model.config
    widths, reasons = block_widths(model.blocks, "blocks", lambda mlp: standard_mlp(mlp, config.n_embd,
                                                                                      config.activation))
    config = dataclasses.replace(config, n_inner=export_widths(widths, reasons, "GPT-2"))
    mlps = {}
    for i, block in enumerate(model.blocks):
        for layer, name in ((block.mlp.fc1, "c_fc"), (block.mlp.fc2, "c_proj")):
            mlps[f"{_PREFIX}h.{i}.mlp.{name}.weight"] = np.asarray(layer.kernel[...], np.float32)
            mlps[f"{_PREFIX}h.{i}.mlp.{name}.bias"] = np.asarray(layer.bias[...], np.float32)
    return write_decoder(model, path, config, hf_tensors(config), mlps)
