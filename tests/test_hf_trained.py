"""The trained checkpoints exported to Hugging Face and compressed by ``jaxbsd compress-hf``, against the NNX path.

``checkpoints/vit-fashion-mnist`` is exported with ``models.save_pretrained`` and a ``preprocessor_config.json``
that says how it was trained to see pixels (rescale by 1/255, then Fashion-MNIST's training mean and std);
``checkpoints/lm-pystdlib`` with ``models.llama.save_lm_pretrained`` and its character ``tokenizer.json``.

Oracles: stock ``transformers`` reads each export (``ViTForImageClassification`` with its own image
processor on real Fashion-MNIST images; ``LlamaForCausalLM`` with ``PreTrainedTokenizerFast`` on real
Python source) and gives the NNX model's logits on the NNX model's inputs (``load_dataset``'s normalisation,
``CharVocab``'s ids). ``compress-hf`` on each export reports the figures of the NNX path: ``compress_model``
on the checkpoint's own NNX model (``ViT``, ``LM``) with the same calibration, drawn here as the command
documents it, measured by :mod:`jaxbsd.evaluation` on the same images or texts.
"""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbsd as jb
from jaxbsd import data, models
from jaxbsd.checkpoint import load_checkpoint
from jaxbsd.cli import main
from jaxbsd.data import CharVocab
from jaxbsd.evaluation import bits_per_token, classifier_agreement, next_token_agreement
from jaxbsd.models.vit.preprocessing import ImageProcessor

torch = pytest.importorskip("torch")
T = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow  # each test ≈ 10–60 s on the 2-core machine: real checkpoints, real data

CHECKPOINTS = pathlib.Path(__file__).resolve().parents[1] / "checkpoints"
#: compress-hf's settings in both tests that compress (the NNX path is given the same).
REDUCTION, REFINE_STEPS, SEED = 0.1, 30, 0


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


# ----------------------------------------------------------------------------- the ViT on Fashion-MNIST


@pytest.fixture(scope="module")
def fashion():
    """``(raw [0, 1] split, the normalised split the ViT was trained on, mean, std)``."""
    if not data.default_root("fashion-mnist").is_dir():
        pytest.skip("dataset-fashion-mnist is not installed (apt-get install -y dataset-fashion-mnist)")
    raw = data.load_dataset("fashion-mnist", normalize=False)
    pixels = raw.train_images.astype(np.float64)  # the training split's statistics, in float64
    return raw, data.load_dataset("fashion-mnist"), float(pixels.mean()), float(pixels.std())


@pytest.fixture(scope="module")
def vit_export(fashion, tmp_path_factory):
    _, _, mean, std = fashion
    vit, _ = load_checkpoint(CHECKPOINTS / "vit-fashion-mnist")
    vit.image_processor = ImageProcessor(size=None, rescale_factor=1 / 255, image_mean=(mean,), image_std=(std,))
    return models.save_pretrained(vit, tmp_path_factory.mktemp("vit-fashion-mnist"))


def _uint8(images):
    return np.round(np.asarray(images) * 255).astype(np.uint8)


def test_the_exported_trained_vit_gives_its_logits_in_transformers(fashion, vit_export):
    from PIL import Image

    raw, normalised, _, _ = fashion
    vit, _ = load_checkpoint(CHECKPOINTS / "vit-fashion-mnist")
    config = json.loads((vit_export / "config.json").read_text())
    assert config["architectures"] == ["ViTForImageClassification"] and config["num_channels"] == 1
    hf = T.ViTForImageClassification.from_pretrained(vit_export).eval()
    assert sum(p.numel() for p in hf.parameters()) == models.count_params(vit)
    processor = T.ViTImageProcessorPil.from_pretrained(vit_export)
    idx = np.random.default_rng(1).choice(len(raw.test_images), 64, replace=False)
    images = [Image.fromarray(im[..., 0]) for im in _uint8(raw.test_images[idx])]
    pixels = processor(images, return_tensors="pt")["pixel_values"]
    ours = normalised.test_images[idx]  # what the NNX model was trained and is evaluated on
    np.testing.assert_allclose(pixels.numpy().transpose(0, 2, 3, 1), ours, rtol=0, atol=1e-6)
    with torch.no_grad():
        logits = hf(pixel_values=pixels).logits.numpy()
    assert _rel(logits, vit(jnp.asarray(ours))) <= 1e-5


