"""``jaxbsd compress-hf`` on a tiny Llama and a tiny ViT that `transformers` builds and saves here.

Oracles: the exported directory is read back by `transformers` itself, and the report's figures are
recomputed with torch from the original and the exported `transformers` models (bits per token and
next-token agreement on the evaluation texts; top-1 agreement and KL on the evaluation images, made
model inputs by `transformers`' own image processor).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from jaxbsd.cli import main

torch = pytest.importorskip("torch")
T = pytest.importorskip("transformers")

VOCAB = 64
LLAMA = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=VOCAB, max_position_embeddings=64)
VIT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37, image_size=16,
           patch_size=8, num_labels=3)


def _randomize(model, seed=1):
    """Redraw every parameter (random init leaves biases 0 and norms 1, which hide mix-ups)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(0.5 + torch.rand(p.shape, generator=gen) if "norm" in name
                    else 0.2 * torch.randn(p.shape, generator=gen))


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """``(directory, transformers model, the evaluation texts file, its paragraphs)``: a Llama with a word-level
    tokenizer.json over ``w0 … w63``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(**LLAMA)).eval()
    _randomize(model)
    path = tmp_path_factory.mktemp("llama")
    model.save_pretrained(path, safe_serialization=True)
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path / "tokenizer.json"))
    rng = np.random.default_rng(0)
    paragraphs = [" ".join(f"w{i}" for i in rng.integers(0, VOCAB, int(rng.integers(3, 30)))) for _ in range(40)]
    text = path.parent / "llama-text.txt"
    text.write_text("\n\n".join(paragraphs) + "\n")
    return path, model, text, paragraphs


@pytest.fixture(scope="module")
def vit_dir(tmp_path_factory):
    """``(directory, transformers model, an .npz of 40 uint8 images 20x20 RGB, the images)``."""
    torch.manual_seed(0)
    model = T.ViTForImageClassification(T.ViTConfig(**VIT)).eval()
    _randomize(model)
    path = tmp_path_factory.mktemp("vit")
    model.save_pretrained(path, safe_serialization=True)
    T.ViTImageProcessorPil(size={"height": 16, "width": 16}, image_mean=[0.4, 0.5, 0.6],
                           image_std=[0.2, 0.3, 0.25]).save_pretrained(path)
    images = np.random.default_rng(0).integers(0, 256, (40, 20, 20, 3)).astype(np.uint8)
    npz = path.parent / "vit-images.npz"
    np.savez(npz, images=images)
    return path, model, npz, images


def _run(model_dir, out, *extra):
    return main(["compress-hf", str(model_dir), "--method", "prune", "--reduction", "0.1", "--refine-steps", "0",
                 "--out", str(out), "--no-progress", *extra])


def _bits_and_agreement(original, compressed, rows):
    """Bits per token of both and the next-token agreement, summed row by row with torch (no padding)."""
    nll = {"new": 0.0, "ref": 0.0}
    same = targets = positions = 0
    with torch.no_grad():
        for ids in rows:
            x = torch.tensor([ids])
            logits = {"new": compressed(input_ids=x).logits[0].double(), "ref": original(input_ids=x).logits[0].double()}
            for k, v in logits.items():
                nll[k] -= float(torch.log_softmax(v, -1)[:-1].gather(1, x[0, 1:, None]).sum())
            same += int((logits["new"].argmax(-1) == logits["ref"].argmax(-1)).sum())
            targets, positions = targets + len(ids) - 1, positions + len(ids)
    return nll["new"] / targets / np.log(2), nll["ref"] / targets / np.log(2), same / positions


def test_a_pruned_llama_reads_back_in_transformers_with_the_reported_figures(llama_dir, tmp_path, capsys):
    path, original, text, paragraphs = llama_dir
    out = tmp_path / "out"
    assert _run(path, out, "--calibration-text", str(text), "--eval-text", str(text), "--windows", "8",
                "--seq-len", "16", "--eval-texts", "20") == 0
    report = json.loads((out / "fidelity.json").read_text())
    assert report["kind"] == "decoder" and report["model_type"] == "llama"
    exported = T.AutoModelForCausalLM.from_pretrained(out / "model").eval()
    width = exported.config.intermediate_size
    assert width < 48 and sum(p.numel() for p in exported.parameters()) == report["params_after"]
    assert (out / "model" / "tokenizer.json").is_file()
    # the evaluation: the first 20 paragraphs, each cut to --seq-len tokens
    rows = [[int(w[1:]) for w in p.split()][:16] for p in paragraphs[:20]]
    bits, ref_bits, agree = _bits_and_agreement(original, exported, rows)
    assert report["fidelity"]["bits_per_token"] == pytest.approx(bits, rel=1e-4)
    assert report["fidelity_reference"]["bits_per_token"] == pytest.approx(ref_bits, rel=1e-4)
    assert report["fidelity"]["next_token_agreement"] == pytest.approx(agree, abs=1e-9)
    assert 0 < agree < 1 and report["fidelity_reference"]["next_token_agreement"] == 1.0
    assert report["evaluation"]["texts"] == 20 and report["evaluation"]["tokens"] == sum(map(len, rows))
    assert report["calibration"]["tokens"] == 8 * 16 and report["reduction"] >= 0.1
    assert "bits_per_token" in capsys.readouterr().out


def _hf_probabilities(model, pixels):
    with torch.no_grad():
        return torch.log_softmax(model(pixel_values=pixels).logits.double(), -1).numpy()


@pytest.mark.slow  # ≈ 3 s; the default run keeps the Llama's end to end and the image refusals below
def test_a_pruned_vit_reads_back_in_transformers_with_the_reported_figures(vit_dir, tmp_path):
    from PIL import Image

    path, original, npz, images = vit_dir
    out = tmp_path / "out"
    assert _run(path, out, "--images", str(npz), "--calibration-images", "16", "--eval-images", "24") == 0
    report = json.loads((out / "fidelity.json").read_text())
    assert report["kind"] == "vision" and report["evaluation"]["images"] == 24
    exported = T.ViTForImageClassification.from_pretrained(out / "model").eval()
    assert exported.config.intermediate_size < 37
    assert sum(p.numel() for p in exported.parameters()) == report["params_after"]
    # the split --images documents: numpy's default_rng(seed).permutation, calibration first
    held_out = np.random.default_rng(0).permutation(40)[16:]
    processor = T.ViTImageProcessorPil.from_pretrained(out / "model")
    pixels = processor([Image.fromarray(images[i]) for i in held_out], return_tensors="pt")["pixel_values"]
    log_p, log_q = _hf_probabilities(original, pixels), _hf_probabilities(exported, pixels)
    kl = np.sum(np.exp(log_p) * (log_p - log_q), -1)
    top1 = np.mean(log_p.argmax(-1) == log_q.argmax(-1))
    assert report["fidelity"]["top1_agreement"] == pytest.approx(top1, abs=1e-9)
    assert report["fidelity"]["mean_kl"] == pytest.approx(kl.mean(), rel=1e-3, abs=1e-7)
    assert report["fidelity"]["max_kl"] == pytest.approx(kl.max(), rel=1e-3, abs=1e-7)
    assert report["fidelity"]["mean_kl"] > 0 and report["fidelity_reference"]["mean_kl"] == 0.0


def _one_line_error(capsys, run) -> str:
    with pytest.raises(SystemExit) as exit_:
        run()
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and err[0].startswith("jaxbsd compress-hf: error:")
    return err[0]


def test_a_causal_lm_without_tokenizer_json_is_a_one_line_error(llama_dir, tmp_path, capsys):
    import shutil

    path = tmp_path / "m"
    shutil.copytree(llama_dir[0], path)
    (path / "tokenizer.json").unlink()
    line = _one_line_error(capsys, lambda: _run(path, tmp_path / "out", "--calibration-text", str(llama_dir[2])))
    assert "no tokenizer.json" in line and str(path) in line
    assert not (tmp_path / "out").exists()


def test_image_flags_and_text_flags_are_kept_apart(llama_dir, vit_dir, tmp_path, capsys):
    line = _one_line_error(capsys, lambda: _run(vit_dir[0], tmp_path / "o", "--calibration-text", str(llama_dir[2])))
    assert "--calibration-text" in line and "--images" in line
    line = _one_line_error(capsys, lambda: _run(llama_dir[0], tmp_path / "o", "--images", str(vit_dir[2])))
    assert line.split("error: ")[1].startswith("--images")
    assert not (tmp_path / "o").exists()


def test_without_images_or_the_default_data_set_the_error_names_the_flag(vit_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("JAXBSD_DATA", str(tmp_path / "empty"))
    line = _one_line_error(capsys, lambda: _run(vit_dir[0], tmp_path / "o"))
    assert "--images" in line and "'cifar10'" in line and "JAXBSD_DATA" in line
    few = tmp_path / "few.npz"
    np.savez(few, images=vit_dir[3][:4])
    line = _one_line_error(capsys, lambda: _run(vit_dir[0], tmp_path / "o", "--images", str(few)))
    assert "4 images" in line and "--calibration-images 64" in line
    assert not (tmp_path / "o").exists()


def test_a_causal_lms_paragraphs_keep_their_whitespace_an_encoders_collapse(tmp_path):
    from jaxbsd.cli.hf_tasks import read_paragraphs

    text = tmp_path / "code.txt"
    text.write_text("\n\ndef f():\n    return 1\n\n\n\nclass A:\n\tpass\n\n \n", encoding="utf-8")
    assert read_paragraphs("--eval-text", text) == ["def f(): return 1", "class A: pass"]
    assert read_paragraphs("--eval-text", text, keep_whitespace=True) == ["def f():\n    return 1", "class A:\n\tpass"]
    (tmp_path / "blank.txt").write_text("\n \n\n\t\n", encoding="utf-8")
    with pytest.raises(ValueError, match="--eval-text .*blank.txt: no text"):
        read_paragraphs("--eval-text", tmp_path / "blank.txt", keep_whitespace=True)
