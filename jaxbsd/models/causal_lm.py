"""What the Hugging Face decoder families (:mod:`jaxbsd.models.gpt2`, :mod:`jaxbsd.models.llama`) share.

* :data:`HF_ACTIVATIONS` and :func:`activation_of`: a config's ``hidden_act`` /
  ``activation_function`` name -> jaxbsd's activation (unknown names refused by name);
* :func:`check_config_json` and :func:`config_with_token_ids`: what every decoder config's ``from_hf``
  checks first (a JSON object of the family's model types with the required fields) and does last
  (the token ids, the config built, its ``ValueError`` naming the file);
* :func:`check_ids` and :func:`allowed_pairs`: the ``(batch, seq)`` ids and padding mask every
  causal LM takes, and the boolean ``(batch, 1, seq, seq)`` pattern of the query-key pairs
  attention may use (causal, masked keys removed);
* :func:`standard_mlp` / :func:`standard_gated_mlp` (from :mod:`jaxbsd.models.hub`, where every family
  finds them): whether a block's MLP is still an ordinary (possibly pruned) two-layer or gated MLP, and
  its kernels, for the export;
* :func:`export_widths`: one MLP width for every block or a ``ValueError`` pointing to
  :func:`jaxbsd.save_compressed`; :func:`copy_source_files`: the tokenizer and generation files of
  the directory a model was read from;
* :func:`load_decoder` and :func:`write_decoder`: a family's ``from_pretrained`` and
  ``save_pretrained`` but for its config, name table and MLP tensors.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxbsd.models.hub import (NameTable, fill_params, load_weights, one_width, param_tensors, standard_gated_mlp,
                               standard_mlp, write_tensors)
from jaxbsd.models.layers import PARAM_DTYPE

__all__ = ["HF_ACTIVATIONS", "activation_of", "hf_activation_name", "check_config_json", "config_with_token_ids",
           "check_ids", "allowed_pairs", "MASK_VALUE",
           "standard_mlp", "standard_gated_mlp", "export_widths", "copy_source_files", "SOURCE_FILES",
           "load_decoder", "write_decoder"]

#: ``hidden_act`` / ``activation_function`` of a Hugging Face config -> the name in
#: :data:`~jaxbsd.models.layers.ACTIVATIONS` (``gelu_new``, ``gelu_pytorch_tanh`` and ``gelu_fast`` are
#: the tanh approximation; ``swish`` is SiLU).
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                  "gelu_fast": "gelu_tanh", "relu": "relu", "silu": "silu", "swish": "silu",
                  "tanh": "tanh", "sigmoid": "sigmoid"}

#: Logit offset of pairs attention may not use: exp(-1e9 - max) is exactly 0 in float32 and float64.
MASK_VALUE = -1e9

#: Files of a Hugging Face directory that :func:`copy_source_files` carries over to an export.
SOURCE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                "merges.txt", "tokenizer.model", "added_tokens.json", "generation_config.json")


def activation_of(name, field: str, where: str | None = None) -> str:
    """jaxbsd's activation for the Hugging Face name ``name`` of config field ``field``;
    ``ValueError`` naming ``where`` (if given) and the field for a name jaxbsd does not compute."""
    if name not in HF_ACTIVATIONS:
        raise ValueError(f"{where + ': ' if where else ''}{field} {name!r} is not supported (supported: {sorted(HF_ACTIVATIONS)})")
    return HF_ACTIVATIONS[name]


def hf_activation_name(activation: str) -> str | None:
    """The first Hugging Face name of jaxbsd's ``activation`` (None if it has none)."""
    return next((hf for hf, ours in HF_ACTIVATIONS.items() if ours == activation), None)


