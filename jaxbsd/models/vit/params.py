"""Hugging Face ViT and DeiT image classifiers: tensor names, loading and saving.

jaxbsd's :class:`~jaxbsd.models.vit.ViT` is the architecture of ``transformers``'
``ViTForImageClassification``: pre-LN blocks, a [CLS] token and learned position embeddings,
exact-GELU MLPs, a final LayerNorm and a linear classifier on the [CLS] token. Three things are
stored differently, and the name table converts them both ways:

- the patch embedding is a ``Conv2d`` weight ``(d, C, p, p)`` there, a linear kernel
  ``(p·p·C, d)`` on patches flattened in (row, column, channel) order here;
- query, key and value are three ``Linear`` s there, one fused ``qkv`` kernel ``(d, 3d)`` here;
- the LayerNorm epsilon is the config's ``layer_norm_eps`` (1e-12 by default there, jaxbsd's own
  models use 1e-6): :attr:`ViTConfig.layer_norm_eps`.

DeiT (:mod:`jaxbsd.models.deit.params`) adds a distillation token after [CLS] and, in
``DeiTForImageClassificationWithTeacher``, a second head on it (the logits are the mean of the two);
plain ``DeiTForImageClassification`` has one head on [CLS].

:func:`from_pretrained` reads ``config.json`` (``model_type`` ``"vit"``), ``model.safetensors``
and, where present, ``preprocessor_config.json`` (then ``model.preprocess(images)`` applies its
resize and normalisation: :class:`~jaxbsd.models.vit.preprocessing.ImageProcessor`).
:func:`save_pretrained` writes the same layout back where every MLP is untouched or all are pruned
to one width (``intermediate_size`` is then that width); the classifier head(s) are kept.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib

import numpy as np
from flax import nnx

from jaxbsd.models.bert.modeling import HF_ACTIVATIONS
from jaxbsd.models.bert.params import standard_mlp
from jaxbsd.models.hub import block_widths, fill_params, load_weights, one_width, open_checkpoint, write_tensors
from jaxbsd.models.layers import PARAM_DTYPE
from jaxbsd.models.vit.modeling import ViT, ViTConfig
from jaxbsd.models.vit.preprocessing import ImageProcessor

__all__ = ["config_from_hf", "hf_config", "hf_shapes", "from_pretrained", "save_pretrained", "load_classifier",
           "save_classifier", "check_standard"]

# jaxbsd activation -> the Hugging Face name written for a model of jaxbsd's own.
_HF_NAME = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu"}
# config.json fields that change what the classifier computes and are not supported.
_REFUSED = {"qkv_bias": (False,), "use_mask_token": (True,)}


def config_from_hf(data: dict, where: str, config_class=ViTConfig, **extra):
    """The :class:`ViTConfig` (or ``config_class``) of a ViT/DeiT ``config.json`` dict; ``ValueError``
    naming ``where`` and the field for a missing field or an option the model cannot run."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object")
    required = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "image_size",
                "patch_size")
    missing = [n for n in required if n not in data]
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing}")
    for name, bad in _REFUSED.items():
        if name in data and data[name] in bad:
            raise ValueError(f"{where}: {name} {data[name]!r} is not supported")
    act = data.get("hidden_act", "gelu")
    if act not in HF_ACTIVATIONS:
        raise ValueError(f"{where}: hidden_act {act!r} is not supported ({sorted(HF_ACTIVATIONS)} are)")
    size = data["image_size"]
    if isinstance(size, list) and len(size) == 2 and size[0] == size[1]:
        size = size[0]
    if not isinstance(size, int) or isinstance(size, bool):
        raise ValueError(f"{where}: image_size {size!r} is not supported (square images only)")
    labels = data.get("id2label")
    classes = len(labels) if isinstance(labels, dict) and labels else data.get("num_labels", 2)
    try:
        return config_class(image_size=size, channels=data.get("num_channels", 3), num_classes=classes,
                            patch_size=data["patch_size"], dim=data["hidden_size"], depth=data["num_hidden_layers"],
                            num_heads=data["num_attention_heads"], mlp_dim=data["intermediate_size"],
                            activation=HF_ACTIVATIONS[act], layer_norm_eps=data.get("layer_norm_eps", 1e-12),
                            hf_fields=json.dumps(data, sort_keys=True), **extra)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: {err}") from err