def test_compress_hf_on_the_trained_vit_reports_the_nnx_figures(fashion, vit_export, tmp_path):
    raw, normalised, _, _ = fashion
    cal_n, eval_n = 32, 256
    out = tmp_path / "out"
    assert main(["compress-hf", str(vit_export), "--method", "prune", "--reduction", str(REDUCTION),
                 "--refine-steps", str(REFINE_STEPS), "--images", "fashion-mnist", "--calibration-images", str(cal_n),
                 "--eval-images", str(eval_n), "--seed", str(SEED), "--out", str(out), "--no-progress"]) == 0
    report = json.loads((out / "fidelity.json").read_text())
    # the draw --images documents for a data set: default_rng(seed), calibration from the training split, then
    # the evaluation images from the test split
    rng = np.random.default_rng(SEED)
    cal = np.sort(rng.choice(len(raw.train_images), cal_n, replace=False))
    ev = np.sort(rng.choice(len(raw.test_images), eval_n, replace=False))
    original, _ = load_checkpoint(CHECKPOINTS / "vit-fashion-mnist")
    vit, _ = load_checkpoint(CHECKPOINTS / "vit-fashion-mnist")
    vit, nnx_report = jb.compress_model(vit, normalised.train_images[cal], mlps=None, reduction=REDUCTION,
                                        method=jb.get_method("prune"), key=jax.random.key(SEED),
                                        refine=jb.Refine(steps=REFINE_STEPS))
    figures = classifier_agreement(original, vit, normalised.test_images[ev])
    assert report["params_after"] == nnx_report.params_after and report["evaluation"]["images"] == eval_n
    # the same parameters through the same compiled programs: equal to the last bit
    for name in ("top1_agreement", "mean_kl", "max_kl"):
        assert report["fidelity"][name] == figures[name], name
    assert 0 < report["fidelity"]["mean_kl"] and report["fidelity"]["top1_agreement"] < 1


def test_a_grey_vit_without_preprocessor_config_gets_the_defaults_on_its_one_channel(fashion, tmp_path):
    """ViTImageProcessor's defaults (rescale 1/255, mean and std 0.5) on each of the model's channels."""
    raw, _, _, _ = fashion
    vit, _ = load_checkpoint(CHECKPOINTS / "vit-fashion-mnist")
    path = models.save_pretrained(vit, tmp_path / "bare")
    assert not (path / "preprocessor_config.json").exists()
    out = tmp_path / "out"
    assert main(["compress-hf", str(path), "--reduction", str(REDUCTION), "--refine-steps", "0", "--images",
                 "fashion-mnist", "--calibration-images", "8", "--eval-images", "64", "--out", str(out),
                 "--no-progress"]) == 0
    report = json.loads((out / "fidelity.json").read_text())
    assert "mean 0.5, std 0.5" in report["calibration"]["preprocessing"]
    rng = np.random.default_rng(0)
    cal = np.sort(rng.choice(len(raw.train_images), 8, replace=False))
    ev = np.sort(rng.choice(len(raw.test_images), 64, replace=False))

    def pixels(images):
        return ((_uint8(images).astype(np.float64) / 255 - 0.5) / 0.5).astype(np.float32)

    original, _ = load_checkpoint(CHECKPOINTS / "vit-fashion-mnist")
    vit, _ = jb.compress_model(vit, pixels(raw.train_images[cal]), mlps=None, reduction=REDUCTION,
                               method="prune", key=jax.random.key(0), refine=None)
    figures = classifier_agreement(original, vit, pixels(raw.test_images[ev]))
    assert report["fidelity"]["mean_kl"] == pytest.approx(figures["mean_kl"], rel=1e-5)
    assert report["fidelity"]["top1_agreement"] == figures["top1_agreement"]


# ----------------------------------------------------------------------------- the character LM on Python source


@pytest.fixture(scope="module")
def pystdlib():
    try:
        return data.load_text_dataset("pystdlib")
    except FileNotFoundError as err:
        pytest.skip(f"the pystdlib corpus is not there ({err})")


@pytest.fixture(scope="module")
def lm_export(tmp_path_factory):
    lm, _ = load_checkpoint(CHECKPOINTS / "lm-pystdlib")
    return models.llama.save_lm_pretrained(lm, tmp_path_factory.mktemp("lm-pystdlib"), chars=CharVocab.CHARS)


