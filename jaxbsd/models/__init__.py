"""Transformers whose MLP blocks jaxbsd compresses: vision models and a character LM.

Every model has ``model.blocks`` (an ``nnx.List``) and each block holds its MLP as
``block.mlp`` with the contract ``(..., m) -> (..., m)``.  Compression is assignment::

    model.blocks[i].mlp = DecoupledMLP.from_decoupled(res.model)

Models: :class:`ViT`, :class:`Swin`, :class:`DeiT` (images), and :class:`LM`, a decoder-only
character language model whose ``block.mlp`` is a gated :class:`GatedMLP` (see
:mod:`jaxbsd.models.lm.modeling`); each has a frozen config dataclass and presets.
:mod:`jaxbsd.models.bert.modeling` holds pretrained BERT-family encoders read from Hugging Face
directories (an :class:`Encoder`, MLPs at ``bert.layers[i].mlp``), :mod:`jaxbsd.models.gpt2` and
:mod:`jaxbsd.models.llama` (``llama``, ``mistral``, ``qwen2``, ``qwen3``) pretrained causal LMs (MLPs at
``blocks[i].mlp``, jaxbsd's :class:`MLP` and :class:`GatedMLP`); :func:`build_model` and
:func:`config_for_dataset` pick the trained-here models by name.

One folder per model family (``vit``, ``deit``, ``swin``, ``lm``, ``bert``, ``gpt2``, ``llama``): its
``modeling.py`` holds the config and the modules, and the ``params.py`` of a Hugging Face family maps
its tensor names to NNX paths (``from_pretrained``, ``save_pretrained``). Building blocks the families share live beside
them: :mod:`jaxbsd.models.layers`, :mod:`jaxbsd.models.capture`, :mod:`jaxbsd.models.decoupled_mlp`.
:func:`from_pretrained` and :func:`save_pretrained` (:mod:`jaxbsd.models.hub`) read and write a
Hugging Face directory of any family, dispatched on ``config.json``'s ``model_type``.
"""

from __future__ import annotations

import jax
from flax import nnx

from jaxbsd.models import bert, gpt2, llama
from jaxbsd.models.bert import Bert, BertConfig, Encoder
from jaxbsd.models.deit import DeiT, DeiTConfig
from jaxbsd.models.layers import (
    ACTIVATION_DERIVATIVES,
    ACTIVATIONS,
    MLP,
    Attention,
    Block,
    DropPath,
    PatchEmbed,
    config_from_dict,
    config_to_dict,
)
from jaxbsd.models.lm import LM, GatedMLP, LMConfig
from jaxbsd.models.swin import Swin, SwinConfig
from jaxbsd.models.vit import ViT, ViTConfig

__all__ = [
    "ACTIVATIONS",
    "ACTIVATION_DERIVATIVES",
    "MLP",
    "Attention",
    "Block",
    "DropPath",
    "PatchEmbed",
    "ViT",
    "ViTConfig",
    "Swin",
    "SwinConfig",
    "DeiT",
    "DeiTConfig",
    "LM",
    "LMConfig",
    "GatedMLP",
    "bert",
    "gpt2",
    "llama",
    "Bert",
    "BertConfig",
    "Encoder",
    "MODELS",
    "CONFIGS",
    "build_model",
    "config_for_dataset",
    "config_to_dict",
    "config_from_dict",
    "model_kind",
    "count_params",
    "mlp_inputs",
    "capture",
    "from_pretrained",
    "save_pretrained",
    "supported_model_types",
]

#: Model classes by kind name (the ``--model`` choices of the CLI).
MODELS = {"vit": ViT, "swin": Swin, "deit": DeiT, "lm": LM}
#: Their config classes.
CONFIGS = {"vit": ViTConfig, "swin": SwinConfig, "deit": DeiTConfig, "lm": LMConfig}


def _check_kind(kind: str) -> None:
    if kind not in MODELS:
        raise ValueError(f"kind must be one of {sorted(MODELS)}, got {kind!r}")


def build_model(kind: str, config=None, *, seed: int = 0):
    """Build a model of ``kind`` (``"vit"``, ``"swin"``, ``"deit"``, ``"lm"``) from ``config``.

    ``config`` is a config dataclass, a dict (as stored in checkpoints), or None for the
    class defaults.  Parameters come from ``seed``; stochastic-depth keys from
    ``seed + 1``.  The model starts in eval mode.
    """
    _check_kind(kind)
    cls = CONFIGS[kind]
    if config is None:
        config = cls()
    elif isinstance(config, dict):
        config = config_from_dict(cls, config)
    elif type(config) is not cls:
        raise ValueError(f"config must be a {cls.__name__} for kind {kind!r}, got {type(config).__name__}")
    model = MODELS[kind](config, rngs=nnx.Rngs(params=seed, dropout=seed + 1))
    model.eval()
    return model


def config_for_dataset(kind: str, dataset, **overrides):
    """The paper's config of ``kind`` for a dataset.

    ``dataset`` is a :class:`jaxbsd.data.Dataset` (anything with ``image_size``,
    ``channels`` and ``num_classes``) or a dataset name known to :mod:`jaxbsd.data`'s
    table below.  ``overrides`` replace config fields.  For ``kind="lm"`` the data set is a
    text one (``"pystdlib"`` or a :class:`jaxbsd.data.TextDataset`) and the config is
    :meth:`LMConfig.pystdlib` with the data set's vocabulary size.
    """
    _check_kind(kind)
    if kind == "lm":
        from jaxbsd.data import TEXT_DATASETS, CharVocab

        name = dataset if isinstance(dataset, str) else getattr(dataset, "name", None)
        if name not in TEXT_DATASETS:
            raise ValueError(f"dataset must be one of {list(TEXT_DATASETS)} for kind 'lm', got {dataset!r}")
        vocab = CharVocab() if isinstance(dataset, str) else dataset.vocab
        return LMConfig.pystdlib(**{"vocab_size": vocab.size, **overrides})
    if isinstance(dataset, str):
        shapes = {
            "digits": (8, 1), "mnist": (28, 1), "fashion-mnist": (28, 1), "usps": (16, 1),
            "cifar10": (32, 3), "svhn": (32, 3),
        }
        if dataset not in shapes:
            raise ValueError(f"dataset must be one of {sorted(shapes)}, got {dataset!r}")
        size, channels = shapes[dataset]
        classes = 10
    else:
        size, channels, classes = dataset.image_size, dataset.channels, dataset.num_classes
    return CONFIGS[kind].for_images(size, channels, classes, **overrides)


def model_kind(model) -> str:
    """The registry name of ``model``'s class (``ValueError`` for unknown models)."""
    kind = getattr(type(model), "kind", None)
    if kind not in MODELS or not isinstance(model, MODELS[kind]):
        raise ValueError(f"model must be one of {sorted(MODELS)}, got {type(model).__name__}")
    return kind


def count_params(module) -> int:
    """Number of trainable scalars (``nnx.Param`` entries) in ``module``."""
    return sum(int(x.size) for x in jax.tree.leaves(nnx.state(module, nnx.Param)))


from jaxbsd.models.capture import capture, mlp_inputs  # noqa: E402  (capture imports nothing back)
from jaxbsd.models.hub import from_pretrained, save_pretrained, supported_model_types  # noqa: E402
