"""Hugging Face checkpoints of every model family: one entry point each way.

:func:`from_pretrained` reads ``config.json``'s ``model_type`` and hands the directory to the
family that reads it (:data:`FAMILIES`); :func:`save_pretrained` hands a model to the family it
came from. A family is a package ``jaxbsd.models.<family>`` with ``from_pretrained(path)`` and
``save_pretrained(model, path)`` and a tuple ``MODEL_CLASSES`` of the classes it saves.

The rest of this module is what every family's ``params.py`` shares: reading the directory
(:func:`open_checkpoint`, :func:`read_json`, :func:`load_weights` for one ``model.safetensors`` or
shards, in any stored dtype, :func:`load_tensors` for one file), filling an abstract module from
the tensors through a name table (:func:`fill_params`) and the way back (:func:`param_tensors`,
:func:`write_tensors`, :func:`write_file`, and :func:`copy_through` for the source directory's
files the export does not change), and the check that an export is still of the family's standard
form (:func:`standard_mlp`, :func:`standard_gated_mlp`, :func:`block_widths`, :func:`one_width`). A name table maps each parameter's NNX state path to its Hugging Face
tensor name and whether the tensor is stored transposed (Flax kernels are ``(in, out)``, PyTorch
``nn.Linear`` weights ``(out, in)``).
"""

from __future__ import annotations

import importlib
import json
import os
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxbsd.io import write_bytes_atomic
from jaxbsd.models.weights import load_weights, read_safetensors, weight_names, weights_file

__all__ = ["FAMILIES", "supported_model_types", "from_pretrained", "save_pretrained", "read_json",
           "open_checkpoint", "load_tensors", "load_weights", "weight_names", "fill_params", "param_tensors", "write_tensors", "write_file",
           "copy_through", "STALE_SUFFIXES", "STALE_DIRS", "standard_mlp", "standard_gated_mlp", "block_widths", "one_width"]

#: ``model_type`` of ``config.json`` -> the package of the family that reads it.
FAMILIES: dict[str, str] = {
    "bert": "jaxbsd.models.bert",
    "roberta": "jaxbsd.models.bert",
    "xlm-roberta": "jaxbsd.models.bert",
    "distilbert": "jaxbsd.models.distilbert",
    "mpnet": "jaxbsd.models.mpnet",
    "deit": "jaxbsd.models.deit",
    "vit": "jaxbsd.models.vit",
    "gpt2": "jaxbsd.models.gpt2",
    "llama": "jaxbsd.models.llama",
    "mistral": "jaxbsd.models.llama",
    "qwen2": "jaxbsd.models.llama",
    "qwen3": "jaxbsd.models.llama",
}

#: ``{state path: (Hugging Face tensor name, stored transposed)}``.
NameTable = Mapping[tuple, tuple[str, bool]]


def supported_model_types() -> list[str]:
    """The ``model_type`` values :func:`from_pretrained` reads, sorted."""
    return sorted(FAMILIES)


