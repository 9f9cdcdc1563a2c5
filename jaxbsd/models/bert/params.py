"""Hugging Face checkpoints of the BERT encoders: tensor names, loading and saving.

The modules are those of :mod:`jaxbsd.models.bert.modeling`.

**Hugging Face layout.** :func:`from_pretrained` reads ``config.json`` (``model_type`` ``"bert"``,
``"roberta"`` or ``"xlm-roberta"``, absolute positions), the weights through
:func:`~jaxbsd.models.hub.load_weights` (``model.safetensors`` or its shards, any stored float dtype; LayerNorms named
``weight``/``bias`` or ``gamma``/``beta``; a ``bert.`` or ``roberta.`` prefix, as ``…For…`` checkpoints have, is
accepted; their task heads are not read, the pooler is kept), ``tokenizer.json`` through ``tokenizers``, and the
sentence-transformers files where present: ``modules.json`` (a ``Normalize`` module),
``1_Pooling/config.json`` (mean, CLS, max or mean-sqrt-len pooling) and
``sentence_bert_config.json`` (``max_seq_length``). Without them the encoder mean-pools, as
sentence-transformers does for a plain BERT. :func:`save_pretrained` writes the same layout back
where the model is still a standard BERT: every MLP untouched, or all pruned to one width (a BERT
with a smaller ``intermediate_size``).

:func:`hf_tensors` maps every parameter's NNX state path to its Hugging Face tensor name (and
whether the tensor is stored transposed: Flax kernels are ``(in, out)``, PyTorch weights
``(out, in)``); :func:`from_pretrained` and :func:`save_pretrained` go through it both ways. Every
encoder family (DistilBERT's and MPNet's too) states its table through :func:`encoder_names`: the
prefix of a layer and the names of its linears and LayerNorms.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import pathlib

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxbsd.models.bert.modeling import POOLINGS, Bert, BertConfig, Encoder, Unused
from jaxbsd.models.hub import (block_widths, copy_through, fill_params, load_weights, one_width, open_checkpoint,
                               param_tensors, read_json, standard_mlp, write_file, write_tensors)
from jaxbsd.models.layers import PARAM_DTYPE

__all__ = ["hf_tensors", "hf_config", "from_pretrained", "load_encoder", "save_pretrained", "encoder_names",
           "LAYER_LINEARS", "LAYER_NORMS", "linear_names", "norm_names", "config_from_fields", "standard_mlp"]


# ----------------------------------------------------------------------------- Hugging Face names


def hf_tensors(config: BertConfig) -> dict[tuple, tuple[str, bool]]:
    """``{our state path: (Hugging Face tensor name, transposed)}`` for every parameter of
    :class:`Bert` (Flax kernels are ``(in, out)``, PyTorch weights ``(out, in)``), in the names of
    the config's ``model_type`` (DistilBERT's and MPNet's from their families' ``params``)."""
    if config.model_type in _OTHER_FAMILIES:
        return _OTHER_FAMILIES[config.model_type]().hf_tensors(config)
    tables = {("embeddings", "token_type", "embedding"): "embeddings.token_type_embeddings.weight"}
    return encoder_names(config, "encoder.layer.{i}",
                         ("attention.self.query", "attention.self.key", "attention.self.value",
                          "attention.output.dense", "intermediate.dense", "output.dense"),
                         ("attention.output.LayerNorm", "output.LayerNorm"),
                         tables if config.type_vocab_size else {})


#: Our paths of a :class:`Bert` layer's linears, in the order :func:`encoder_names` takes their names.
LAYER_LINEARS = (("attention", "query"), ("attention", "key"), ("attention", "value"), ("attention", "output"),
                 ("mlp", "fc1"), ("mlp", "fc2"))
#: Our paths of a :class:`Bert` layer's LayerNorms, in the order :func:`encoder_names` takes their names.
LAYER_NORMS = (("attention_norm",), ("output_norm",))


def encoder_names(config: BertConfig, layer: str, linears: tuple[str, ...], norms: tuple[str, ...],
                  tables: dict[tuple, str] | None = None) -> dict[tuple, tuple[str, bool]]:
    """The name table (:func:`hf_tensors`) of :class:`Bert` in an encoder family's names: what
    every family states the same way but for the names.

    Args:
        config: the encoder's config (its ``num_hidden_layers``).
        layer: the prefix of layer ``i``'s tensors, a format string in ``i`` (``"encoder.layer.{i}"``).
        linears: the names after ``layer`` of the six linears of :data:`LAYER_LINEARS` (query, key,
            value, attention output, ``fc1``, ``fc2``), each a ``.weight`` stored transposed and a ``.bias``.
        norms: the names after ``layer`` of the two LayerNorms of :data:`LAYER_NORMS` (after the
            attention, after the MLP), each a ``.weight`` (our ``scale``) and a ``.bias``.
        tables: ``{our path: tensor name}`` of the family's other tables, stored untransposed
            (token types, relative-position biases), beside the word and position embeddings
            (``embeddings.word_embeddings.weight``, ``embeddings.position_embeddings.weight``) and the
            embeddings' LayerNorm (``embeddings.LayerNorm``), which every family names alike.

    Returns:
        ``{our state path: (tensor name, transposed)}`` for every parameter of :class:`Bert`.
    """
    if len(linears) != len(LAYER_LINEARS) or len(norms) != len(LAYER_NORMS):
        raise ValueError(f"linears and norms must name {len(LAYER_LINEARS)} linears and {len(LAYER_NORMS)} "
                         f"LayerNorms, got {len(linears)} and {len(norms)}")
    names = {("embeddings", "word", "embedding"): ("embeddings.word_embeddings.weight", False),
             ("embeddings", "position", "embedding"): ("embeddings.position_embeddings.weight", False),
             **{path: (name, False) for path, name in (tables or {}).items()}}
    norm_names(names, (), {("embeddings", "norm"): "embeddings.LayerNorm"})
    for i in range(config.num_hidden_layers):
        hf = layer.format(i=i)
        linear_names(names, ("layers", i), {path: f"{hf}.{name}" for path, name in zip(LAYER_LINEARS, linears)})
        norm_names(names, ("layers", i), {path: f"{hf}.{name}" for path, name in zip(LAYER_NORMS, norms)})
    return names


def linear_names(names: dict, at: tuple, linears: dict) -> None:
    """Add the kernel (stored transposed) and bias of each ``{our path: HF prefix}`` under ``at``."""
    for path, name in linears.items():
        names[(*at, *path, "kernel")] = (f"{name}.weight", True)
        names[(*at, *path, "bias")] = (f"{name}.bias", False)


def norm_names(names: dict, at: tuple, norms: dict) -> None:
    """Add the scale (``.weight``) and bias of each ``{our path: HF prefix}`` LayerNorm under ``at``."""
    for path, name in norms.items():
        names[(*at, *path, "scale")] = (f"{name}.weight", False)
        names[(*at, *path, "bias")] = (f"{name}.bias", False)


def config_from_fields(data: dict, where: str, fields: dict[str, str], **values) -> BertConfig:
    """A :class:`BertConfig` from a ``config.json`` dict whose names differ: ``fields`` maps each
    :class:`BertConfig` field to its name in ``data`` (all required), ``values`` sets the others;
    ``data``'s remaining fields go to :attr:`BertConfig.hf_fields`. ``ValueError`` naming ``where``."""
    missing = [name for name in fields.values() if name not in data]
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing}")
    rest = {k: v for k, v in data.items() if k not in set(fields.values()) | {"model_type"}}
    try:
        return BertConfig(**{ours: data[theirs] for ours, theirs in fields.items()}, **values,
                          hf_fields=json.dumps(rest, sort_keys=True))
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: {err}") from err


