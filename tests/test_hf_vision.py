"""ViT and DeiT image classifiers of Hugging Face directories, both ways, and their preprocessing.

Oracles: ``transformers``' classifiers (tiny random-init models, every parameter redrawn) for the
logits, its Pillow image processors for ``preprocess``, and Pillow itself for the resize.
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from hf_oracle import (assert_refused, assert_rel_close, edit_config, edit_tensors, only_pytorch_bin, prune_all, save,
                       tiny_model)

import jaxbsd
from jaxbsd import models as M

T = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, image_size=16,
             patch_size=8, num_labels=3)

#: name -> (transformers class, config).
# compress_model on one DeiT in the default run (the MLPs are one class in every case).
SLOW_CASES = {f"test_compress_model_finds_every_mlp_without_a_spec[{n}]" for n in
              ("vit-gelu", "vit-gelu_new-1ch-eps", "deit-plain-relu")}

CASES = {
    "vit-gelu": lambda: (T.ViTForImageClassification, T.ViTConfig(**SIZES)),
    "vit-gelu_new-1ch-eps": lambda: (T.ViTForImageClassification,
                                     T.ViTConfig(**SIZES, hidden_act="gelu_new", num_channels=1, layer_norm_eps=1e-6)),
    "deit-teacher": lambda: (T.DeiTForImageClassificationWithTeacher, T.DeiTConfig(**SIZES, layer_norm_eps=1e-5)),
    "deit-plain-relu": lambda: (T.DeiTForImageClassification, T.DeiTConfig(**SIZES, hidden_act="relu")),
}


def build(name, seed=1):
    """The case's classifier, every parameter redrawn (``seed`` None: as ``transformers`` initialises it)."""
    cls, config = CASES[name]()
    return tiny_model(lambda: cls(config), seed=seed)


def images(channels, n=3, size=16, seed=0):
    return np.random.default_rng(seed).standard_normal((n, size, size, channels)).astype(np.float32)


def hf_logits(model, x) -> np.ndarray:
    with torch.no_grad():
        return model(pixel_values=torch.as_tensor(x.transpose(0, 3, 1, 2))).logits.numpy()


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    model = build(request.param)
    return request.param, model, save(model, tmp_path_factory.mktemp(request.param))


def test_logits_agree_with_transformers(case):
    name, model, path = case
    ours = M.from_pretrained(path)
    assert isinstance(ours, M.DeiT if name.startswith("deit") else M.ViT)
    x = images(model.config.num_channels)
    assert_rel_close(ours(x), hf_logits(model, x))
    if name == "deit-teacher":
        assert ours.distilled and ours.head_dist is not None


def test_uniformly_pruned_export_is_read_back_by_transformers(case, tmp_path):
    name, model, path = case
    ours = M.from_pretrained(path)
    prune_all(ours.blocks, 20)
    out = M.save_pretrained(ours, tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["intermediate_size"] == 20
    back = type(model).from_pretrained(out).eval()
    y = images(model.config.num_channels, seed=2)
    assert_rel_close(ours(y), hf_logits(back, y))


def test_compress_model_finds_every_mlp_without_a_spec(case):
    name, model, path = case
    ours = M.from_pretrained(path)
    x = images(model.config.num_channels, n=4, seed=1)
    _, report = jaxbsd.compress_model(ours, x, key=jax.random.key(0), mlps=None, method="prune",
                                      ranks={"blocks.0.mlp": 20, "blocks.1.mlp": 20}, refine=None)
    assert sorted(r.path for r in report.mlps) == ["blocks.0.mlp", "blocks.1.mlp"]


def test_a_jaxbsd_vit_of_its_own_exports_to_vit_for_image_classification(tmp_path):
    ours = M.build_model("vit", M.ViTConfig.tiny(), seed=3)
    out = M.save_pretrained(ours, tmp_path / "own")
    back = T.ViTForImageClassification.from_pretrained(out).eval()
    x = images(1, size=8)
    assert_rel_close(ours(x), hf_logits(back, x))


@pytest.mark.parametrize("processor", [
    lambda: T.ViTImageProcessorPil(size={"height": 16, "width": 16}, image_mean=[0.4, 0.5, 0.6],
                                   image_std=[0.2, 0.3, 0.25]),
    lambda: T.DeiTImageProcessorPil(size={"height": 20, "width": 20}, crop_size={"height": 16, "width": 16}),
], ids=["vit-bilinear", "deit-bicubic-crop"])
def test_preprocess_matches_the_transformers_image_processor(tmp_path, processor):
    proc = processor()
    save(build("vit-gelu"), tmp_path, proc.save_pretrained)
    raw = np.random.default_rng(0).integers(0, 256, (2, 23, 30, 3)).astype(np.uint8)
    ref = proc(list(raw), return_tensors="np")["pixel_values"].transpose(0, 2, 3, 1)
    ours = M.from_pretrained(tmp_path).preprocess(raw)
    assert ours.shape == ref.shape == (2, 16, 16, 3)
    np.testing.assert_allclose(ours, ref, atol=1e-6, rtol=0)


def test_resize_is_pillows_to_the_last_bit():
    from PIL import Image

    from jaxbsd.models.vit.preprocessing import resize_like_pillow

    raw = np.random.default_rng(0).integers(0, 256, (2, 21, 34, 3)).astype(np.uint8)
    for (h, w), resample in (((16, 16), 2), ((40, 9), 3), ((21, 12), 2)):
        ref = np.stack([np.asarray(Image.fromarray(im).resize((w, h), resample=resample)) for im in raw])
        np.testing.assert_array_equal(resize_like_pillow(raw, h, w, resample), ref)


# ----------------------------------------------------------------------------- bad input


def _preprocessor(**fields):
    def edit(path):
        (path / "preprocessor_config.json").write_text(json.dumps(fields))
    return edit


BAD = [
    ("vit-gelu", edit_config(qkv_bias=False), r"config.json: qkv_bias False is not supported"),
    ("vit-gelu", edit_config(hidden_act="swish"), r"config.json: hidden_act 'swish' is not supported"),
    ("deit-plain-relu", edit_tensors(lambda t: t.pop("classifier.bias")), r"missing tensor\(s\) \['classifier.bias'\]"),
    ("vit-gelu", edit_tensors(lambda t: t.update({"vit.embeddings.position_embeddings": np.zeros((1, 4, 32), "f4")})),
     r"vit.embeddings.position_embeddings has shape \(1, 4, 32\), expected \(1, 5, 32\)"),
    ("vit-gelu", _preprocessor(size={"height": 16, "width": 16}, resample=0), r"resample 0 is not supported"),
    ("deit-teacher", only_pytorch_bin, r"only pytorch_model.bin"),
]


@pytest.mark.parametrize("name, edit, match", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_checkpoints_get_one_line_value_errors_naming_the_path(tmp_path, name, edit, match):
    assert_refused(save(build(name, seed=None), tmp_path, edit), match)


def test_export_refuses_a_low_rank_mlp_pointing_to_save_compressed(tmp_path):
    from jaxbsd.compression.baselines import svd_mlp

    ours = M.build_model("vit", M.ViTConfig.tiny())
    ours.blocks[0].mlp = svd_mlp(ours.blocks[0].mlp, 4)
    with pytest.raises(ValueError, match=r"blocks.0.mlp: LowRankMLP .*save_compressed"):
        M.save_pretrained(ours, tmp_path / "out")
    assert not (tmp_path / "out").exists()
