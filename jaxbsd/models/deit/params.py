"""Hugging Face DeiT image classifiers: ``DeiTForImageClassificationWithTeacher`` and
``DeiTForImageClassification`` as jaxbsd's :class:`~jaxbsd.models.deit.DeiT`.

The backbone is ViT's (:mod:`jaxbsd.models.vit.params` converts it) under the prefix ``deit.``,
with a distillation token after [CLS] (``deit.embeddings.distillation_token``). A checkpoint with
``distillation_classifier`` is the model with a teacher: two heads, on the [CLS] and the
distillation token, whose logits are averaged (``DeiTConfig(distillation_head=True)``); one with
``classifier`` only has one head on [CLS] (``distillation_head=False``). Either is written back as
it was read.
"""

from __future__ import annotations

import os
import pathlib

from jaxbsd.models.deit.modeling import DeiT, DeiTConfig
from jaxbsd.models.hub import open_checkpoint, weight_names
from jaxbsd.models.layers import PARAM_DTYPE
from jaxbsd.models.vit.params import config_from_hf, load_classifier, save_classifier

__all__ = ["from_pretrained", "save_pretrained"]

_TOKENS = ("cls_token", "distillation_token")
_TEACHER_HEADS = {"head": "cls_classifier", "head_dist": "distillation_classifier"}
_PLAIN_HEADS = {"head": "classifier"}


def from_pretrained(path: str | os.PathLike, *, dtype=PARAM_DTYPE) -> DeiT:
    """Load a Hugging Face DeiT classifier directory as a jaxbsd :class:`DeiT`.

    The head(s) follow the tensors: ``distillation_classifier.*`` present, the two-head model with a
    teacher; otherwise ``classifier.*``, one head. The parameters are of ``dtype`` (float32 by default). ``model.preprocess(uint8 images)`` applies the
    ``preprocessor_config.json`` (resize, centre crop, normalisation) where there is one.

    Raises ``ValueError`` naming the path as :func:`jaxbsd.models.vit.params.from_pretrained` does
    (``model_type`` must be ``"deit"``). Nothing is returned half-loaded.
    """
    root, data = open_checkpoint(path)
    where = str(root / "config.json")
    if data.get("model_type") != "deit":
        raise ValueError(f"{where}: model_type is {data.get('model_type')!r}; jaxbsd.models.deit reads 'deit'")
    names = weight_names(root)
    teacher = "distillation_classifier.weight" in names
    config = config_from_hf(data, where, DeiTConfig, distillation_head=teacher)
    return load_classifier(root, DeiT, config, "deit.", _TOKENS, _TEACHER_HEADS if teacher else _PLAIN_HEADS,
                           dtype)


def save_pretrained(model: DeiT, path: str | os.PathLike) -> pathlib.Path:
    """Write a :class:`DeiT` as a Hugging Face directory: ``DeiTForImageClassificationWithTeacher``
    with the distillation head, ``DeiTForImageClassification`` without; both heads are kept.

    Possible where the MLPs are untouched or all pruned to one width (``intermediate_size``); else a
    ``ValueError`` saying why, pointing to :func:`jaxbsd.save_compressed` (nothing is written).
    """
    if not isinstance(model, DeiT):
        raise ValueError(f"model must be a jaxbsd.models.deit.DeiT, got {type(model).__name__}")
    if model.distilled:
        return save_classifier(model, path, "deit", "DeiTForImageClassificationWithTeacher", "deit.", _TOKENS,
                               _TEACHER_HEADS)
    return save_classifier(model, path, "deit", "DeiTForImageClassification", "deit.", _TOKENS, _PLAIN_HEADS)