def hf_config(config: ViTConfig, model_type: str, architecture: str) -> dict:
    """The ``config.json`` dict of ``config``: the checkpoint's own fields where it was read from one,
    with the sizes the model has now (a pruned ``intermediate_size``)."""
    base = json.loads(config.hf_fields) if config.hf_fields else {
        "hidden_act": _HF_NAME.get(config.activation, config.activation), "qkv_bias": True,
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "initializer_range": 0.02,
        "id2label": {str(i): f"LABEL_{i}" for i in range(config.num_classes)},
        "label2id": {f"LABEL_{i}": i for i in range(config.num_classes)}}
    if HF_ACTIVATIONS.get(base.get("hidden_act", "gelu")) != config.activation:
        base["hidden_act"] = _HF_NAME[config.activation]
    return {**base, "model_type": model_type, "architectures": [architecture], "hidden_size": config.dim,
            "num_hidden_layers": config.depth, "num_attention_heads": config.num_heads,
            "intermediate_size": config.mlp_dim, "image_size": config.image_size, "patch_size": config.patch_size,
            "num_channels": config.channels, "layer_norm_eps": config.layer_norm_eps}


def hf_shapes(config: ViTConfig, prefix: str, tokens: tuple[str, ...], heads: dict[str, str]) -> dict[str, tuple]:
    """``{Hugging Face tensor name: shape}`` of a ViT-shaped classifier: the backbone under ``prefix``
    (``"vit."``, ``"deit."``), the learned ``tokens`` of its embeddings and the ``heads``
    ``{our head attribute: HF name}``."""
    d, p, c, hidden = config.dim, config.patch_size, config.channels, config.mlp_dim
    e = f"{prefix}embeddings."
    shapes = {f"{e}{t}": (1, 1, d) for t in tokens}
    shapes.update({f"{e}position_embeddings": (1, len(tokens) + config.num_patches, d),
                   f"{e}patch_embeddings.projection.weight": (d, c, p, p), f"{e}patch_embeddings.projection.bias": (d,),
                   f"{prefix}layernorm.weight": (d,), f"{prefix}layernorm.bias": (d,)})
    for i in range(config.depth):
        layer = f"{prefix}encoder.layer.{i}."
        for name, (out, inp) in {"attention.attention.query": (d, d), "attention.attention.key": (d, d),
                                 "attention.attention.value": (d, d), "attention.output.dense": (d, d),
                                 "intermediate.dense": (hidden, d), "output.dense": (d, hidden)}.items():
            shapes[f"{layer}{name}.weight"], shapes[f"{layer}{name}.bias"] = (out, inp), (out,)
        for name in ("layernorm_before", "layernorm_after"):
            shapes[f"{layer}{name}.weight"], shapes[f"{layer}{name}.bias"] = (d,), (d,)
    for name in heads.values():
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = (config.num_classes, d), (config.num_classes,)
    return shapes