def check_config_json(data, where: str, model_types: tuple[str, ...], reads: str, required: tuple[str, ...]) -> None:
    """``ValueError`` naming ``where`` (the ``config.json`` file) unless ``data`` is a JSON object whose
    ``model_type`` is one of ``model_types`` (else ``"model_type is …; {reads}"``, ``reads`` saying what
    the family reads) and that has every ``required`` field."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
    if data.get("model_type") not in model_types:
        raise ValueError(f"{where}: model_type is {data.get('model_type')!r}; {reads}")
    missing = [n for n in required if n not in data]
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing}")


def config_with_token_ids(cls, values: dict, data: dict, where: str):
    """``cls(**values)`` with the ``bos_token_id``, ``eos_token_id`` and ``pad_token_id`` of the
    ``config.json`` dict ``data`` (None where absent; a list of ids as a tuple, so the config stays
    hashable), to be written back as read; its ``ValueError`` prefixed with ``where``."""
    def token_id(value):
        return tuple(value) if isinstance(value, list) else value

    try:
        return cls(**values, bos_token_id=token_id(data.get("bos_token_id")),
                   eos_token_id=token_id(data.get("eos_token_id")), pad_token_id=data.get("pad_token_id"))
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from err


def check_ids(ids, mask, max_len: int | None = None) -> None:
    """``ValueError`` unless ``ids`` is a ``(batch, seq)`` integer array (``seq ≤ max_len`` where
    given) and ``mask`` is None or an array of the same shape (1 or True: a real token)."""
    if getattr(ids, "ndim", None) != 2 or not jnp.issubdtype(ids.dtype, jnp.integer):
        raise ValueError(f"ids must be a (batch, seq) integer array, got {getattr(ids, 'shape', None)} "
                         f"{getattr(ids, 'dtype', None)}")
    if ids.shape[1] < 1:
        raise ValueError("ids must hold at least one position")
    if max_len is not None and ids.shape[1] > max_len:
        raise ValueError(f"ids has {ids.shape[1]} positions, more than the model's {max_len} "
                         "(max_position_embeddings / n_positions)")
    if mask is not None and getattr(mask, "shape", None) != ids.shape:
        raise ValueError(f"mask must have the shape of ids {ids.shape}, got {getattr(mask, 'shape', None)}")


def allowed_pairs(mask, seq: int) -> jax.Array:
    """``(batch or 1, 1, seq, seq)`` bool: query ``i`` may attend key ``j`` iff ``j ≤ i`` and key ``j``
    is a real token (``mask`` ``(batch, seq)``, None: all real)."""
    causal = jnp.tril(jnp.ones((seq, seq), bool)).reshape(1, 1, seq, seq)
    if mask is None:
        return causal
    keys = jnp.asarray(mask).astype(bool).reshape(mask.shape[0], 1, 1, seq)
    return causal & keys


def export_widths(widths: list[int | None], reasons: list[str], family: str) -> int:
    """The one hidden width of every block's MLP, or ``ValueError`` saying why the model is no longer
    a standard ``family`` checkpoint (the first reason, or the uneven widths) and pointing to
    :func:`jaxbsd.save_compressed`."""
    return one_width(widths, reasons, f"model is no longer a standard {family}",
                     f"a {family} checkpoint holds MLPs of one width and the original form only")


def copy_source_files(source_dir: str | None, root: pathlib.Path) -> list[str]:
    """Copy the :data:`SOURCE_FILES` found in ``source_dir`` (a model's original directory; None:
    none) into ``root``; returns the names copied. A file already in ``root`` is overwritten."""
    if not source_dir:
        return []
    source = pathlib.Path(source_dir)
    copied = []
    for name in SOURCE_FILES:
        file = source / name
        if file.is_file() and os.path.abspath(file) != os.path.abspath(root / name):
            shutil.copyfile(file, root / name)
            copied.append(name)
    return copied


def load_decoder(root: pathlib.Path, config, model_class, names: NameTable, prefix: str, describe: str,
                 dtype=PARAM_DTYPE):
    """``model_class(config, source_dir=root)`` with parameters of ``dtype`` (float32 by default, whatever
    the checkpoint stores) filled from the checked directory ``root``'s
    (:func:`~jaxbsd.models.hub.open_checkpoint`) weights (``model.safetensors`` or its shards:
    :func:`~jaxbsd.models.hub.load_weights`) through the name table ``names``,
    a tensor named with ``prefix`` (``"model."``, ``"transformer."``, as ``…ForCausalLM`` checkpoints
    have it) also found without it (a base model's checkpoint); what every decoder family's
    ``from_pretrained`` shares. Raises ``ValueError`` as :func:`~jaxbsd.models.hub.fill_params` does,
    followed by ``describe`` (the config's sizes)."""
    tensors, weights = load_weights(root)

    def lookup(tensors: Mapping, name: str):
        if name in tensors:
            return tensors[name]
        if name.startswith(prefix):
            return tensors.get(name[len(prefix):])
        return None

    abstract = nnx.eval_shape(lambda: model_class(config, rngs=nnx.Rngs(0), source_dir=str(root)))
    return fill_params(abstract, names, tensors, weights, lookup=lookup, dtype=dtype, describe=describe)


def write_decoder(model, path: str | os.PathLike, config, names: NameTable,
                  mlps: Mapping[str, np.ndarray]) -> pathlib.Path:
    """Write ``model`` as a Hugging Face directory: ``model.safetensors`` (float32) of its parameters
    through the name table ``names`` but for those of its blocks' MLPs (paths ``("blocks", i, "mlp",
    …)``), whose tensors ``mlps`` gives by name; ``config.json`` from ``config.to_hf()`` (the config of
    the exported widths); the :data:`SOURCE_FILES` of ``model.source_dir``. What every decoder
    family's ``save_pretrained`` shares once the MLPs are checked; returns the directory."""
    tensors = param_tensors(model, {k: v for k, v in names.items() if not (k[0] == "blocks" and k[2] == "mlp")})
    tensors.update(mlps)
    root = pathlib.Path(path)
    root.mkdir(parents=True, exist_ok=True)
    write_tensors(tensors, root / "model.safetensors")
    (root / "config.json").write_text(json.dumps(config.to_hf(), indent=2) + "\n")
    copy_source_files(model.source_dir, root)
    return root