def _family_params(name: str):
    return lambda: importlib.import_module(f"jaxbsd.models.{name}.params")


# The encoders with their own tensor names and config fields (their params import this module).
_OTHER_FAMILIES = {"distilbert": _family_params("distilbert"), "mpnet": _family_params("mpnet")}


def hf_config(config: BertConfig) -> dict:
    """The ``config.json`` dict of ``config`` in its ``model_type``'s fields (the checkpoint's other
    fields kept)."""
    if config.model_type in _OTHER_FAMILIES:
        return _OTHER_FAMILIES[config.model_type]().hf_config(config)
    return config.to_hf()


# Older checkpoints name LayerNorm parameters gamma/beta.
_ALIASES = {".weight": ".gamma", ".bias": ".beta"}


def _lookup(tensors: dict, name: str, prefixes=("", "bert.", "roberta.")):
    for prefix in prefixes:
        if prefix + name in tensors:
            return tensors[prefix + name]
        if "LayerNorm" in name:
            for new, old in _ALIASES.items():
                if name.endswith(new) and prefix + name[: -len(new)] + old in tensors:
                    return tensors[prefix + name[: -len(new)] + old]
    return None


def _sentence_transformers(root: pathlib.Path, hidden: int) -> tuple[str, bool, int | None]:
    """``(pooling, normalize, max_seq_length)`` from the sentence-transformers files (defaults: mean,
    no normalisation, no limit)."""
    pooling, normalize, max_len = "mean", False, None
    modules_file = root / "modules.json"
    pooling_dir = "1_Pooling"
    if modules_file.is_file():
        modules = read_json(modules_file, "the sentence-transformers modules")
        if not isinstance(modules, list):
            raise ValueError(f"{modules_file}: expected a JSON list of modules")
        kinds = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules if isinstance(m, dict)}
        normalize = "Normalize" in kinds
        if "Pooling" in kinds:
            pooling_dir = kinds["Pooling"].get("path") or pooling_dir
        unknown = sorted(set(kinds) - {"Transformer", "Pooling", "Normalize"})
        if unknown:
            raise ValueError(f"{modules_file}: module(s) {unknown} are not supported (Transformer, Pooling, "
                             "Normalize are)")
    pool_file = root / pooling_dir / "config.json"
    if pool_file.is_file():
        cfg = read_json(pool_file, "the pooling config")
        modes = [m for m in POOLINGS if cfg.get(f"pooling_mode_{m}_token" if m == "cls" else f"pooling_mode_{m}_tokens")]
        others = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v and
                  k not in ("pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens",
                            "pooling_mode_mean_sqrt_len_tokens")]
        if len(modes) != 1 or others:
            raise ValueError(f"{pool_file}: exactly one of the pooling modes {POOLINGS} must be on, "
                             f"got {modes + others}")
        pooling = modes[0]
        dim = cfg.get("word_embedding_dimension", hidden)
        if dim != hidden:
            raise ValueError(f"{pool_file}: word_embedding_dimension {dim} differs from hidden_size {hidden}")
    st_file = root / "sentence_bert_config.json"
    if st_file.is_file():
        max_len = read_json(st_file, "the sentence-transformers config").get("max_seq_length")
    return pooling, normalize, max_len