def _to_ours(t: dict, config: ViTConfig, prefix: str, tokens, heads) -> dict[tuple, np.ndarray]:
    """The checked HF tensors ``t`` as ``{our state path: array}`` (the layout conversions)."""
    e, p, c, d = f"{prefix}embeddings.", config.patch_size, config.channels, config.dim
    conv = t[f"{e}patch_embeddings.projection.weight"]  # (d, C, p, p) -> rows in (row, col, channel) order
    ours = {("patch_embed", "proj", "kernel"): conv.transpose(2, 3, 1, 0).reshape(p * p * c, d),
            ("patch_embed", "proj", "bias"): t[f"{e}patch_embeddings.projection.bias"],
            ("prefix_tokens",): np.concatenate([t[f"{e}{name}"] for name in tokens], axis=1),
            ("pos_embed",): t[f"{e}position_embeddings"],
            ("norm", "scale"): t[f"{prefix}layernorm.weight"], ("norm", "bias"): t[f"{prefix}layernorm.bias"]}
    for i in range(config.depth):
        hf, at = f"{prefix}encoder.layer.{i}.", ("blocks", i)
        qkv = [f"{hf}attention.attention.{n}" for n in ("query", "key", "value")]
        ours[(*at, "attn", "qkv", "kernel")] = np.concatenate([t[f"{n}.weight"].T for n in qkv], axis=1)
        ours[(*at, "attn", "qkv", "bias")] = np.concatenate([t[f"{n}.bias"] for n in qkv])
        for path, name in {("attn", "proj"): "attention.output.dense", ("mlp", "fc1"): "intermediate.dense",
                           ("mlp", "fc2"): "output.dense"}.items():
            ours[(*at, *path, "kernel")], ours[(*at, *path, "bias")] = t[f"{hf}{name}.weight"].T, t[f"{hf}{name}.bias"]
        for path, name in {"norm1": "layernorm_before", "norm2": "layernorm_after"}.items():
            ours[(*at, path, "scale")], ours[(*at, path, "bias")] = t[f"{hf}{name}.weight"], t[f"{hf}{name}.bias"]
    for ours_name, name in heads.items():
        ours[(ours_name, "kernel")], ours[(ours_name, "bias")] = t[f"{name}.weight"].T, t[f"{name}.bias"]
    return ours