def read_json(path: pathlib.Path, what: str) -> Any:
    """The JSON content of ``path``; ``ValueError`` naming the path and ``what`` it should hold."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: cannot read {what} ({err})") from err


def open_checkpoint(path: str | os.PathLike) -> tuple[pathlib.Path, dict]:
    """``(directory, config.json's content)`` of a Hugging Face model directory with safetensors weights.

    Raises ``ValueError`` naming the path: not a directory, no ``config.json`` (or not a JSON
    object), no weights: neither ``model.safetensors`` nor a sharded checkpoint's
    ``model.safetensors.index.json`` (saying so when only ``pytorch_model.bin`` is there: jaxbsd
    reads no pickles). The weights themselves are read by :func:`load_weights`.
    """
    root = pathlib.Path(path)
    if not root.is_dir():
        raise ValueError(f"{root}: not a directory; expected a Hugging Face model directory "
                         "(config.json, model.safetensors)")
    config_file = root / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{root}: no config.json; expected a Hugging Face model directory")
    config = read_json(config_file, "the model config")
    if not isinstance(config, dict):
        raise ValueError(f"{config_file}: expected a JSON object")
    if weights_file(root) is None:
        pickles = [f for f in ("pytorch_model.bin", "pytorch_model.bin.index.json") if (root / f).is_file()]
        hint = (f" (only {pickles[0]} is there: convert it to model.safetensors, e.g. with "
                "transformers' save_pretrained(safe_serialization=True); jaxbsd does not read pickles)"
                if pickles else "")
        raise ValueError(f"{root}: no model.safetensors{hint}")
    return root, config


def _family(model_type) -> Any:
    if model_type not in FAMILIES:
        raise ValueError(f"model_type is {model_type!r}; jaxbsd reads {supported_model_types()}")
    return importlib.import_module(FAMILIES[model_type])


def from_pretrained(path: str | os.PathLike, *, dtype=None):
    """Load the Hugging Face directory ``path`` with the family its ``config.json``'s ``model_type`` names.

    The weights are ``model.safetensors`` or the shards of ``model.safetensors.index.json``, stored
    in float32, bfloat16 or float16; the model's parameters are of ``dtype`` (None: float32).

    Raises ``ValueError`` naming the path for a directory that is not a checkpoint, and for an
    unsupported ``model_type`` (listing the supported ones); the family's own checks follow.
    """
    root, config = open_checkpoint(path)
    try:
        family = _family(config.get("model_type"))
    except ValueError as err:
        raise ValueError(f"{root / 'config.json'}: {err}") from None
    return family.from_pretrained(root) if dtype is None else family.from_pretrained(root, dtype=dtype)


def save_pretrained(model, path: str | os.PathLike) -> pathlib.Path:
    """Write ``model`` as a Hugging Face directory with the family it belongs to; returns the directory.

    Raises ``ValueError`` for a model of no family (and the family's own ``ValueError`` where the
    compressed model is no longer of the family's standard form).
    """
    families = [importlib.import_module(name) for name in dict.fromkeys(FAMILIES.values())]
    # The family of the model's own class first (a DeiT is a ViT too), then one of a base class.
    for exact in (True, False):
        for family in families:
            classes = tuple(family.MODEL_CLASSES)
            if (type(model) in classes) if exact else isinstance(model, classes):
                return family.save_pretrained(model, path)
    raise ValueError(f"model must be a model of one of the families {supported_model_types()}, "
                     f"got {type(model).__name__}")


def load_tensors(file: pathlib.Path) -> dict[str, np.ndarray]:
    """Every tensor of a ``.safetensors`` file as numpy, in its stored dtype (bfloat16 too:
    :func:`~jaxbsd.models.weights.read_safetensors`); ``ValueError`` naming the file if it cannot be read."""
    return read_safetensors(file)


def fill_params(abstract: nnx.Module, names: NameTable, tensors: Mapping[str, np.ndarray], where: str, *,
                lookup: Callable[[Mapping, str], np.ndarray | None] | None = None, dtype=jnp.float32,
                describe: str = "") -> nnx.Module:
    """``abstract`` (from ``nnx.eval_shape``) with every ``nnx.Param`` set from ``tensors`` through ``names``.

    Every parameter of the module must have an entry in ``names``. ``lookup(tensors, name)`` finds a
    tensor (default: ``tensors.get``; families use it for prefixes and old aliases). All tensors are
    checked before any is set: a ``ValueError`` names ``where`` (the weights file), the first missing
    tensors and the shape mismatches (both shapes), followed by ``describe`` (the config's sizes).
    Tensors of ``tensors`` that no parameter uses are ignored (heads, poolers: the family states them).
    """
    find = lookup or (lambda t, name: t.get(name))
    graphdef, state = nnx.split(abstract)
    flat = dict(nnx.to_flat_state(state))
    missing, wrong, values = [], [], {}
    for key, var in flat.items():
        if key not in names:
            raise KeyError(f"no tensor name for the parameter {key}")  # a family's table is incomplete
        name, transposed = names[key]
        array = find(tensors, name)
        if array is None:
            missing.append(name)
            continue
        array = np.asarray(array)
        expected = tuple(var.shape[::-1] if transposed else var.shape)
        if array.shape != expected:
            wrong.append(f"{name} has shape {array.shape}, expected {expected}")
            continue
        values[key] = jnp.asarray(array.T if transposed else array, dtype)
    if missing or wrong:
        problems = ([f"missing tensor(s) {missing[:4]}{' …' if len(missing) > 4 else ''}"] if missing else []) + wrong[:3]
        raise ValueError(f"{where}: {'; '.join(problems)}" + (f" ({describe})" if describe else ""))
    for key, var in flat.items():
        var.set_value(values[key])
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def param_tensors(module: nnx.Module, names: NameTable) -> dict[str, np.ndarray]:
    """``{Hugging Face name: float32 array}`` of ``module``'s parameters through ``names`` (the way back)."""
    flat = dict(nnx.to_flat_state(nnx.state(module, nnx.Param)))
    tensors = {}
    for key, (name, transposed) in names.items():
        a = np.asarray(flat[key][...], np.float32)
        tensors[name] = np.ascontiguousarray(a.T if transposed else a)
    return tensors


def write_tensors(tensors: Mapping[str, np.ndarray], file: pathlib.Path) -> pathlib.Path:
    """Write ``tensors`` as a ``.safetensors`` file with the metadata ``transformers`` expects, as
    :func:`write_file` does (atomically, mode ``0666`` less the umask); returns ``file``."""
    from safetensors.numpy import save

    return write_file(file, save(dict(tensors), metadata={"format": "pt"}))


def write_file(file: str | os.PathLike, data: bytes | str) -> pathlib.Path:
    """Write ``data`` (text as UTF-8) to ``file`` atomically with the usual mode (``0666`` less the
    umask, as every file jaxbsd writes: :func:`jaxbsd.io.write_bytes_atomic`); returns ``file``."""
    return write_bytes_atomic(file, data.encode("utf-8") if isinstance(data, str) else data)


#: Files of a source directory that hold weights in another format, or an index of them: once the
#: export changes the weights they are stale, so :func:`copy_through` never copies them.
STALE_SUFFIXES = (".safetensors", ".bin", ".h5", ".msgpack", ".ot", ".onnx", ".pt", ".pth", ".ckpt", ".gguf",
                  ".index.json")
#: Sub-directories :func:`copy_through` never copies: exports of the weights to other runtimes, and
#: version-control or download bookkeeping.
STALE_DIRS = ("onnx", "openvino", "coreml", ".git", ".cache")


def copy_through(source: str | os.PathLike, dest: str | os.PathLike, written: set[str]) -> list[str]:
    """Copy into ``dest`` every file under ``source`` that the export did not write, so a saved model
    keeps its tokenizer settings, model card and the other files it came with.

    Args:
      source: the directory the model was read from.
      dest: the directory the export wrote.
      written: the paths (relative to ``dest``, ``/``-separated) the export wrote itself; they are
        not copied.

    Returns:
      The paths under ``source`` left out as stale (:data:`STALE_SUFFIXES`, :data:`STALE_DIRS`),
      sorted. Copies get the mode :func:`write_file` gives (symbolic links are followed).
    """
    source, dest = pathlib.Path(source), pathlib.Path(dest)
    left_out = []
    for file in sorted(source.rglob("*")):
        relative = file.relative_to(source)
        name = relative.as_posix()
        if file.is_dir() or name in written:
            continue
        if relative.parts[0] in STALE_DIRS or name.endswith(STALE_SUFFIXES):
            left_out.append(name)
            continue
        write_file(dest / relative, file.read_bytes())
    return left_out


def _linears(module, names) -> list | None:
    found = [getattr(module, n, None) for n in names]
    return found if all(isinstance(x, nnx.Linear) for x in found) else None


def _only_params_of(module, linears) -> bool:
    """Whether the ``nnx.Param`` s of ``module`` are the kernels and biases of ``linears`` and nothing
    else (no other trained array, nor one a subclass of ``nnx.Linear`` adds, as LoRA's)."""
    own = sum(1 for _ in nnx.to_flat_state(nnx.state(module, nnx.Param)))
    return own == sum(1 + (x.bias is not None) for x in linears)


def standard_mlp(module, dim: int, activation: str) -> tuple[int | None, str]:
    """``(hidden width, "")`` if ``module`` is an ordinary MLP ``fc2(h(fc1(x)))`` ``dim -> k -> dim`` with
    both biases and the activation ``activation`` (jaxbsd's :class:`~jaxbsd.models.layers.MLP` or a
    pruned one, :class:`~jaxbsd.models.compressed.PrunedMLP`), else ``(None, why not)``."""
    name = type(module).__name__
    linears = _linears(module, ("fc1", "fc2"))
    if linears is None:
        return None, f"{name} is not a two-layer MLP (fc1, fc2)"
    fc1, fc2 = linears
    if getattr(module, "activation", None) != activation:
        return None, f"{name} has activation {getattr(module, 'activation', None)!r}, the config {activation!r}"
    if fc1.bias is None or fc2.bias is None:
        return None, f"{name} lacks a bias"
    if not _only_params_of(module, linears):
        return None, f"{name} holds parameters besides fc1 and fc2"
    if fc1.in_features != dim or fc2.out_features != dim or fc1.out_features != fc2.in_features:
        return None, f"{name} maps {fc1.in_features} -> {fc1.out_features} -> {fc2.out_features}"
    return int(fc1.out_features), ""


def standard_gated_mlp(module, dim: int, activation: str, bias: bool) -> tuple[tuple | None, str]:
    """``((gate, up, down) nnx.Linear, "")`` if ``module`` is an ordinary gated MLP
    ``down(h(gate x) ⊙ up x)`` ``dim -> k -> dim`` with the activation ``activation`` and a bias on all
    three projections iff ``bias``: jaxbsd's :class:`~jaxbsd.models.lm.GatedMLP` (``gate_proj``,
    ``up_proj``, ``down_proj``) or a pruned one, :class:`~jaxbsd.models.compressed.PrunedGatedMLP`
    (``gate``, ``up``, ``down``); else ``(None, why not)``."""
    name = type(module).__name__
    linears = _linears(module, ("gate_proj", "up_proj", "down_proj")) or _linears(module, ("gate", "up", "down"))
    if linears is None:
        return None, f"{name} is not a gated MLP of three dense layers (gate, up, down)"
    gate, up, down = linears
    if getattr(module, "activation", None) != activation:
        return None, f"{name} has activation {getattr(module, 'activation', None)!r}, the config {activation!r}"
    if any((x.bias is not None) != bias for x in linears):
        return None, f"{name} has biases {[x.bias is not None for x in linears]}, the config mlp_bias={bias}"
    if not _only_params_of(module, linears):
        return None, f"{name} holds parameters besides its three projections"
    if (gate.in_features != dim or up.in_features != dim or down.out_features != dim
            or not gate.out_features == up.out_features == down.in_features):
        return None, (f"{name} maps {gate.in_features} -> {gate.out_features} (gate), {up.in_features} -> "
                      f"{up.out_features} (up), {down.in_features} -> {down.out_features} (down)")
    return (gate, up, down), ""


def block_widths(blocks, at: str, check: Callable[[Any], tuple[int | None, str]]) -> tuple[list, list[str]]:
    """``(widths, reasons)`` of each ``blocks[i].mlp`` by ``check(mlp)``, which gives ``(hidden width, "")``
    for an MLP of the family's standard form and ``(None, why not)`` otherwise: ``widths`` one a block
    (None where refused), ``reasons`` ``"{at}.{i}.mlp: {why}"`` for each refused one."""
    widths, reasons = [], []
    for i, block in enumerate(blocks):
        width, why = check(block.mlp)
        if width is None:
            reasons.append(f"{at}.{i}.mlp: {why}")
        widths.append(width)
    return widths, reasons


def one_width(widths: Sequence[int | None], reasons: Sequence[str], subject: str, holds: str) -> int:
    """The one hidden width of every block's MLP (:func:`block_widths`), or ``ValueError``
    ``"save_pretrained: the {subject} ({why}); {holds}. Save it with jaxbsd.save_compressed instead"``,
    ``why`` the first of ``reasons`` or else the uneven widths; ``subject`` says what the model is no
    longer (``"model is no longer a standard GPT-2"``), ``holds`` what the checkpoint format holds."""
    if reasons or len(set(widths)) != 1:
        why = reasons[0] if reasons else f"the MLPs have different hidden widths {sorted(set(widths))}"
        raise ValueError(f"save_pretrained: the {subject} ({why}); {holds}. Save it with jaxbsd.save_compressed "
                         "instead")
    return int(widths[0])