def from_pretrained(path: str | os.PathLike, *, dtype=PARAM_DTYPE) -> Encoder:
    """Load a Hugging Face BERT, RoBERTa or XLM-R directory as an :class:`Encoder` (see the module docs).

    Args:
        path: a directory with ``config.json``, the weights (``model.safetensors``, or shards with
            ``model.safetensors.index.json``; stored in any float dtype) and ``tokenizer.json``
            (and optionally the sentence-transformers files).
        dtype: the dtype of the parameters (float32 by default, whatever the checkpoint stores).

    Raises:
        ValueError: naming the path and what is missing or wrong: no such directory, no
            ``config.json``, a ``model_type`` other than ``"bert"``, ``"roberta"`` and
            ``"xlm-roberta"``, no ``model.safetensors`` (also when only ``pytorch_model.bin`` is
            there), no ``tokenizer.json``, a tensor missing or of the wrong shape. Nothing is
            returned half-loaded.
    """
    root, data = open_checkpoint(path)
    return load_encoder(root, BertConfig.from_hf(data, str(root / "config.json")), ("", "bert.", "roberta."), dtype)


def load_encoder(root: pathlib.Path, config: BertConfig, prefixes: tuple[str, ...], dtype=PARAM_DTYPE) -> Encoder:
    """The :class:`Encoder` of the checked directory ``root`` (:func:`~jaxbsd.models.hub.open_checkpoint`)
    for ``config``, its tensors named by :func:`hf_tensors` (after one of ``prefixes``, as
    ``…For…`` checkpoints have), its parameters of ``dtype`` whatever the stored one; what every
    encoder family's ``from_pretrained`` shares. Raises ``ValueError`` as :func:`from_pretrained` does."""
    from tokenizers import Tokenizer

    tokenizer_file = root / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise ValueError(f"{root}: no tokenizer.json (the fast tokenizer file of the tokenizers library)")
    pooling, normalize, max_len = _sentence_transformers(root, config.hidden_size)
    tensors, weights = load_weights(root)
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    except Exception as err:  # noqa: BLE001
        raise ValueError(f"{tokenizer_file}: cannot read ({type(err).__name__}: {err})") from err

    def lookup(t, name):
        return _lookup(t, name, prefixes)

    bert = fill_params(nnx.eval_shape(lambda: Bert(config, rngs=nnx.Rngs(0))), hf_tensors(config), tensors,
                       weights, lookup=lookup, dtype=dtype,
                       describe=f"config.json: hidden_size {config.hidden_size}, intermediate_size "
                                f"{config.intermediate_size}, {config.num_hidden_layers} layers")
    kernel, bias = lookup(tensors, "pooler.dense.weight"), lookup(tensors, "pooler.dense.bias")
    if kernel is not None and bias is not None:
        d = config.hidden_size
        if kernel.shape != (d, d) or bias.shape != (d,):
            raise ValueError(f"{weights}: pooler.dense has shapes {kernel.shape}, {bias.shape}, expected "
                             f"({d}, {d}), ({d},)")
        bert.pooler_kernel = Unused(jnp.asarray(np.asarray(kernel).T, dtype))
        bert.pooler_bias = Unused(jnp.asarray(bias, dtype))
    if max_len is not None:
        max_len = min(int(max_len), config.max_tokens)
    return Encoder(bert, tokenizer, pooling=pooling, normalize=normalize, max_seq_length=max_len,
                   source=str(root.resolve()))