def _to_hf(model: ViT, prefix: str, tokens, heads) -> dict[str, np.ndarray]:
    """The way back: ``{HF tensor name: float32 array}`` of ``model``'s parameters."""
    flat = {k: np.asarray(v[...], np.float32) for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    config, e = model.config, f"{prefix}embeddings."
    p, c, d = config.patch_size, config.channels, config.dim
    t = {f"{e}patch_embeddings.projection.weight":
         flat[("patch_embed", "proj", "kernel")].reshape(p, p, c, d).transpose(3, 2, 0, 1),
         f"{e}patch_embeddings.projection.bias": flat[("patch_embed", "proj", "bias")],
         f"{e}position_embeddings": flat[("pos_embed",)],
         f"{prefix}layernorm.weight": flat[("norm", "scale")], f"{prefix}layernorm.bias": flat[("norm", "bias")]}
    for j, name in enumerate(tokens):
        t[f"{e}{name}"] = flat[("prefix_tokens",)][:, j:j + 1]
    for i in range(config.depth):
        hf, at = f"{prefix}encoder.layer.{i}.", ("blocks", i)
        kernel, bias = flat[(*at, "attn", "qkv", "kernel")], flat[(*at, "attn", "qkv", "bias")]
        for j, n in enumerate(("query", "key", "value")):
            t[f"{hf}attention.attention.{n}.weight"] = kernel[:, j * d:(j + 1) * d].T
            t[f"{hf}attention.attention.{n}.bias"] = bias[j * d:(j + 1) * d]
        for path, name in {("attn", "proj"): "attention.output.dense", ("mlp", "fc1"): "intermediate.dense",
                           ("mlp", "fc2"): "output.dense"}.items():
            t[f"{hf}{name}.weight"], t[f"{hf}{name}.bias"] = flat[(*at, *path, "kernel")].T, flat[(*at, *path, "bias")]
        for path, name in {"norm1": "layernorm_before", "norm2": "layernorm_after"}.items():
            t[f"{hf}{name}.weight"], t[f"{hf}{name}.bias"] = flat[(*at, path, "scale")], flat[(*at, path, "bias")]
    for ours_name, name in heads.items():
        t[f"{name}.weight"], t[f"{name}.bias"] = flat[(ours_name, "kernel")].T, flat[(ours_name, "bias")]
    return {k: np.ascontiguousarray(v) for k, v in t.items()}


def _check(tensors: dict, shapes: dict, where: str, describe: str) -> None:
    missing = [n for n in shapes if n not in tensors]
    wrong = [f"{n} has shape {tuple(tensors[n].shape)}, expected {s}" for n, s in shapes.items()
             if n in tensors and tuple(tensors[n].shape) != s]
    if missing or wrong:
        problems = ([f"missing tensor(s) {missing[:4]}{' …' if len(missing) > 4 else ''}"] if missing else []) + wrong[:3]
        raise ValueError(f"{where}: {'; '.join(problems)} ({describe})")


def load_classifier(root: pathlib.Path, model_class, config, prefix: str, tokens: tuple[str, ...],
                    heads: dict[str, str], dtype=PARAM_DTYPE):
    """A ``model_class`` (:class:`ViT`, :class:`~jaxbsd.models.deit.DeiT`) of ``config`` with parameters
    of ``dtype`` filled from the checked directory ``root``'s weights (``model.safetensors`` or its
    shards, in any stored float dtype; every tensor checked before any is set), with its
    ``preprocessor_config.json`` attached where present; what ViT and DeiT share. The backbone's
    tensors are read under ``prefix`` (``"vit."``) or, where the checkpoint has none of those, without
    it (a base ``ViTModel``'s names); a pooler (``pooler.dense``) is ignored, since the classifier
    reads the [CLS] token after the final LayerNorm. A checkpoint without the head tensors (a
    ``ViTModel`` backbone) is refused by name."""
    processor_file = root / "preprocessor_config.json"
    processor = ImageProcessor.from_file(processor_file) if processor_file.is_file() else None
    if processor is not None and processor.output_size(config.image_size, config.image_size) != (config.image_size,) * 2:
        raise ValueError(f"{processor_file}: the processed images are {processor.output_size(1, 1)}, the model's "
                         f"image_size is {config.image_size}")
    tensors, weights = load_weights(root)
    prefix_read = prefix if any(name.startswith(prefix) for name in tensors) else ""  # "": a base model's names
    head_names = [f"{name}.weight" for name in heads.values()]
    if not any(name in tensors for name in head_names):
        raise ValueError(f"{weights}: missing tensor(s) {head_names}: a {model_class.__name__}Model backbone "
                         "without a classification head has no logits to compute; jaxbsd reads image classifiers")
    needed = hf_shapes(config, prefix_read, tokens, heads)
    _check(tensors, needed, weights,
           f"config.json: hidden_size {config.dim}, intermediate_size {config.mlp_dim}, {config.depth} layers")
    ours = _to_ours({k: np.asarray(v, np.float32) for k, v in tensors.items() if k in needed}, config, prefix_read,
                    tokens, heads)
    abstract = nnx.eval_shape(lambda: model_class(config, rngs=nnx.Rngs(0)))
    names = {key: (key, False) for key in ours}
    model = fill_params(abstract, names, ours, weights, dtype=dtype)
    model.image_processor = nnx.static(processor)
    model.eval()
    return model


_VIT_HEADS = {"head": "classifier"}


def from_pretrained(path: str | os.PathLike, *, dtype=PARAM_DTYPE) -> ViT:
    """Load a Hugging Face ``ViTForImageClassification`` directory as a jaxbsd :class:`ViT`.

    ``model(images)`` takes NHWC float32 images (``model.preprocess(uint8 images)`` makes them where
    the directory has a ``preprocessor_config.json``) and returns the logits ``(B, num_labels)``. The
    parameters are of ``dtype`` (float32 by default, whatever the checkpoint stores); the tensors are
    read with or without the ``vit.`` prefix, a pooler ignored (:func:`load_classifier`).

    Raises:
        ValueError: naming the path: not a checkpoint (also only ``pytorch_model.bin``), a
            ``model_type`` other than ``"vit"``, a missing field or an unsupported option of
            ``config.json`` (``qkv_bias`` false, ``hidden_act``, non-square images), a missing tensor
            (``classifier.weight`` for a ``ViTModel`` without a head) or one of the wrong shape (both
            shapes), a preprocessor option it cannot apply. Nothing is returned half-loaded.
    """
    root, data = open_checkpoint(path)
    where = str(root / "config.json")
    if data.get("model_type") != "vit":
        raise ValueError(f"{where}: model_type is {data.get('model_type')!r}; jaxbsd.models.vit reads 'vit'")
    config = config_from_hf(data, where)
    return load_classifier(root, ViT, config, "vit.", ("cls_token",), _VIT_HEADS, dtype)


def check_standard(model: ViT) -> int:
    """The one hidden width of ``model``'s MLPs; ``ValueError`` pointing to ``save_compressed`` where
    they are not all ordinary two-layer MLPs of one width."""
    widths, reasons = block_widths(model.blocks, "blocks", lambda mlp: standard_mlp(mlp, model.config.dim,
                                                                                      model.config.activation))
    return one_width(widths, reasons, f"model is no longer a standard {type(model).__name__}",
                     "a Hugging Face checkpoint holds uniform two-layer MLPs only")


def save_classifier(model: ViT, path, model_type: str, architecture: str, prefix: str, tokens, heads) -> pathlib.Path:
    """Write ``model`` as a Hugging Face directory (``config.json``, ``model.safetensors`` and the
    ``preprocessor_config.json`` it was read with); what ViT and DeiT share."""
    width = check_standard(model)
    config = dataclasses.replace(model.config, mlp_dim=width)
    tensors = _to_hf(model, prefix, tokens, heads)
    root = pathlib.Path(path)
    root.mkdir(parents=True, exist_ok=True)
    write_tensors(tensors, root / "model.safetensors")
    (root / "config.json").write_text(json.dumps(hf_config(config, model_type, architecture), indent=2) + "\n")
    processor = getattr(model, "image_processor", None)
    if processor is not None:
        (root / "preprocessor_config.json").write_text(json.dumps(_processor_config(processor), indent=2) + "\n")
    return root


def _processor_config(p: ImageProcessor) -> dict:
    out = {"do_resize": p.size is not None, "resample": p.resample, "do_center_crop": p.crop_size is not None,
           "do_rescale": p.rescale_factor is not None, "do_normalize": p.image_mean is not None}
    if p.size is not None:
        out["size"] = {"height": p.size[0], "width": p.size[1]}
    if p.crop_size is not None:
        out["crop_size"] = {"height": p.crop_size[0], "width": p.crop_size[1]}
    if p.rescale_factor is not None:
        out["rescale_factor"] = p.rescale_factor
    if p.image_mean is not None:
        out["image_mean"], out["image_std"] = list(p.image_mean), list(p.image_std)
    return out


def save_pretrained(model: ViT, path: str | os.PathLike) -> pathlib.Path:
    """Write a :class:`ViT` as a Hugging Face directory that ``ViTForImageClassification.from_pretrained``
    reads; the classifier head is kept (a DeiT: :func:`jaxbsd.models.deit.params.save_pretrained`).

    Possible where every ``blocks[i].mlp`` is an ordinary two-layer MLP with biases and the config's
    activation, all of one width (untouched, or pruned uniformly: ``intermediate_size`` is then that
    width). Returns the directory; ``ValueError`` saying why otherwise, pointing to
    :func:`jaxbsd.save_compressed` (nothing is written).
    """
    if not isinstance(model, ViT):
        raise ValueError(f"model must be a jaxbsd.models.vit.ViT, got {type(model).__name__}")
    if model.num_prefix_tokens != 1:  # a DeiT: its family writes its tokens and heads
        raise ValueError(f"model is a {type(model).__name__}; write it with jaxbsd.models.save_pretrained "
                         "(or jaxbsd.models.deit.save_pretrained)")
    return save_classifier(model, path, "vit", "ViTForImageClassification", "vit.", ("cls_token",), _VIT_HEADS)