def test_the_exported_trained_lm_gives_its_logits_and_ids_in_transformers(pystdlib, lm_export):
    vocab = pystdlib.vocab
    lm, _ = load_checkpoint(CHECKPOINTS / "lm-pystdlib")
    hf = T.AutoModelForCausalLM.from_pretrained(lm_export).eval()
    assert type(hf).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in hf.parameters()) == models.count_params(lm)
    tokenizer = T.PreTrainedTokenizerFast(tokenizer_file=str(lm_export / "tokenizer.json"))
    context = lm.config.context
    text = vocab.decode(pystdlib.test[:4 * context])  # real source, held out from training
    ids = np.asarray(tokenizer(text)["input_ids"])
    np.testing.assert_array_equal(ids, vocab.encode(text))
    assert tokenizer.decode(ids) == text
    rows = ids.reshape(4, context)
    with torch.no_grad():
        logits = hf(input_ids=torch.tensor(rows, dtype=torch.long)).logits.numpy()
    assert _rel(logits, lm(jnp.asarray(rows, jnp.int32))) <= 1e-5


def _paragraphs(text: str) -> list[str]:
    """``--eval-text``'s paragraphs for a causal LM, as the command documents them: split at blank lines,
    whitespace kept, the newlines around each dropped, empty ones left out."""
    return [p.strip("\n") for p in text.split("\n\n") if p.strip()]


def test_compress_hf_on_the_trained_lm_reports_the_nnx_figures(pystdlib, lm_export, tmp_path):
    vocab = pystdlib.vocab
    windows, seq_len, texts = 8, 128, 32
    calibration = vocab.decode(pystdlib.validation[:20_000])
    evaluation = vocab.decode(pystdlib.test[:20_000])
    (tmp_path / "cal.txt").write_text(calibration, encoding="utf-8")
    (tmp_path / "eval.txt").write_text(evaluation, encoding="utf-8")
    out = tmp_path / "out"
    assert main(["compress-hf", str(lm_export), "--method", "prune", "--reduction", str(REDUCTION),
                 "--refine-steps", str(REFINE_STEPS), "--calibration-text", str(tmp_path / "cal.txt"),
                 "--eval-text", str(tmp_path / "eval.txt"), "--windows", str(windows), "--seq-len", str(seq_len),
                 "--eval-texts", str(texts), "--seed", str(SEED), "--out", str(out), "--no-progress"]) == 0
    report = json.loads((out / "fidelity.json").read_text())
    # the NNX path: the calibration text's character ids in windows of seq_len, drawn with default_rng(seed)
    stream = vocab.encode(calibration)
    n = stream.size // seq_len
    pick = np.sort(np.random.default_rng(SEED).choice(n, windows, replace=False))
    cal = stream[: n * seq_len].reshape(n, seq_len)[pick].astype(np.int32)
    rows = [r for r in (vocab.encode(p)[:seq_len] for p in _paragraphs(evaluation)[:texts]) if r.size >= 2]
    ids = np.zeros((len(rows), max(map(len, rows))), np.int32)
    mask = np.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, :r.size], mask[i, :r.size] = r, 1
    original, _ = load_checkpoint(CHECKPOINTS / "lm-pystdlib")
    lm, _ = load_checkpoint(CHECKPOINTS / "lm-pystdlib")
    lm, nnx_report = jb.compress_model(lm, cal, mlps=None, reduction=REDUCTION, method=jb.get_method("prune"),
                                       key=jax.random.key(SEED), refine=jb.Refine(steps=REFINE_STEPS))
    assert report["params_after"] == nnx_report.params_after
    assert report["calibration"]["tokens"] == cal.size and report["evaluation"]["tokens"] == int(mask.sum())
    # jaxbsd's Llama keeps q, k and v apart where the LM fuses them: other programs, equal figures to rounding
    assert report["fidelity"]["bits_per_token"] == pytest.approx(bits_per_token(lm, ids, mask), rel=1e-6)
    assert report["fidelity_reference"]["bits_per_token"] == pytest.approx(bits_per_token(original, ids, mask),
                                                                            rel=1e-6)
    agreement = next_token_agreement(lm, original, ids, mask)
    assert abs(report["fidelity"]["next_token_agreement"] - agreement) <= 1 / mask.sum()  # one near-tie at most
    assert 0 < agreement < 1