# ----------------------------------------------------------------------------- saving


def _same_tokenizer(tokenizer, file: pathlib.Path) -> bool:
    """Whether ``tokenizer`` is the one in ``file`` but for padding and truncation (which encoding
    sets on it as it goes)."""
    from tokenizers import Tokenizer

    try:
        original = Tokenizer.from_file(str(file))
    except Exception:  # noqa: BLE001 — an unreadable original is not the same tokenizer
        return False
    current = Tokenizer.from_str(tokenizer.to_str())
    for tok in (original, current):
        tok.no_padding()
        tok.no_truncation()
    return original.to_str() == current.to_str()


def _pipeline_files(encoder: Encoder, config: BertConfig) -> dict[str, str]:
    """The sentence-transformers files of ``encoder`` as :func:`save_pretrained` writes them."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if encoder.normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    pooling = {"word_embedding_dimension": config.hidden_size,
               **{("pooling_mode_cls_token" if m == "cls" else f"pooling_mode_{m}_tokens"): m == encoder.pooling
                  for m in POOLINGS}}
    dump = lambda value: json.dumps(value, indent=2) + "\n"  # noqa: E731
    return {"modules.json": dump(modules), "1_Pooling/config.json": dump(pooling),
            "sentence_bert_config.json": dump({"max_seq_length": encoder.max_seq_length, "do_lower_case": False})}


def save_pretrained(encoder: Encoder, path: str | os.PathLike) -> pathlib.Path:
    """Write ``encoder`` as a Hugging Face BERT directory (with the sentence-transformers files).

    Possible where the encoder is still a standard BERT: every ``bert.layers[i].mlp`` an ordinary
    two-layer MLP with biases and the config's activation, all of one hidden width (untouched, or
    pruned uniformly: ``intermediate_size`` is then the pruned width). Writes ``model.safetensors``
    (Hugging Face tensor names, float32) and ``config.json`` (the source's, with this encoder's
    sizes). Where ``encoder.source`` (the directory it was read from) still exists, every other file
    there is copied through unchanged (:func:`jaxbsd.models.hub.copy_through`: the tokenizer files,
    the sentence-transformers files, the model card …; weights in other formats are left out, being
    stale), but for ``tokenizer.json`` where the tokenizer differs (padding and truncation aside) and
    the sentence-transformers files where the pooling, normalisation or ``max_seq_length`` differ:
    those are written from the encoder, as they are without a source. Every file gets the mode
    ``0666`` less the umask.

    Returns the directory. Raises ``ValueError`` saying why for any other MLP (a decoupling, a
    low-rank factorisation, uneven widths), pointing to :func:`jaxbsd.save_compressed`.
    """
    if not isinstance(encoder, Encoder):
        raise ValueError(f"encoder must be a jaxbsd.models.bert.Encoder, got {type(encoder).__name__}")
    bert = encoder.bert
    config = bert.config
    widths, reasons = block_widths(bert.layers, "bert.layers", lambda mlp: standard_mlp(mlp, config.hidden_size,
                                                                                          config.activation))
    width = one_width(widths, reasons, "encoder is no longer a standard BERT",
                      "a BERT checkpoint holds uniform two-layer MLPs only")
    if encoder.tokenizer is None:
        raise ValueError("save_pretrained: the encoder has no tokenizer to write")
    config = dataclasses.replace(config, intermediate_size=width)
    source = pathlib.Path(encoder.source) if getattr(encoder, "source", None) else None
    source = source if source is not None and (source / "config.json").is_file() else None
    root = pathlib.Path(path)
    root.mkdir(parents=True, exist_ok=True)
    tensors = param_tensors(bert, hf_tensors(config))
    if bert.pooler_kernel is not None:
        tensors["pooler.dense.weight"] = np.ascontiguousarray(np.asarray(bert.pooler_kernel[...], np.float32).T)
        tensors["pooler.dense.bias"] = np.asarray(bert.pooler_bias[...], np.float32)
    write_tensors(tensors, root / "model.safetensors")
    fields = hf_config(config)
    if source is not None:  # the source's other keys kept (dropouts, version, name) in its order, the sizes ours
        fields = {**read_json(source / "config.json", "the model config"), **fields}
        for key in ("torch_dtype", "dtype"):
            if key in fields:
                fields[key] = "float32"
    written = {"model.safetensors", "config.json"}
    write_file(root / "config.json", json.dumps(fields, indent=2) + "\n")
    if source is None or not _same_tokenizer(encoder.tokenizer, source / "tokenizer.json"):
        written.add("tokenizer.json")
        write_file(root / "tokenizer.json", encoder.tokenizer.to_str(pretty=True))
    same_pipeline = False
    if source is not None and (source / "modules.json").is_file():  # else a plain BERT: ours are written
        pooling, normalize, max_len = _sentence_transformers(source, config.hidden_size)
        limit = config.max_tokens  # as from_pretrained reads max_seq_length
        same_pipeline = (pooling, normalize, limit if max_len is None else min(int(max_len), limit)) == (
            encoder.pooling, encoder.normalize, encoder.max_seq_length)
    if not same_pipeline:
        for name, text in _pipeline_files(encoder, config).items():
            written.add(name)
            write_file(root / name, text)
    if source is not None:
        copy_through(source, root, written)
    return root
